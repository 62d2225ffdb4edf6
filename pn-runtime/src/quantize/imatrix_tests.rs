use super::*;

fn legacy(entries: &[(&str, &[f32])]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(entries.len() as i32).to_le_bytes());
    for (name, vals) in entries {
        b.extend_from_slice(&(name.len() as i32).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&1i32.to_le_bytes());
        b.extend_from_slice(&(vals.len() as i32).to_le_bytes());
        for v in *vals {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    b
}

fn sample() -> ImatrixData {
    let mut entries = BTreeMap::new();
    entries.insert(
        "blk.0.ffn_up.weight".to_string(),
        Entry {
            sums: vec![3.0, 6.0, 9.0, 0.5],
            counts: vec![3.0],
        },
    );
    entries.insert(
        "blk.0.ffn_down.weight".to_string(),
        Entry {
            sums: vec![1.0, 2.0],
            counts: vec![2.0],
        },
    );
    ImatrixData {
        entries,
        datasets: vec!["calib.txt".into()],
        chunk_count: 4,
        chunk_size: 128,
    }
}

#[test]
fn legacy_layout_parses_and_rejects_truncation() {
    let b = legacy(&[("blk.0.ffn_up.weight", &[1.0, 2.0]), ("x", &[0.5])]);
    let m = parse_legacy(&b).unwrap();
    assert_eq!(m["blk.0.ffn_up.weight"], vec![1.0, 2.0]);
    assert_eq!(m["x"], vec![0.5]);
    let e = parse_legacy(&b[..b.len() - 2]).unwrap_err();
    assert!(e.contains("truncated") && e.contains("tensor x"), "{e}");
}

/// A GGUF imatrix written by pn reads back identically; the legacy layout keeps the means,
/// the chunk count and the dataset name.
#[test]
fn both_layouts_round_trip() {
    let d = sample();
    let f = gguf_io::GgufFile::from_bytes(d.to_gguf().unwrap()).unwrap();
    assert_eq!(f.get_str("general.type").unwrap(), "imatrix");
    assert_eq!(
        f.tensor_info("blk.0.ffn_up.weight.in_sum2").unwrap().dims,
        vec![4, 1]
    );
    assert_eq!(
        f.tensor_info("blk.0.ffn_up.weight.counts").unwrap().dims,
        vec![1, 1]
    );
    assert_eq!(parse_gguf(&f).unwrap(), d);

    let l = parse_legacy_file(&d.to_legacy()).unwrap();
    assert_eq!(l.chunk_count, 4);
    assert_eq!(l.datasets, vec!["calib.txt".to_string()]);
    assert_eq!(l.importance(), d.importance());
    assert_eq!(
        d.importance()["blk.0.ffn_up.weight"],
        vec![1.0, 2.0, 3.0, 0.5 / 3.0]
    );
}

#[test]
fn gguf_with_mismatched_counts_names_the_tensor() {
    // One matrix of K = 3 sums but counts for two matrices.
    let sums = f32_bytes(&[1.0, 2.0, 3.0]);
    let counts = f32_bytes(&[1.0, 1.0]);
    let bytes = gguf_io::write_gguf_to_vec(
        &[],
        &[
            (
                "blk.0.ffn_down.weight.in_sum2",
                GgmlType::F32,
                &[3, 1],
                &sums,
            ),
            (
                "blk.0.ffn_down.weight.counts",
                GgmlType::F32,
                &[1, 2],
                &counts,
            ),
        ],
    )
    .unwrap();
    let f = gguf_io::GgufFile::from_bytes(bytes).unwrap();
    let e = parse_gguf(&f).unwrap_err();
    assert!(e.contains("blk.0.ffn_down.weight"), "{e}");
}

#[test]
fn wrong_model_is_named() {
    let imp = sample().importance();
    let p = Path::new("other.imatrix");
    let ok = check_model(p, &imp, |n| match n {
        "blk.0.ffn_up.weight" => Some(4),
        "blk.0.ffn_down.weight" => Some(2),
        _ => None,
    });
    assert!(ok.is_ok());
    let e = check_model(p, &imp, |n| (n == "blk.0.ffn_up.weight").then_some(4)).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("other.imatrix") && s.contains("blk.0.ffn_down.weight"),
        "{s}"
    );
    let e = check_model(p, &imp, |_| Some(8)).unwrap_err().to_string();
    assert!(e.contains("K = 8"), "{e}");
}
