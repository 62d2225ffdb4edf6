//! Run-time choice of the SIMD instruction set for dot products and the Hadamard transform.

/// Environment variable that caps the level [`Isa::detect`] picks (`scalar`, `avx2`, `avx512`
/// or `avx512vnni`; unset or unknown: no cap), to measure and test the lower paths on a capable
/// CPU, e.g. `PN_ISA=avx2 pn bench ...` for an AVX2-only host. It can only lower the level.
pub const ISA_ENV: &str = "PN_ISA";

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

    /// The most capable level this CPU supports, capped by the environment variable
    /// [`ISA_ENV`] when it names a level (cached after the first call).
    pub fn detect() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = std::env::var(ISA_ENV)
                .ok()
                .and_then(|v| Isa::from_name(&v))
                .unwrap_or(Isa::Avx512Vnni);
            Isa::best_up_to(cap)
        })
    }

    /// The most capable level this CPU supports that is at most `cap`.
    pub fn best_up_to(cap: Isa) -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|&i| i <= cap && i.is_available())
            .unwrap_or(Isa::Scalar)
    }

    /// The level named `name` (`scalar`, `avx2`, `avx512`, `avx512vnni`; case-insensitive).
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(name.trim()))
    }

    /// The level's name as [`Isa::from_name`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
        }
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

#[cfg(test)]
mod tests {
    use super::Isa;

    #[test]
    fn names_round_trip_and_cap_lowers() {
        for i in Isa::ALL {
            assert_eq!(Isa::from_name(i.name()), Some(i));
            assert_eq!(Isa::from_name(&i.name().to_uppercase()), Some(i));
            let b = Isa::best_up_to(i);
            assert!(b <= i && b.is_available());
        }
        assert_eq!(Isa::from_name("sse9"), None);
        assert_eq!(Isa::best_up_to(Isa::Scalar), Isa::Scalar);
    }
}
