//! Steady-state decode allocates nothing: a counting global allocator watches a few decode
//! steps after warm-up (trunk and MTP block, two threads), on an F16 model and on a PN3 one
//! (whose products pick each row's path, `CpuBackend`'s PN row sets, on every call).

use pn_tests::{data, tiny, DEMO};
use qwen_model::{CpuBackend, Model, Outputs};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    // One test, not two: the allocation counter is global to the process.
    decode_steps_of(tiny("model-f16.gguf"));
    decode_steps_of(data(DEMO, "model-pn3.gguf"));
}

fn decode_steps_of(path: std::path::PathBuf) {
    let m = Model::load(&path, CpuBackend::new(2)).unwrap();
    let (v, d) = (m.config.vocab, m.config.hidden);
    let mut state = m.new_state(64).unwrap();
    let mut ws = m.new_workspace(16).unwrap();
    let mut logits = vec![0.0f32; v];
    let mut hidden = vec![0.0f32; d];
    let mut mtp_logits = vec![0.0f32; v];
    m.forward(
        &mut state,
        &mut ws,
        &[1, 2, 3, 4, 5],
        Outputs::last_logits(&mut logits),
    )
    .unwrap();
    let step = |state: &mut qwen_model::State<CpuBackend>,
                ws: &mut qwen_model::Workspace<CpuBackend>,
                logits: &mut [f32],
                hidden: &mut [f32],
                mtp_logits: &mut [f32],
                tok: u32| {
        let out = Outputs {
            logits: Some(logits),
            hidden: Some(&mut *hidden),
            all_rows: false,
            layer_residuals: None,
        };
        m.forward(state, ws, &[tok], out).unwrap();
        let pos = state.pos();
        m.mtp_forward(
            state,
            ws,
            &[tok],
            hidden,
            pos,
            Outputs::last_logits(mtp_logits),
        )
        .unwrap();
    };
    // Warm-up: first use of per-thread scratch and prepared activations may allocate.
    for t in 0..3 {
        step(
            &mut state,
            &mut ws,
            &mut logits,
            &mut hidden,
            &mut mtp_logits,
            10 + t,
        );
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for t in 0..10 {
        step(
            &mut state,
            &mut ws,
            &mut logits,
            &mut hidden,
            &mut mtp_logits,
            100 + t,
        );
    }
    let n = ALLOCS.load(Ordering::SeqCst) - before;
    assert_eq!(n, 0, "{path:?}: {n} allocations in 10 decode steps");
    assert!(logits.iter().all(|x| x.is_finite()) && mtp_logits.iter().all(|x| x.is_finite()));
}
