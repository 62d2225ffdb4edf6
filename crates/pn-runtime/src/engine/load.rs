//! Opening, checking and binding a model file.

use super::error::{EngineError, Result};
use super::options::{Device, EngineOptions, DEFAULT_CONTEXT};
use super::{Engine, FALLBACK_CHAT_TEMPLATE};
use crate::chat_template::{ChatTemplate, ChatTemplateError};
use crate::sampling::{StopTokens, TokenMask};
use crate::tokenizer::Tokenizer;
use gguf_io::{GgmlType, GgufError, GgufFile};
use qwen_model::{CpuBackend, Model, ModelConfig};
use std::path::Path;
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
    let file = GgufFile::open(path).map_err(|e| match e {
        GgufError::BadMagic { found } => EngineError::NotGguf {
            path: path.to_path_buf(),
            found,
        },
        e => EngineError::Gguf(e),
    })?;
    let arch = file
        .get_str("general.architecture")
        .map_err(EngineError::Gguf)?;
    if arch != "qwen35" {
        return Err(EngineError::WrongArchitecture {
            path: path.to_path_buf(),
            found: arch.to_string(),
        });
    }
    if options.validate_pn {
        validate_pn_tensors(&file, progress)?;
    }
    let config = ModelConfig::from_gguf(&file)?;
    let context = resolve_context(&config, options.context)?;
    check_memory(&config, &options, context)?;

    progress(LoadProgress {
        stage: "binding",
        done: 0,
        total: 1,
    });
    let file = Arc::new(file);
    let model = Model::from_file(file, CpuBackend::new(options.threads))?;
    progress(LoadProgress {
        stage: "binding",
        done: 1,
        total: 1,
    });

    let tokenizer = Tokenizer::from_gguf(model.file())?;
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
    // The sampler never picks padding ids nor embedding rows past the tokenizer's vocabulary.
    let mask = TokenMask::from_tokenizer(&tokenizer);
    let stop_tokens = StopTokens::from_tokenizer(&tokenizer);
    Ok(Engine {
        model,
        tokenizer,
        template,
        template_is_fallback,
        mask,
        stop_tokens,
        options,
        context,
        path: path.to_path_buf(),
    })
}

fn check_device(options: &EngineOptions) -> Result<()> {
    match options.device {
        Device::Cpu => Ok(()),
        Device::Cuda(ordinal) if !pn_kernels::kernels_available() => {
            Err(EngineError::CudaNoKernels {
                ordinal,
                reason: pn_kernels::build_info().trim().to_string(),
            })
        }
        Device::Cuda(ordinal) => Err(EngineError::CudaUnavailable { ordinal }),
    }
}

/// Checks every block of every PN tensor (finite scales, no reserved bits).
fn validate_pn_tensors(file: &GgufFile, progress: &mut dyn FnMut(LoadProgress)) -> Result<()> {
    let pn_type = |ty: GgmlType| match ty {
        GgmlType::Pn3t => Some(pn_format::PnType::Pn3t),
        GgmlType::Pn4t => Some(pn_format::PnType::Pn4t),
        _ => None,
    };
    let total: u64 = file
        .tensor_infos()
        .iter()
        .filter(|t| pn_type(t.ty).is_some())
        .map(|t| t.n_bytes)
        .sum();
    if total == 0 {
        return Ok(());
    }
    let mut done = 0;
    for t in file.tensors() {
        let Some(ty) = pn_type(t.ty) else { continue };
        let n_rows = t.n_rows().max(1);
        let row_bytes = t.bytes.len() as u64 / n_rows;
        for (row, bytes) in t.bytes.chunks(row_bytes.max(1) as usize).enumerate() {
            pn_format::validate_row(ty, bytes).map_err(|source| EngineError::InvalidPnTensor {
                tensor: t.name.to_string(),
                row: row as u64,
                source,
            })?;
        }
        done += t.bytes.len() as u64;
        progress(LoadProgress {
            stage: "validating",
            done,
            total,
        });
    }
    Ok(())
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

/// `MemAvailable` from /proc/meminfo (Linux); `None` elsewhere.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
