//! `Workspace::keep_next_logits`: a pass leaves its logits on the backend, and
//! `Model::kept_logits` / `Model::kept_top_k` read back exactly what the pass would have
//! downloaded (lone and batched passes, every-row and last-row outputs).

use pn_tests::{data, f32_bits as bits, DEMO};
use qwen_model::topk::top_k_row;
use qwen_model::{BatchSeq, CpuBackend, Model, Outputs};

fn model() -> Model<CpuBackend> {
    Model::load(data(DEMO, "model-pn3.gguf"), CpuBackend::new(2)).expect("demo model")
}

#[test]
fn kept_logits_are_the_downloaded_ones_lone_and_batched() {
    let m = model();
    let v = m.config.vocab;
    let prompts: [&[u32]; 3] = [&[5, 17, 99, 3], &[42], &[7, 8, 9]];
    // Reference: each prompt downloaded, every row.
    let mut want = Vec::new();
    for p in prompts {
        let (mut st, mut ws) = (m.new_state(16).unwrap(), m.new_workspace(16).unwrap());
        let mut l = vec![0f32; p.len() * v];
        m.forward(&mut st, &mut ws, p, Outputs::all_logits(&mut l))
            .unwrap();
        want.push(l);
    }
    // Sequence 2 of the batch below asks for its last row's logits only, so its other rows may
    // take the state-only rows' products (`Backend::set_state_rows`); its reference does too.
    let want2_last = {
        let (mut st, mut ws) = (m.new_state(16).unwrap(), m.new_workspace(16).unwrap());
        let mut l = vec![0f32; v];
        m.forward(&mut st, &mut ws, prompts[2], Outputs::last_logits(&mut l))
            .unwrap();
        l
    };
    // Lone, every row kept: the host buffer is not written; the kept rows are the same bits.
    let (mut st, mut ws) = (m.new_state(16).unwrap(), m.new_workspace(16).unwrap());
    let mut host = vec![0f32; 4 * v];
    ws.keep_next_logits();
    m.forward(&mut st, &mut ws, prompts[0], Outputs::all_logits(&mut host))
        .unwrap();
    assert!(
        host.iter().all(|&x| x == 0.0),
        "kept logits were downloaded"
    );
    let mut row = vec![0f32; v];
    let mut cand = Vec::new();
    for r in 0..4 {
        m.kept_logits(&ws, (0, r), &mut row).unwrap();
        assert_eq!(bits(&row), bits(&want[0][r * v..(r + 1) * v]), "row {r}");
        m.kept_top_k(&ws, (0, r), v, 5, &mut cand).unwrap();
        assert_eq!(cand, top_k_row(&row, 5));
        m.kept_top_k(&ws, (0, r), v / 2, 3, &mut cand).unwrap();
        assert_eq!(cand, top_k_row(&row[..v / 2], 3), "ids below n_ids only");
    }
    assert!(m.kept_logits(&ws, (0, 4), &mut row).is_err());
    assert!(m.kept_logits(&ws, (1, 0), &mut row).is_err());
    // A pass with logits that does not keep them ends the kept rows.
    m.forward(&mut st, &mut ws, &[1], Outputs::last_logits(&mut row))
        .unwrap();
    assert!(m.kept_top_k(&ws, (0, 0), v, 1, &mut cand).is_err());

    // Batched: sequence 1 wants no logits, 0 every row, 2 its last row.
    let mut states: Vec<_> = (0..3).map(|_| m.new_state(16).unwrap()).collect();
    let mut ws = m.new_workspace(16).unwrap();
    let (mut l0, mut l2) = (vec![0f32; 4 * v], vec![0f32; v]);
    {
        let [s0, s1, s2] = &mut states[..] else {
            unreachable!()
        };
        let mut seqs = [
            BatchSeq {
                state: s0,
                tokens: prompts[0],
                out: Outputs::all_logits(&mut l0),
                trace: None,
            },
            BatchSeq {
                state: s1,
                tokens: prompts[1],
                out: Outputs::default(),
                trace: None,
            },
            BatchSeq {
                state: s2,
                tokens: prompts[2],
                out: Outputs::last_logits(&mut l2),
                trace: None,
            },
        ];
        ws.keep_next_logits();
        m.forward_batch(&mut ws, &mut seqs).unwrap();
    }
    let rel = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0.0, f32::max)
    };
    for r in 0..4 {
        m.kept_logits(&ws, (0, r), &mut row).unwrap();
        assert!(
            rel(&row, &want[0][r * v..(r + 1) * v]) < 1e-3,
            "seq 0 row {r}"
        );
    }
    assert!(
        m.kept_logits(&ws, (1, 0), &mut row).is_err(),
        "seq 1 wanted none"
    );
    m.kept_logits(&ws, (2, 0), &mut row).unwrap();
    assert!(rel(&row, &want2_last) < 1e-3);
    m.kept_top_k(&ws, (2, 0), v, 4, &mut cand).unwrap();
    assert_eq!(cand, top_k_row(&row, 4));
}
