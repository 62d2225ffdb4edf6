//! The ggml tensor type table: every stock type id of today's ggml plus the project's PN types.
//!
//! Ids, names, block sizes and bytes per block follow `docs/gguf-and-ggml-types.md` section 2.
//! Removed ids (4, 5, 31-33, 36-38) and everything from 43 to 123 are not types: `from_id`
//! returns `None` for them so that a file using them is rejected instead of guessed at.

macro_rules! ggml_types {
    ($($(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $upper:literal, $blck:literal, $bytes:literal;)*) => {
        /// A ggml tensor element type, as stored in a GGUF tensor-info record.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $($(#[$doc])* $variant,)*
        }

        impl GgmlType {
            /// Every type in the table, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The type with ggml id `id`, or `None` for removed and unknown ids.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// The ggml type id written in GGUF files.
            pub fn id(self) -> u32 {
                match self { $(GgmlType::$variant => $id,)* }
            }

            /// ggml's own type name (`"f32"`, `"q4_K"`, `"pn3t"`, ...).
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name,)* }
            }

            /// gguf-py's `GGMLQuantizationType` name (`"F32"`, `"Q4_K"`, `"PN3T"`, ...), the form
            /// that gguf-dump style listings print.
            pub fn gguf_py_name(self) -> &'static str {
                match self { $(GgmlType::$variant => $upper,)* }
            }

            /// Elements per block (1 for the plain scalar types).
            pub fn block_size(self) -> usize {
                match self { $(GgmlType::$variant => $blck,)* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self { $(GgmlType::$variant => $bytes,)* }
            }
        }
    };
}

ggml_types! {
    /// IEEE binary32.
    F32 = 0, "f32", "F32", 1, 4;
    /// IEEE binary16.
    F16 = 1, "f16", "F16", 1, 2;
    /// 4-bit, one f16 scale per 32.
    Q4_0 = 2, "q4_0", "Q4_0", 32, 18;
    /// 4-bit, f16 scale and min per 32.
    Q4_1 = 3, "q4_1", "Q4_1", 32, 20;
    /// 5-bit, one f16 scale per 32.
    Q5_0 = 6, "q5_0", "Q5_0", 32, 22;
    /// 5-bit, f16 scale and min per 32.
    Q5_1 = 7, "q5_1", "Q5_1", 32, 24;
    /// 8-bit, one f16 scale per 32.
    Q8_0 = 8, "q8_0", "Q8_0", 32, 34;
    /// 8-bit activation type with f16 scale and sum per 32.
    Q8_1 = 9, "q8_1", "Q8_1", 32, 36;
    /// 2-bit K-quant.
    Q2K = 10, "q2_K", "Q2_K", 256, 84;
    /// 3-bit K-quant.
    Q3K = 11, "q3_K", "Q3_K", 256, 110;
    /// 4-bit K-quant.
    Q4K = 12, "q4_K", "Q4_K", 256, 144;
    /// 5-bit K-quant.
    Q5K = 13, "q5_K", "Q5_K", 256, 176;
    /// 6-bit K-quant.
    Q6K = 14, "q6_K", "Q6_K", 256, 210;
    /// 8-bit K-quant activation type.
    Q8K = 15, "q8_K", "Q8_K", 256, 292;
    /// i-quant 2.06 bpw.
    Iq2Xxs = 16, "iq2_xxs", "IQ2_XXS", 256, 66;
    /// i-quant 2.31 bpw.
    Iq2Xs = 17, "iq2_xs", "IQ2_XS", 256, 74;
    /// i-quant 3.06 bpw.
    Iq3Xxs = 18, "iq3_xxs", "IQ3_XXS", 256, 98;
    /// i-quant 1.56 bpw.
    Iq1S = 19, "iq1_s", "IQ1_S", 256, 50;
    /// Non-linear 4-bit, blocks of 32.
    Iq4Nl = 20, "iq4_nl", "IQ4_NL", 32, 18;
    /// i-quant 3.44 bpw.
    Iq3S = 21, "iq3_s", "IQ3_S", 256, 110;
    /// i-quant 2.56 bpw.
    Iq2S = 22, "iq2_s", "IQ2_S", 256, 82;
    /// Non-linear 4-bit, super-blocks of 256.
    Iq4Xs = 23, "iq4_xs", "IQ4_XS", 256, 136;
    /// Signed 8-bit integer.
    I8 = 24, "i8", "I8", 1, 1;
    /// Signed 16-bit integer.
    I16 = 25, "i16", "I16", 1, 2;
    /// Signed 32-bit integer.
    I32 = 26, "i32", "I32", 1, 4;
    /// Signed 64-bit integer.
    I64 = 27, "i64", "I64", 1, 8;
    /// IEEE binary64.
    F64 = 28, "f64", "F64", 1, 8;
    /// i-quant 1.75 bpw.
    Iq1M = 29, "iq1_m", "IQ1_M", 256, 56;
    /// bfloat16.
    BF16 = 30, "bf16", "BF16", 1, 2;
    /// Ternary 1.69 bpw.
    Tq1_0 = 34, "tq1_0", "TQ1_0", 256, 54;
    /// Ternary 2.06 bpw.
    Tq2_0 = 35, "tq2_0", "TQ2_0", 256, 66;
    /// Microscaling FP4, blocks of 32.
    Mxfp4 = 39, "mxfp4", "MXFP4", 32, 17;
    /// NVIDIA FP4, blocks of 64.
    Nvfp4 = 40, "nvfp4", "NVFP4", 64, 36;
    /// 1-bit, blocks of 128.
    Q1_0 = 41, "q1_0", "Q1_0", 128, 18;
    /// 2-bit, blocks of 64.
    Q2_0 = 42, "q2_0", "Q2_0", 64, 18;
    /// PN 3-bit ternary-friendly type: 80 weights in 34 bytes (this project only).
    Pn3t = 124, "pn3t", "PN3T", 80, 34;
    /// PN 4-bit type: 64 weights in 34 bytes (this project only).
    Pn4t = 125, "pn4t", "PN4T", 64, 34;
}

impl GgmlType {
    /// Bytes of a row of `n` elements, or `None` if `n` is not a whole number of blocks or the
    /// size overflows `u64`.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let blck = self.block_size() as u64;
        if !n.is_multiple_of(blck) {
            return None;
        }
        (n / blck).checked_mul(self.type_size() as u64)
    }

    /// Whether this is one of the project's PN types (decoded by `pn-format`, not here).
    pub fn is_pn(self) -> bool {
        matches!(self, GgmlType::Pn3t | GgmlType::Pn4t)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_gaps_are_rejected() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 100, 123, 126, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
        assert_eq!(GgmlType::ALL.len(), 35 + 2);
    }

    #[test]
    fn row_bytes_checks_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4K.row_bytes(5120), Some(20 * 144));
        assert_eq!(GgmlType::Q4K.row_bytes(100), None);
        assert_eq!(GgmlType::Pn3t.row_bytes(5120), Some(64 * 34));
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
        assert_eq!(GgmlType::Q8_1.type_size(), 36);
    }
}
