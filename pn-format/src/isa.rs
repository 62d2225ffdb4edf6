//! Run-time choice of the SIMD instruction set for dot products and the Hadamard transform.

/// An instruction-set level for the fast paths. Ordered from least to most capable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable scalar code (the reference for every fast path).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C: the baseline of a P100-era host (Haswell and later).
    Avx2,
    /// x86-64 AVX-512 F + BW (plus AVX2/FMA/F16C).
    Avx512,
    /// AVX-512 with VNNI (`vpdpwssd` for the int16-activation dot product).
    Avx512Vnni,
}

impl Isa {
    /// Every level, from least to most capable.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Vnni];

    /// Whether this CPU can run code for this level.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx512.is_available() && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The most capable level this CPU supports (cached after the first call).
    pub fn detect() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            Isa::ALL
                .into_iter()
                .rev()
                .find(|i| i.is_available())
                .unwrap_or(Isa::Scalar)
        })
    }

    /// Every level this CPU supports, least capable first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// `self` if the CPU supports it, else [`Isa::Scalar`]: never runs unsupported instructions.
    pub(crate) fn or_scalar(self) -> Isa {
        if self.is_available() {
            self
        } else {
            Isa::Scalar
        }
    }
}
