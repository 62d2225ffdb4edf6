//! Every stock type's decoder against gguf-py on `tests/data/real-gguf/stock-types.gguf`
//! (written by `scripts/stock_types_data.py`: gguf-py's quantizers where it has them, random
//! valid blocks elsewhere, each with gguf-py's dequantization): bit-exact. Our quantizers of
//! the types gguf-py also quantizes give its bytes exactly, and the fast dot products agree
//! with the reference on these rows.

use gguf_io::quants::{dequantize_row, quantize_row, reference, vec_dot_f32, QUANTIZABLE};
use gguf_io::{GgmlType, GgufFile};
use pn_tests::{data, random_vec};
use rand::rngs::StdRng;
use rand::SeedableRng;

fn file() -> GgufFile {
    GgufFile::open(data("real-gguf", "stock-types.gguf")).expect("stock-types.gguf")
}

fn f32_tensor(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    assert_eq!(t.ty, GgmlType::F32, "{name}");
    t.bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The `T.bytes` tensors, with their types.
fn cases(f: &GgufFile) -> Vec<(String, GgmlType)> {
    f.tensor_infos()
        .iter()
        .filter_map(|t| {
            let stem = t.name.strip_suffix(".bytes")?;
            assert_eq!(
                stem,
                t.ty.gguf_py_name(),
                "tensor {} is named by its type",
                t.name
            );
            Some((stem.to_string(), t.ty))
        })
        .collect()
}

#[test]
fn every_type_decodes_bit_exactly_like_gguf_py() {
    use GgmlType::*;
    let f = file();
    let cases = cases(&f);
    let seen: Vec<GgmlType> = cases.iter().map(|c| c.1).collect();
    for ty in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, Iq4Nl, Iq4Xs, Iq3Xxs, Iq3S, Iq2Xxs,
        Iq2Xs, Iq2S, Iq1S, Iq1M, Tq1_0, Tq2_0,
    ] {
        assert!(seen.contains(&ty), "no test vector for {ty}");
    }
    for (stem, ty) in &cases {
        let t = f.tensor(&format!("{stem}.bytes")).unwrap();
        assert_eq!(t.dims, [512, 2], "{stem}");
        let want = f32_tensor(&f, &format!("{stem}.expected"));
        let mut got = vec![0f32; want.len()];
        dequantize_row(*ty, t.bytes, &mut got).unwrap();
        let bad: Vec<usize> = (0..want.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .collect();
        assert!(
            bad.is_empty(),
            "{ty}: {} of {} values differ, first at {}: {} vs {}",
            bad.len(),
            want.len(),
            bad[0],
            got[bad[0]],
            want[bad[0]]
        );
        // Rows decode the same on their own (row = 512 elements).
        let rb = t.bytes.len() / 2;
        let mut row = vec![0f32; 512];
        dequantize_row(*ty, &t.bytes[rb..], &mut row).unwrap();
        assert_eq!(row, got[512..], "{ty} second row");
    }
}

#[test]
fn our_quantizers_write_gguf_py_bytes() {
    let f = file();
    let mut checked = Vec::new();
    for (stem, ty) in cases(&f) {
        let name = format!("{stem}.input");
        if !QUANTIZABLE.contains(&ty) || f.tensor_info(&name).is_none() {
            continue;
        }
        let x = f32_tensor(&f, &name);
        let mut q = Vec::new();
        quantize_row(ty, &x, &mut q).unwrap();
        let want = f.tensor(&format!("{stem}.bytes")).unwrap().bytes;
        let first = q.iter().zip(want).position(|(a, b)| a != b);
        assert_eq!(first, None, "{ty}: first differing byte");
        assert_eq!(q.len(), want.len(), "{ty}");
        checked.push(ty);
    }
    use GgmlType::*;
    assert_eq!(checked, [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0]);
}

#[test]
fn fast_dot_matches_reference_on_the_test_vectors() {
    let f = file();
    let mut rng = StdRng::seed_from_u64(5);
    for (stem, ty) in cases(&f) {
        let t = f.tensor(&format!("{stem}.bytes")).unwrap();
        let x = random_vec(&mut rng, 1024, 1.0);
        let r = reference::vec_dot_f32(ty, t.bytes, &x).unwrap();
        let fast = vec_dot_f32(ty, t.bytes, &x).unwrap();
        let w = f32_tensor(&f, &format!("{stem}.expected"));
        let scale: f32 = w.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
        assert!(
            (fast - r).abs() <= 2e-6 * scale + 1e-30,
            "{ty}: fast {fast} reference {r}"
        );
    }
}

#[test]
fn types_without_a_decoder_are_errors_not_panics() {
    use gguf_io::quants::{QuantError, DECODABLE};
    for &ty in GgmlType::ALL {
        if DECODABLE.contains(&ty) {
            continue;
        }
        let n = ty.block_size() * 8;
        let bytes = vec![0xffu8; ty.row_bytes(n as u64).unwrap() as usize];
        let mut out = vec![0f32; n];
        let e = dequantize_row(ty, &bytes, &mut out).unwrap_err();
        assert!(matches!(e, QuantError::Unsupported { .. }), "{ty}: {e}");
        assert!(e.to_string().contains(ty.name()), "{e}");
        assert!(vec_dot_f32(ty, &bytes, &out).is_err(), "{ty}");
    }
}
