//! The kernels that build.rs compiled and embedded: PTX for compute_60, cubin for sm_60.

/// One compiled `kernels/<name>.cu`.
#[derive(Debug)]
pub struct EmbeddedModule {
    /// File stem, e.g. `pn_gemv`.
    pub name: &'static str,
    /// PTX for compute_60 (newer GPUs JIT it).
    pub ptx: &'static str,
    /// SASS for sm_60 (what a P100 loads, no JIT).
    pub cubin: &'static [u8],
    /// Entry points (`extern "C"` names).
    pub kernels: &'static [&'static str],
}

mod registry {
    use super::EmbeddedModule;
    include!(concat!(env!("OUT_DIR"), "/kernels_registry.rs"));
}

/// Every embedded module (empty when the build found no CUDA compiler).
pub fn modules() -> &'static [EmbeddedModule] {
    registry::MODULES
}

/// The module compiled from `kernels/<name>.cu`, if embedded.
pub fn module(name: &str) -> Option<&'static EmbeddedModule> {
    registry::MODULES.iter().find(|m| m.name == name)
}

/// Why the build has no kernels (empty when it has them).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn no_kernels_reason() -> &'static str {
    registry::NO_KERNELS_REASON
}

/// Whether this build embeds kernels.
pub fn kernels_available() -> bool {
    !registry::MODULES.is_empty()
}

/// `ptxas -v` table (registers, spills, stack, shared memory per kernel) from the build.
pub fn ptxas_report() -> &'static str {
    include_str!(concat!(env!("OUT_DIR"), "/ptxas-report.txt"))
}

/// One line for `pn --version`: kernel count, targets and compiler, or why there are none.
pub fn build_info() -> &'static str {
    static INFO: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    INFO.get_or_init(|| {
        if registry::MODULES.is_empty() {
            format!("CUDA kernels: none ({})", registry::NO_KERNELS_REASON)
        } else {
            let n: usize = registry::MODULES.iter().map(|m| m.kernels.len()).sum();
            format!(
                "CUDA kernels: {n} in {} modules, sm_60 cubin + compute_60 PTX ({})",
                registry::MODULES.len(),
                registry::COMPILER
            )
        }
    })
}
