//! Opening, checking and binding a model file.

use super::error::{EngineError, Result};
use super::load_report::PhaseClock;
use super::options::{Device, EngineOptions, DEFAULT_CONTEXT};
use super::{Engine, EngineInner, LoadedModel, FALLBACK_CHAT_TEMPLATE};
use crate::chat_template::{ChatTemplate, ChatTemplateError};
use crate::sampling::{StopTokens, TokenMask};
use crate::tokenizer::Tokenizer;
use gguf_io::{GgmlType, GgufError, GgufFile};
use qwen_model::cuda::{CudaBackend, CudaError, MemoryPlan};
use qwen_model::{
    Backend, CpuBackend, KvCacheType, Model, ModelConfig, ModelError, Requirements, Unsupported,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where loading is, for a progress bar: `done` of `total` units of the current `stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadProgress {
    /// What is being done (`"validating"`, `"binding"`).
    pub stage: &'static str,
    /// Units done (bytes while validating).
    pub done: u64,
    /// Units in total.
    pub total: u64,
}

pub(super) fn load(
    path: &Path,
    options: EngineOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<Engine> {
    check_device(&options)?;
    if !path.exists() {
        return Err(EngineError::NotFound {
            path: path.to_path_buf(),
        });
    }
    let mut clock = PhaseClock::start();
    let opened = if options.no_mmap {
        GgufFile::read(path)
    } else {
        GgufFile::open(path)
    };
    let file = opened.map_err(|e| match e {
        GgufError::BadMagic { found } => EngineError::NotGguf {
            path: path.to_path_buf(),
            found,
        },
        e => EngineError::Gguf(e),
    })?;
    clock.lap("open");
    load_timed(file, path.to_path_buf(), options, progress, clock)
}

/// Loads from a GGUF already open (a file or bytes embedded in the executable); `path` names it
/// in errors and in [`Engine::path`].
pub(super) fn load_file(
    file: GgufFile,
    path: PathBuf,
    options: EngineOptions,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<Engine> {
    load_timed(file, path, options, progress, PhaseClock::start())
}

/// [`load_file`] with the phases timed on `clock` (started before the file was opened).
fn load_timed(
    file: GgufFile,
    path: PathBuf,
    options: EngineOptions,
    progress: &mut dyn FnMut(LoadProgress),
    mut clock: PhaseClock,
) -> Result<Engine> {
    check_device(&options)?;
    let arch = file
        .get_str("general.architecture")
        .map_err(EngineError::Gguf)?;
    if arch != "qwen35" {
        return Err(EngineError::WrongArchitecture {
            path,
            found: arch.to_string(),
        });
    }
    if options.validate_pn {
        validate_pn_tensors(&file, validate_threads(options.threads), progress)?;
        clock.lap("validate");
    }
    let config = ModelConfig::from_gguf(&file)?;
    let context = resolve_context(&config, options.context)?;
    let file = Arc::new(file);
    let model = match options.device {
        Device::Cpu => {
            check_memory(&config, &options, context)?;
            let backend = CpuBackend::new(options.threads);
            check_supported(&backend, Device::Cpu, &config, &options)?;
            LoadedModel::Cpu(Arc::new(bind(file, backend, progress)?))
        }
        Device::Cuda(ordinal) => {
            let backend = open_cuda(ordinal, &file, &config, &options, context)?;
            LoadedModel::Cuda(Arc::new(bind(file, backend, progress)?))
        }
    };
    clock.lap("bind");

    let tokenizer = Tokenizer::from_gguf(super::with_model!(&model, m => m.file()))?;
    clock.lap("tokenizer");
    let (template, template_is_fallback) = match &options.chat_template {
        Some(src) => (
            ChatTemplate::new(src)?.with_special_tokens_of(&tokenizer),
            false,
        ),
        None => match ChatTemplate::from_tokenizer(&tokenizer) {
            Ok(t) => (t, false),
            Err(ChatTemplateError::Missing) => (
                ChatTemplate::new(FALLBACK_CHAT_TEMPLATE)?.with_special_tokens_of(&tokenizer),
                true,
            ),
            Err(e) => return Err(e.into()),
        },
    };
    let template = template.with_isolation(options.template_isolation.clone());
    // The sampler never picks padding ids nor embedding rows past the tokenizer's vocabulary.
    let mask = TokenMask::from_tokenizer(&tokenizer);
    let stop_tokens = StopTokens::from_tokenizer(&tokenizer);
    clock.lap("template");
    let inner = EngineInner {
        model,
        tokenizer,
        template,
        template_is_fallback,
        mask,
        stop_tokens,
        options,
        context,
        path,
        load_report: clock.finish(),
    };
    Ok(Engine {
        inner: Arc::new(inner),
    })
}

/// Refuses a CUDA device that cannot be opened here before the file is read (validation of a
/// large file takes a while; the user should learn about a missing driver first).
fn check_device(options: &EngineOptions) -> Result<()> {
    match options.device {
        Device::Cpu => Ok(()),
        Device::Cuda(ordinal) => {
            CudaBackend::availability(ordinal).map_err(|e| cuda_error(ordinal, e))
        }
    }
}

/// The engine error for a CUDA backend error on device `ordinal`: the reasons a user can act
/// on (no kernels, no driver, no such device) get their own variants.
fn cuda_error(ordinal: usize, e: CudaError) -> EngineError {
    match e {
        CudaError::NoKernels { info } => EngineError::CudaNoKernels {
            ordinal,
            reason: info.trim().to_string(),
        },
        CudaError::NoDriver => EngineError::CudaNoDriver { ordinal },
        CudaError::NoDevice { count, .. } => EngineError::CudaNoDevice { ordinal, count },
        source => EngineError::Cuda { ordinal, source },
    }
}

/// Makes the weights resident on `backend` and binds the graph to them.
fn bind<B: Backend>(
    file: Arc<GgufFile>,
    backend: B,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<Model<B>> {
    progress(LoadProgress {
        stage: "binding",
        done: 0,
        total: 1,
    });
    let model = Model::from_file(file, backend)?;
    progress(LoadProgress {
        stage: "binding",
        done: 1,
        total: 1,
    });
    Ok(model)
}

/// Opens CUDA device `ordinal` and checks, before any weight is uploaded, that it can hold the
/// KV cache types asked for and that the whole footprint fits in its free memory.
fn open_cuda(
    ordinal: usize,
    file: &GgufFile,
    config: &ModelConfig,
    options: &EngineOptions,
    context: usize,
) -> Result<CudaBackend> {
    let backend = CudaBackend::new(ordinal).map_err(|e| cuda_error(ordinal, e))?;
    check_supported(&backend, Device::Cuda(ordinal), config, options)?;
    let plan = cuda_memory_plan(file, config, options, context);
    let (free, total) = backend.memory_info().map_err(|e| cuda_error(ordinal, e))?;
    if plan.total() > free {
        return Err(EngineError::CudaOutOfMemory {
            ordinal,
            plan,
            free_mib: free >> 20,
            total_mib: total >> 20,
        });
    }
    Ok(backend)
}

/// Refuses a model or K/V cache types that `backend` declares it cannot run
/// ([`Backend::supports`]), before any weight is resident; what it supports is never restated
/// here, so it cannot drift from the backend.
fn check_supported<B: Backend>(
    backend: &B,
    device: Device,
    config: &ModelConfig,
    options: &EngineOptions,
) -> Result<()> {
    let req = Requirements::model(config).with_kv(options.kv_type_k, options.kv_type_v);
    backend.supports(&req).map_err(|e| match e {
        Unsupported::MixedKvTypes { k, v, .. } => EngineError::MixedKvTypes {
            k: k.to_string(),
            v: v.to_string(),
            device: device.to_string(),
        },
        Unsupported::KvType { ty, supported, .. } => EngineError::UnsupportedKvType {
            kv: ty.to_string(),
            device: device.to_string(),
            supported: supported
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(", "),
        },
        e => EngineError::Model(ModelError::Unsupported(e)),
    })
}

/// The device footprint of the model with one session at `context` positions: weights, the KV
/// cache of the requested K/V types, the recurrent state (the live one, one copy per
/// prompt-cache checkpoint and the speculative decoder's rollback trace of draft + 1 rows, all
/// device-resident),
/// the workspace for `batch` tokens and the backend's scratch.
fn cuda_memory_plan(
    file: &GgufFile,
    config: &ModelConfig,
    options: &EngineOptions,
    context: usize,
) -> MemoryPlan {
    let mut plan = MemoryPlan::new(
        file,
        config,
        context,
        options.batch.max(1),
        KvCacheType::F32,
    );
    // The plan only knows the float types; the state's own per-token size covers every type.
    plan.kv_cache = kv_bytes(config, options, context);
    // The speculative decoder keeps the state after each of the draft + 1 rows of a verify
    // pass (its rollback trace).
    let spec_copies = match options.speculation {
        crate::speculative::Speculation::Mtp { draft } if config.n_mtp > 0 && draft > 0 => {
            draft as u64 + 1
        }
        _ => 0,
    };
    let copies = 1 + options.prompt_cache_checkpoints as u64 + spec_copies;
    plan.recurrent_state = plan.recurrent_state.saturating_mul(copies);
    plan
}

/// Rows of PN tensors one validation task checks (about 16 MiB of a 27B model's matrices): small
/// enough that the threads finish together, large enough that claiming one costs nothing.
const VALIDATE_TASK_BYTES: u64 = 16 << 20;

/// Checks every block of every PN tensor (finite scales, no reserved bits) on `threads` threads
/// (the fast whole-row test of `pn_format::validate_row`: the check costs about one read of the
/// file). Each task is a run of whole rows of one tensor, in file order; a failure is reported
/// for the first bad row in file order (the lowest failing task), as a sequential pass would.
fn validate_pn_tensors(
    file: &GgufFile,
    threads: usize,
    progress: &mut dyn FnMut(LoadProgress),
) -> Result<()> {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Mutex;
    let pn_type = |ty: GgmlType| match ty {
        GgmlType::Pn3t => Some(pn_format::PnType::Pn3t),
        GgmlType::Pn4t => Some(pn_format::PnType::Pn4t),
        _ => None,
    };
    // (tensor name, type, its bytes, row bytes, first row of the task, rows of the task).
    let mut tasks = Vec::new();
    let mut total = 0u64;
    for t in file.tensors() {
        let Some(ty) = pn_type(t.ty) else { continue };
        let n_rows = t.n_rows().max(1);
        let row_bytes = (t.bytes.len() as u64 / n_rows).max(1) as usize;
        let rows = t.bytes.len().div_ceil(row_bytes);
        let per = ((VALIDATE_TASK_BYTES as usize) / row_bytes).max(1);
        for r0 in (0..rows).step_by(per) {
            tasks.push((t.name, ty, t.bytes, row_bytes, r0, per.min(rows - r0)));
        }
        total += t.bytes.len() as u64;
    }
    if total == 0 {
        return Ok(());
    }
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let populate = matches!(std::env::var("PN_LOAD_POPULATE").as_deref(), Ok("1"));
    // The lowest failing task and its error; tasks after it need not run.
    let failed = AtomicUsize::new(usize::MAX);
    let first_err: Mutex<Option<(usize, EngineError)>> = Mutex::new(None);
    let work = |mut report: Option<&mut dyn FnMut(LoadProgress)>| loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= tasks.len() || i > failed.load(Ordering::Relaxed) {
            return;
        }
        let (name, ty, bytes, row_bytes, r0, n) = tasks[i];
        let part = &bytes[r0 * row_bytes..((r0 + n) * row_bytes).min(bytes.len())];
        if populate {
            populate_read(part);
        }
        for (k, row) in part.chunks(row_bytes).enumerate() {
            if let Err(source) = pn_format::validate_row(ty, row) {
                let mut slot = first_err.lock().unwrap_or_else(|e| e.into_inner());
                if slot.as_ref().is_none_or(|(j, _)| i < *j) {
                    let e = EngineError::InvalidPnTensor {
                        tensor: name.to_string(),
                        row: (r0 + k) as u64,
                        source,
                    };
                    *slot = Some((i, e));
                    failed.fetch_min(i, Ordering::Relaxed);
                }
                break;
            }
        }
        let d = done.fetch_add(part.len() as u64, Ordering::Relaxed) + part.len() as u64;
        if let Some(p) = report.as_mut() {
            p(LoadProgress {
                stage: "validating",
                done: d,
                total,
            });
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads.max(1) {
            s.spawn(|| work(None));
        }
        // The caller's thread works too, and reports progress (the callback is not `Sync`).
        work(Some(progress));
    });
    match first_err.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// Maps the pages of `bytes` (a file map's) in one system call (`MADV_POPULATE_READ`, Linux
/// 5.14+) instead of one page fault per 64 KiB as the check reads them; a no-op where the
/// system refuses.
fn populate_read(bytes: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        const MADV_POPULATE_READ: i32 = 22;
        let page = 4096usize;
        let start = bytes.as_ptr() as usize & !(page - 1);
        let end = bytes.as_ptr() as usize + bytes.len();
        // SAFETY: the range lies in (page-rounded) mapped memory of `bytes`; the advice only
        // maps pages, it never changes their contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, MADV_POPULATE_READ) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = bytes;
}

/// Threads for the load-time validation: those the model will run on (`0`: every logical CPU).
fn validate_threads(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

fn resolve_context(config: &ModelConfig, requested: usize) -> Result<usize> {
    let max = config.context_length;
    if requested == 0 {
        return Ok(DEFAULT_CONTEXT.min(max).max(1));
    }
    if requested > max {
        return Err(EngineError::ContextTooLarge { requested, max });
    }
    Ok(requested)
}

/// Bytes of one session's attention KV cache (trunk attention layers plus the MTP block).
pub(super) fn kv_bytes(config: &ModelConfig, options: &EngineOptions, context: usize) -> u64 {
    qwen_model::kv_bytes_per_token(config, options.kv_type_k, options.kv_type_v)
        .saturating_mul(context as u64)
}

/// Refuses a context whose KV cache cannot fit in the memory the system reports available, so
/// the user gets the numbers instead of an abort from the allocator.
fn check_memory(config: &ModelConfig, options: &EngineOptions, context: usize) -> Result<()> {
    let needed = kv_bytes(config, options, context);
    if let Some(available) = available_memory() {
        if needed > available {
            return Err(EngineError::ContextOutOfMemory {
                requested: context,
                needed_mib: needed.div_ceil(1 << 20),
                available_mib: available >> 20,
            });
        }
    }
    Ok(())
}

impl Engine {
    /// Refuses `slots` sessions at once (`pn serve --parallel`: each slot holds a KV cache of
    /// the full context and a recurrent state) when together they cannot fit in the memory the
    /// system reports available, before any is allocated, with the numbers. The load-time check
    /// covers one session; CUDA engines are sized by the device memory plan instead.
    pub fn check_slots_memory(&self, slots: usize) -> Result<()> {
        if self.options().device != Device::Cpu {
            return Ok(());
        }
        let per_slot = kv_bytes(self.config(), self.options(), self.context())
            .saturating_add(super::checkpoint_bytes(self.config()));
        let needed = per_slot.saturating_mul(slots as u64);
        match available_memory() {
            Some(available) if needed > available => Err(EngineError::SlotsOutOfMemory {
                slots,
                context: self.context(),
                per_slot_mib: per_slot.div_ceil(1 << 20),
                needed_mib: needed.div_ceil(1 << 20),
                available_mib: available >> 20,
            }),
            _ => Ok(()),
        }
    }
}

/// `MemAvailable` from /proc/meminfo (Linux); `None` elsewhere.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::Speculation;

    #[test]
    fn cuda_errors_name_the_device_and_the_reason() {
        let e = cuda_error(2, CudaError::NoDriver);
        assert!(
            matches!(e, EngineError::CudaNoDriver { ordinal: 2 }),
            "{e:?}"
        );
        assert!(e.to_string().contains("cuda:2") && e.to_string().contains("libcuda"));
        let e = cuda_error(
            5,
            CudaError::NoDevice {
                ordinal: 5,
                count: 1,
            },
        );
        assert!(
            matches!(
                e,
                EngineError::CudaNoDevice {
                    ordinal: 5,
                    count: 1
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("cuda:5"), "{e}");
        let e = cuda_error(0, CudaError::NoKernels { info: "no nvcc\n" });
        assert!(
            matches!(&e, EngineError::CudaNoKernels { ordinal: 0, reason } if reason == "no nvcc"),
            "{e:?}"
        );
        let e = cuda_error(1, CudaError::OutOfMemory("x".into()));
        assert!(matches!(e, EngineError::Cuda { ordinal: 1, .. }), "{e:?}");
    }

    /// The plan counts the KV cache of the requested types and a recurrent state per copy the
    /// session keeps on the device; the error names every term.
    #[test]
    fn cuda_plan_counts_kv_types_and_state_copies() {
        let file = GgufFile::open(super::super::DEMO_MODEL_PATH).unwrap();
        let cfg = ModelConfig::from_gguf(&file).unwrap();
        // An f32 cache as the base the q8_0 size is compared with (the default is f16).
        let base = EngineOptions {
            kv_type_k: KvCacheType::F32,
            kv_type_v: KvCacheType::F32,
            speculation: Speculation::None,
            prompt_cache_checkpoints: 0,
            ..EngineOptions::default()
        };
        let one = cuda_memory_plan(&file, &cfg, &base, 1024);
        assert_eq!(one.kv_cache, kv_bytes(&cfg, &base, 1024));
        assert_eq!(one.recurrent_state, super::super::checkpoint_bytes(&cfg));
        let q8 = EngineOptions {
            kv_type_k: KvCacheType::Q8_0,
            kv_type_v: KvCacheType::Q8_0,
            prompt_cache_checkpoints: 4,
            speculation: Speculation::Mtp { draft: 2 },
            ..base.clone()
        };
        let p = cuda_memory_plan(&file, &cfg, &q8, 1024);
        // 34 bytes per 32 values against 4 bytes per value.
        assert_eq!(p.kv_cache * 128, one.kv_cache * 34);
        // Live + 4 checkpoints + a trace of 3 verify rows.
        assert_eq!(p.recurrent_state, 8 * one.recurrent_state);
        assert_eq!(p.weights, one.weights);
        let e = EngineError::CudaOutOfMemory {
            ordinal: 0,
            plan: p,
            free_mib: 1,
            total_mib: 2,
        };
        let msg = e.to_string();
        for term in [
            "cuda:0",
            "weights",
            "KV cache at 1024 positions",
            "recurrent state",
            "workspace",
            "scratch",
            "1 MiB of 2 MiB",
        ] {
            assert!(msg.contains(term), "{term}: {msg}");
        }
    }
}
