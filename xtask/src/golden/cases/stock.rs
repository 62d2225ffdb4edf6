//! Stock GGML types (Q4_0 ... Q6_K, F16, BF16) decoded from the real-GGUF slices: bit-exact
//! against gguf-py's dequantization (a fixed check) and the digest of our output (snapshot).

use super::super::case::{f32_digest, sha256_hex, CaseError, Ctx, Output, Run};
use super::super::snapshot::Field;
use gguf_io::quants::dequantize_row;
use gguf_io::GgufFile;
use pn_tests::try_read_json;

/// Decodes every tensor of `real-gguf/slices.gguf`.
pub fn run(ctx: &Ctx) -> Result<Run, CaseError> {
    let exp = try_read_json(&ctx.file("real-gguf", "slices-expected.json"))?;
    let bin_path = ctx.file("real-gguf", "slices-expected.bin");
    let bin = std::fs::read(&bin_path).map_err(|e| format!("{}: {e}", bin_path.display()))?;
    let file = GgufFile::open(ctx.file("real-gguf", "slices.gguf"))?;
    let tensors = exp["tensors"]
        .as_array()
        .ok_or("slices-expected.json: no `tensors` array")?;
    let mut out = Output::default();
    for e in tensors {
        let name = e["name"].as_str().ok_or("tensor without a name")?;
        let view = file.tensor(name)?;
        let n = view.n_elements() as usize;
        let mut got = vec![0f32; n];
        dequantize_row(view.ty, view.bytes, &mut got).map_err(|err| format!("{name}: {err}"))?;
        let off = e["expected_offset"].as_u64().ok_or("no expected_offset")? as usize;
        let want = bin
            .get(off..off + 4 * n)
            .ok_or_else(|| format!("{name}: expected values past the end of the .bin"))?;
        let differing = got
            .iter()
            .zip(want.chunks_exact(4))
            .filter(|(g, w)| g.to_le_bytes() != [w[0], w[1], w[2], w[3]])
            .count();
        out.check(differing == 0, || {
            format!("{name}: {differing} of {n} values differ from gguf-py")
        });
        out.fields.push(Field::exact(
            name,
            format!(
                "{} n={n} raw={} decoded={}",
                view.ty,
                &sha256_hex(view.bytes)[..16],
                f32_digest(&got)
            ),
        ));
    }
    Ok(Run::Done(out))
}
