//! The kernels' `__host__ __device__` headers compiled as host C++ (`host/shim.cpp`), for the
//! CPU-side tests of the layout math. Not a production API.
#![allow(missing_docs)]

// The C side takes each stride and size as its own argument (the kernels' signatures), so
// the three emulator entry points exceed clippy's argument count; the safe wrappers below take
// shape structs.
#[allow(clippy::too_many_arguments)]
extern "C" {
    pub fn pn_shim_pn_dequant_pair_block(
        bits: i32,
        pair68: *const u8,
        blk: i32,
        out: *mut f32,
    ) -> i32;
    pub fn pn_shim_pn_block_dot_f32(bits: i32, pair68: *const u8, blk: i32, x: *const f32) -> f32;
    pub fn pn_shim_pn_elem_bytes(bits: i32, blk: *const u8, e: i32) -> f32;
    pub fn pn_shim_pn_pair_word(pair68: *const u8, blk: i32, i: i32) -> u32;
    pub fn pn_shim_pn_pair_scale_bits(pair68: *const u8, blk: i32) -> u16;
    pub fn pn_shim_pn_code_pair_h2bits(bits: i32, w: u32, j: i32) -> u32;
    pub fn pn_shim_pn_zero_h2bits(bits: i32) -> u32;
    pub fn pn_shim_pn_row_pairs(g0: u64, nb: u64, first: *mut u64, end: *mut u64);
    pub fn pn_shim_pn_block_in_row(q: u64, blk: i32, g0: u64, nb: u64) -> i32;
    pub fn pn_shim_f16_to_f32(h: u16) -> f32;
    pub fn pn_shim_q8_0_elem(b: *const u8, e: i32) -> f32;
    pub fn pn_shim_q4_k_elem(b: *const u8, e: i32) -> f32;
    pub fn pn_shim_q3_k_elem(b: *const u8, e: i32) -> f32;
    pub fn pn_shim_q4_k_scale_min_words(
        s0: u32,
        s1: u32,
        s2: u32,
        j: i32,
        sc: *mut i32,
        m: *mut i32,
    );
    pub fn pn_shim_q4_k_scale_min(s: *const u8, j: i32, sc: *mut i32, m: *mut i32);
    pub fn pn_shim_q4_0_kv_quantize(x: *const f32, blk18: *mut u8);
    pub fn pn_shim_q4_0_kv_part8(blk18: *const u8, part: i32, out: *mut f32);
    pub fn pn_shim_f32_to_f16_bits(f: f32) -> u16;
    pub fn pn_shim_gdn_gate(b: f32, al: f32, dt_bias: f32, a: f32, beta: *mut f32, g: *mut f32);
    pub fn pn_shim_gdn_chunk() -> i32;
    pub fn pn_shim_gdn_tri_row(idx: i32) -> i32;
    pub fn pn_shim_fwht_first(k: i32, r: i32, h: i32) -> i32;
    pub fn pn_shim_fwht_blocks(x: *mut f32, n: i32, r: i32, scale: f32);
    pub fn pn_shim_emu_delta_rule_chunked(
        q: *const f32,
        k: *const f32,
        qk_stride: i64,
        v: *const f32,
        v_stride: i64,
        b: *const f32,
        al: *const f32,
        ab_stride: i64,
        dt_bias: *const f32,
        ssm_a: *const f32,
        state: *mut f32,
        out: *mut f32,
        out_stride: i64,
        n_v_heads: i32,
        n_k_heads: i32,
        t: i32,
    ) -> i32;
    pub fn pn_shim_gdn_solve(mc: *const f32, beta: *const f32, u: *mut f32, c: i32);
    pub fn pn_shim_emu_attn_prefill(
        kv_type: i32,
        q: *const f32,
        q_tok_stride: i64,
        q_head_stride: i64,
        kc: *const std::ffi::c_void,
        vc: *const std::ffi::c_void,
        pos_stride: i64,
        head_stride: i64,
        n_head: i32,
        group: i32,
        p0: i32,
        n_tokens: i32,
        scale: f32,
        o: *mut f32,
        o_tok_stride: i64,
    ) -> i32;
    pub fn pn_shim_gdn_chunked_head(
        q: *const f32,
        k: *const f32,
        qk_stride: i64,
        v: *const f32,
        v_stride: i64,
        b: *const f32,
        al: *const f32,
        ab_stride: i64,
        dt_bias: f32,
        a: f32,
        state: *mut f32,
        out: *mut f32,
        out_stride: i64,
        t: i32,
    );
}

/// Safe wrappers: each checks the buffer sizes the C side reads.
pub mod safe {
    use super::*;
    use crate::types::{DeltaRuleInputs, DeltaRuleShape};

    /// First element of butterfly `k` of the stage of span `h` (chunks of `r`), as the Hadamard
    /// kernels pair them.
    pub fn fwht_first(k: usize, r: usize, h: usize) -> usize {
        // SAFETY: pure integer math.
        unsafe { pn_shim_fwht_first(k as i32, r as i32, h as i32) as usize }
    }

    /// The Hadamard kernels' butterfly network over `x` (chunks of `r`, `x.len()` a multiple of
    /// `r`), run serially on the host, then scaled by `scale`.
    pub fn fwht_blocks(x: &mut [f32], r: usize, scale: f32) {
        assert!(r >= 2 && r.is_power_of_two() && x.len().is_multiple_of(r));
        // SAFETY: the shim touches x[0..len) only (pairs stay inside their chunk).
        unsafe { pn_shim_fwht_blocks(x.as_mut_ptr(), x.len() as i32, r as i32, scale) }
    }

    /// Decode block `blk` (0/1) of a 68-byte pair of PN blocks (`bits` 3 or 4).
    pub fn pn_dequant_pair_block(bits: u32, pair: &[u8; 68], blk: usize) -> Vec<f32> {
        assert!(bits == 3 || bits == 4);
        let mut out = vec![0.0f32; if bits == 3 { 80 } else { 64 }];
        // SAFETY: pair is 68 bytes, out holds one block's elements.
        unsafe {
            pn_shim_pn_dequant_pair_block(bits as i32, pair.as_ptr(), blk as i32, out.as_mut_ptr())
        };
        out
    }
    /// fp32 block dot in element order with the scale factored out.
    pub fn pn_block_dot_f32(bits: u32, pair: &[u8; 68], blk: usize, x: &[f32]) -> f32 {
        assert!(x.len() >= if bits == 3 { 80 } else { 64 });
        // SAFETY: sizes checked above.
        unsafe { pn_shim_pn_block_dot_f32(bits as i32, pair.as_ptr(), blk as i32, x.as_ptr()) }
    }
    /// Element `e` of one 34-byte block.
    pub fn pn_elem_bytes(bits: u32, block: &[u8; 34], e: usize) -> f32 {
        assert!(e < if bits == 3 { 80 } else { 64 });
        // SAFETY: the block is 34 bytes and e is in range.
        unsafe { pn_shim_pn_elem_bytes(bits as i32, block.as_ptr(), e as i32) }
    }
    /// Word `i` (0..8) of block `blk` of a pair, as the kernels extract it.
    pub fn pn_pair_word(pair: &[u8; 68], blk: usize, i: usize) -> u32 {
        assert!(blk < 2 && i < 8);
        // SAFETY: 68-byte pair, indices in range.
        unsafe { pn_shim_pn_pair_word(pair.as_ptr(), blk as i32, i as i32) }
    }
    /// Scale bits of block `blk` of a pair.
    pub fn pn_pair_scale_bits(pair: &[u8; 68], blk: usize) -> u16 {
        assert!(blk < 2);
        // SAFETY: 68-byte pair.
        unsafe { pn_shim_pn_pair_scale_bits(pair.as_ptr(), blk as i32) }
    }
    /// Half2 bits of code pair `j` of a word (exponent trick).
    pub fn pn_code_pair_h2bits(bits: u32, w: u32, j: usize) -> u32 {
        // SAFETY: pure function.
        unsafe { pn_shim_pn_code_pair_h2bits(bits as i32, w, j as i32) }
    }
    /// Half2 bits of (1024 + z, 1024 + z).
    pub fn pn_zero_h2bits(bits: u32) -> u32 {
        // SAFETY: pure function.
        unsafe { pn_shim_pn_zero_h2bits(bits as i32) }
    }
    /// Pair range `[first, end)` of a row starting at global block `g0` with `nb` blocks.
    pub fn pn_row_pairs(g0: u64, nb: u64) -> (u64, u64) {
        let (mut a, mut b) = (0, 0);
        // SAFETY: writes two u64 outputs.
        unsafe { pn_shim_pn_row_pairs(g0, nb, &mut a, &mut b) };
        (a, b)
    }
    /// Whether block `blk` of pair `q` belongs to the row.
    pub fn pn_block_in_row(q: u64, blk: usize, g0: u64, nb: u64) -> bool {
        // SAFETY: pure function.
        unsafe { pn_shim_pn_block_in_row(q, blk as i32, g0, nb) != 0 }
    }
    /// f16 bits to f32.
    pub fn f16_to_f32(h: u16) -> f32 {
        // SAFETY: pure function.
        unsafe { pn_shim_f16_to_f32(h) }
    }
    /// Element `e` of a Q8_0 block (34 bytes).
    pub fn q8_0_elem(b: &[u8], e: usize) -> f32 {
        assert!(b.len() >= 34 && e < 32);
        // SAFETY: size checked.
        unsafe { pn_shim_q8_0_elem(b.as_ptr(), e as i32) }
    }
    /// Element `e` of a Q4_K block (144 bytes).
    pub fn q4_k_elem(b: &[u8], e: usize) -> f32 {
        assert!(b.len() >= 144 && e < 256);
        // SAFETY: size checked.
        unsafe { pn_shim_q4_k_elem(b.as_ptr(), e as i32) }
    }
    /// Element `e` of a Q3_K block (110 bytes).
    pub fn q3_k_elem(b: &[u8], e: usize) -> f32 {
        assert!(b.len() >= 110 && e < 256);
        // SAFETY: size checked.
        unsafe { pn_shim_q3_k_elem(b.as_ptr(), e as i32) }
    }
    /// The q4_0 KV cache block of 32 values (18 bytes), as the store kernel writes it.
    pub fn q4_0_kv_quantize(x: &[f32; 32]) -> [u8; 18] {
        let mut b = [0u8; 18];
        // SAFETY: 32 readable floats, 18 writable bytes.
        unsafe { pn_shim_q4_0_kv_quantize(x.as_ptr(), b.as_mut_ptr()) };
        b
    }
    /// The 32 values of a q4_0 KV block, decoded in the attention loader's four parts of 8.
    pub fn q4_0_kv_dequantize(b: &[u8; 18]) -> [f32; 32] {
        let mut out = [0f32; 32];
        for (part, o) in out.chunks_exact_mut(8).enumerate() {
            // SAFETY: 18 readable bytes, part < 4, 8 writable floats.
            unsafe { pn_shim_q4_0_kv_part8(b.as_ptr(), part as i32, o.as_mut_ptr()) };
        }
        out
    }
    /// f32 to f16 bits, rounded to nearest even (the kernels' written-out conversion).
    pub fn f32_to_f16_bits(f: f32) -> u16 {
        // SAFETY: pure function.
        unsafe { pn_shim_f32_to_f16_bits(f) }
    }
    /// Q4_K (scale, min) of sub-block `j` from the 12 scale bytes, and from them as three words.
    pub fn q4_k_scale_min_both(s: &[u8; 12], j: usize) -> ((i32, i32), (i32, i32)) {
        assert!(j < 8);
        let w = |i: usize| u32::from_le_bytes(s[4 * i..4 * i + 4].try_into().unwrap());
        let (mut a, mut b, mut c, mut d) = (0, 0, 0, 0);
        // SAFETY: 12 readable bytes, j in range, four i32 outputs.
        unsafe {
            pn_shim_q4_k_scale_min(s.as_ptr(), j as i32, &mut a, &mut b);
            pn_shim_q4_k_scale_min_words(w(0), w(1), w(2), j as i32, &mut c, &mut d);
        }
        ((a, b), (c, d))
    }
    /// `(beta, g)` of one token as the chunked delta-rule kernel computes them.
    pub fn gdn_gate(b: f32, al: f32, dt_bias: f32, a: f32) -> (f32, f32) {
        let (mut beta, mut g) = (0.0, 0.0);
        // SAFETY: pure function with two f32 outputs.
        unsafe { pn_shim_gdn_gate(b, al, dt_bias, a, &mut beta, &mut g) };
        (beta, g)
    }
    /// Tokens per chunk of the chunked delta-rule kernel (`PN_GDN_C`).
    pub fn gdn_chunk() -> usize {
        // SAFETY: pure function.
        unsafe { pn_shim_gdn_chunk() as usize }
    }
    /// Row of entry `idx` of a row-major lower triangle with its diagonal.
    pub fn gdn_tri_row(idx: usize) -> usize {
        // SAFETY: pure function.
        unsafe { pn_shim_gdn_tri_row(idx as i32) as usize }
    }
    /// Forward substitution of one column of a chunk of `u.len()` tokens: `mc` is the
    /// `C x (C + 1)` coefficient matrix, `u` the right-hand sides on entry and `U` on return.
    pub fn gdn_solve(mc: &[f32], beta: &[f32], u: &mut [f32]) {
        let c = gdn_chunk();
        assert!(mc.len() >= c * (c + 1) && u.len() <= c && beta.len() >= u.len());
        // SAFETY: sizes checked; the C side reads mc[..c*(c+1)], beta[..n], u[..n].
        unsafe { pn_shim_gdn_solve(mc.as_ptr(), beta.as_ptr(), u.as_mut_ptr(), u.len() as i32) };
    }
    /// One value head of the chunked delta rule on the host, per `s` with one value and one
    /// key head: `q`, `k` rows of 128 at `t * qk_stride`, `v` at `t * v_stride`, raw beta/alpha
    /// at `t * ab_stride`, `dt_bias[0]` and `ssm_a[0]` the head's gate parameters, `state`
    /// 128 x 128 (row j holds S[.][j]), output rows of 128 at `t * out_stride`.
    pub fn gdn_chunked_head(
        x: &DeltaRuleInputs<&[f32]>,
        s: &DeltaRuleShape,
        state: &mut [f32],
        out: &mut [f32],
    ) {
        let t = s.t_len;
        assert!(t > 0 && s.n_v_heads == 1 && s.n_k_heads == 1 && state.len() >= 128 * 128);
        assert!(!x.dt_bias.is_empty() && !x.ssm_a.is_empty());
        let t1 = t - 1;
        assert!(x.q.len() >= t1 * s.qk_stride + 128 && x.k.len() >= t1 * s.qk_stride + 128);
        assert!(x.v.len() >= t1 * s.v_stride + 128 && out.len() >= t1 * s.out_stride + 128);
        assert!(x.beta_raw.len() > t1 * s.ab_stride && x.alpha_raw.len() > t1 * s.ab_stride);
        // SAFETY: every length the C side reads or writes is checked above.
        unsafe {
            pn_shim_gdn_chunked_head(
                x.q.as_ptr(),
                x.k.as_ptr(),
                s.qk_stride as i64,
                x.v.as_ptr(),
                s.v_stride as i64,
                x.beta_raw.as_ptr(),
                x.alpha_raw.as_ptr(),
                s.ab_stride as i64,
                x.dt_bias[0],
                x.ssm_a[0],
                state.as_mut_ptr(),
                out.as_mut_ptr(),
                s.out_stride as i64,
                t as i32,
            )
        };
    }
    /// The `delta_rule_chunked_f32` kernel's source run on the host by the SIMT emulator
    /// (`host/simt_emu.h`), with the arguments of [`crate::Gpu::delta_rule_chunked`] as host
    /// slices. `false` when the emulated threads deadlock on their barriers.
    pub fn emu_delta_rule_chunked(
        x: &DeltaRuleInputs<&[f32]>,
        s: &DeltaRuleShape,
        state: &mut [f32],
        out: &mut [f32],
    ) -> bool {
        let (nv, nk, t, d) = (s.n_v_heads, s.n_k_heads, s.t_len, 128);
        assert!(t > 0 && nv > 0 && nk > 0);
        let t1 = t - 1;
        assert!(x.q.len() >= t1 * s.qk_stride + nk * d);
        assert!(x.k.len() >= t1 * s.qk_stride + nk * d);
        assert!(x.v.len() >= t1 * s.v_stride + nv * d && out.len() >= t1 * s.out_stride + nv * d);
        assert!(x.beta_raw.len() >= t1 * s.ab_stride + nv);
        assert!(x.alpha_raw.len() >= t1 * s.ab_stride + nv);
        assert!(x.dt_bias.len() >= nv && x.ssm_a.len() >= nv && state.len() >= nv * d * d);
        // SAFETY: every length the kernel reads or writes is checked above.
        unsafe {
            pn_shim_emu_delta_rule_chunked(
                x.q.as_ptr(),
                x.k.as_ptr(),
                s.qk_stride as i64,
                x.v.as_ptr(),
                s.v_stride as i64,
                x.beta_raw.as_ptr(),
                x.alpha_raw.as_ptr(),
                s.ab_stride as i64,
                x.dt_bias.as_ptr(),
                x.ssm_a.as_ptr(),
                state.as_mut_ptr(),
                out.as_mut_ptr(),
                s.out_stride as i64,
                nv as i32,
                nk as i32,
                t as i32,
            ) == 0
        }
    }

    /// A KV cache as host bytes for [`emu_attn_prefill`]: f32 values, f16 bits, or q8_0 / q4_0
    /// rows (272 / 144 bytes per 256 values).
    #[derive(Clone, Copy, Debug)]
    pub enum EmuKv<'a> {
        /// f32 rows of 256 values.
        F32(&'a [f32]),
        /// f16 rows as their bits.
        F16(&'a [u16]),
        /// q8_0 rows, 8 blocks of 34 bytes.
        Q8(&'a [u8]),
        /// q4_0 rows, 8 blocks of 18 bytes.
        Q4(&'a [u8]),
    }

    impl EmuKv<'_> {
        fn parts(&self) -> (i32, *const std::ffi::c_void, usize, usize) {
            match self {
                EmuKv::F32(s) => (0, s.as_ptr().cast(), s.len(), 256),
                EmuKv::F16(s) => (1, s.as_ptr().cast(), s.len(), 256),
                EmuKv::Q8(s) => (2, s.as_ptr().cast(), s.len(), 272),
                EmuKv::Q4(s) => (3, s.as_ptr().cast(), s.len(), 144),
            }
        }
    }

    /// Geometry of one [`emu_attn_prefill`] call, in the units of `attn_prefill_*kv`
    /// (`kernels/attention_prefill.cu`): strides of q/o in floats, of the caches in elements.
    #[derive(Clone, Copy, Debug)]
    pub struct EmuAttnShape {
        /// Floats between query tokens.
        pub q_tok_stride: usize,
        /// Floats between query heads.
        pub q_head_stride: usize,
        /// Cache elements between positions.
        pub pos_stride: usize,
        /// Cache elements between kv heads.
        pub head_stride: usize,
        /// Query heads.
        pub n_head: usize,
        /// KV heads (divides `n_head`).
        pub n_kv: usize,
        /// Position of the first query token.
        pub p0: usize,
        /// Query tokens.
        pub n_tokens: usize,
        /// Score scale.
        pub scale: f32,
        /// Floats between output tokens.
        pub o_tok_stride: usize,
    }

    /// The tiled prefill attention kernel's source run on the host by the SIMT emulator, every
    /// block and thread. `false` when the emulated threads deadlock on their barriers.
    pub fn emu_attn_prefill(
        q: &[f32],
        k: EmuKv<'_>,
        v: EmuKv<'_>,
        sh: &EmuAttnShape,
        o: &mut [f32],
    ) -> bool {
        let (kt, kp, kl, row) = k.parts();
        let (vt, vp, vl, _) = v.parts();
        assert!(kt == vt && sh.n_tokens > 0 && sh.n_kv > 0 && sh.n_head.is_multiple_of(sh.n_kv));
        let t1 = sh.n_tokens - 1;
        assert!(q.len() >= t1 * sh.q_tok_stride + (sh.n_head - 1) * sh.q_head_stride + 256);
        assert!(o.len() >= t1 * sh.o_tok_stride + sh.n_head * 256);
        let need = (sh.p0 + t1) * sh.pos_stride + (sh.n_kv - 1) * sh.head_stride + row;
        assert!(kl >= need && vl >= need);
        // SAFETY: every length the kernel reads or writes is checked above (it reads positions
        // 0..p0+n_tokens of kv heads 0..n_kv).
        unsafe {
            pn_shim_emu_attn_prefill(
                kt,
                q.as_ptr(),
                sh.q_tok_stride as i64,
                sh.q_head_stride as i64,
                kp,
                vp,
                sh.pos_stride as i64,
                sh.head_stride as i64,
                sh.n_head as i32,
                (sh.n_head / sh.n_kv) as i32,
                sh.p0 as i32,
                sh.n_tokens as i32,
                sh.scale,
                o.as_mut_ptr(),
                sh.o_tok_stride as i64,
            ) == 0
        }
    }
}
