//! Hostile and malformed GGUF input: every case gives its specific error variant, never a
//! panic, and the parser never makes an allocation larger than the file.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use gguf_io::{write_gguf_to_vec, Array, GgmlType, GgufError, GgufFile, MetadataEntry, Value};

// ---- a per-thread "largest single allocation" tracker ----

struct Tracking;

thread_local! {
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = PEAK.try_with(|p| p.set(p.get().max(l.size())));
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let _ = PEAK.try_with(|pk| pk.set(pk.get().max(new)));
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Parses `bytes` and checks that no single allocation during parsing exceeded the file size
/// (or a 1 KiB floor for tiny inputs: the name index and error messages allocate a little).
fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let owned = bytes.to_vec();
    PEAK.with(|p| p.set(0));
    let r = GgufFile::from_bytes(owned);
    let peak = PEAK.with(|p| p.get());
    let limit = bytes.len().max(1024);
    assert!(
        peak <= limit,
        "largest allocation {peak} > file size {}",
        bytes.len()
    );
    r
}

// ---- building files byte by byte ----

fn s(out: &mut Vec<u8>, text: &[u8]) {
    out.extend((text.len() as u64).to_le_bytes());
    out.extend(text);
}

fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut h = b"GGUF".to_vec();
    h.extend(version.to_le_bytes());
    h.extend(n_tensors.to_le_bytes());
    h.extend(n_kv.to_le_bytes());
    h
}

fn kv_u32(out: &mut Vec<u8>, key: &[u8], v: u32) {
    s(out, key);
    out.extend(4u32.to_le_bytes());
    out.extend(v.to_le_bytes());
}

fn tinfo(out: &mut Vec<u8>, name: &[u8], dims: &[u64], ty: u32, offset: u64) {
    s(out, name);
    out.extend((dims.len() as u32).to_le_bytes());
    for d in dims {
        out.extend(d.to_le_bytes());
    }
    out.extend(ty.to_le_bytes());
    out.extend(offset.to_le_bytes());
}

fn pad_to(out: &mut Vec<u8>, a: usize) {
    while !out.len().is_multiple_of(a) {
        out.push(0);
    }
}

/// A file with the given tensor infos (all F32 unless `ty` says otherwise) and `data_len`
/// bytes of data.
fn with_tensors(infos: &[(&[u8], &[u64], u32, u64)], data_len: usize) -> Vec<u8> {
    let mut f = header(3, infos.len() as u64, 0);
    for (n, d, t, o) in infos {
        tinfo(&mut f, n, d, *t, *o);
    }
    pad_to(&mut f, 32);
    f.extend(vec![0u8; data_len]);
    f
}

fn valid_small() -> Vec<u8> {
    let meta = vec![
        MetadataEntry::new("general.architecture", Value::String("tiny".into())),
        MetadataEntry::new("a.u8", Value::U8(7)),
        MetadataEntry::new("a.f32", Value::F32(1.5)),
        MetadataEntry::new("a.bool", Value::Bool(true)),
        MetadataEntry::new(
            "a.strs",
            Value::Array(Array::String(vec!["x".into(), "yz".into()])),
        ),
        MetadataEntry::new(
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, -2]),
                Array::Bool(vec![false]),
            ])),
        ),
    ];
    let f32s: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let q8 = vec![0u8; 34 * 2];
    write_gguf_to_vec(
        &meta,
        &[
            ("vec", GgmlType::F32, &[4], &f32s),
            ("mat", GgmlType::Q8_0, &[32, 2], &q8),
        ],
    )
    .unwrap()
}

// ---- the cases ----

#[test]
fn truncation_at_every_offset_is_an_error_until_the_data_is_complete() {
    let full = valid_small();
    let f = parse(&full).unwrap();
    let last = f
        .tensor_infos()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap();
    let needed = (f.data_offset() + last) as usize;
    for len in 0..full.len() {
        let r = parse(&full[..len]);
        if len >= needed {
            // Only trailing padding is missing: still a complete file.
            assert!(r.is_ok(), "len {len}: {:?}", r.err());
            continue;
        }
        match r {
            Err(GgufError::Truncated { .. })
            | Err(GgufError::CountTooLarge { .. })
            | Err(GgufError::TensorOutOfBounds { .. }) => {}
            Err(GgufError::BadMagic { .. }) if len < 4 => panic!("prefix of GGUF is not bad magic"),
            other => panic!("len {len}: unexpected {other:?}"),
        }
    }
}

#[test]
fn huge_counts_fail_fast() {
    for n in [1u64 << 60, u64::MAX, 1 << 32] {
        assert!(matches!(
            parse(&header(3, n, 0)),
            Err(GgufError::CountTooLarge { what: "tensor", .. })
        ));
        assert!(matches!(
            parse(&header(3, 0, n)),
            Err(GgufError::CountTooLarge {
                what: "metadata pair",
                ..
            })
        ));
    }
    // An array claiming 2^62 elements.
    let mut f = header(3, 0, 1);
    s(&mut f, b"big");
    f.extend(9u32.to_le_bytes());
    f.extend(0u32.to_le_bytes());
    f.extend((1u64 << 62).to_le_bytes());
    assert!(
        matches!(parse(&f), Err(GgufError::CountTooLarge { what: "array element", count, .. }) if count == 1 << 62)
    );
    // A string claiming 2^63 bytes, as a key and as a value.
    let mut f = header(3, 0, 1);
    f.extend((1u64 << 63).to_le_bytes());
    f.extend(b"abc0123456789abcdef");
    assert!(matches!(
        parse(&f),
        Err(GgufError::Truncated {
            what: "metadata key",
            ..
        })
    ));
    let mut f = header(3, 0, 1);
    s(&mut f, b"k");
    f.extend(8u32.to_le_bytes());
    f.extend(u64::MAX.to_le_bytes());
    assert!(matches!(
        parse(&f),
        Err(GgufError::Truncated {
            what: "string value",
            ..
        })
    ));
    // An array of 2^40 strings in a small file.
    let mut f = header(3, 0, 1);
    s(&mut f, b"k");
    f.extend(9u32.to_le_bytes());
    f.extend(8u32.to_le_bytes());
    f.extend((1u64 << 40).to_le_bytes());
    f.extend([0u8; 64]);
    assert!(matches!(parse(&f), Err(GgufError::CountTooLarge { .. })));
}

#[test]
fn tensor_offsets_are_checked() {
    let dims: &[u64] = &[8]; // 32 bytes of F32
    assert!(matches!(
        parse(&with_tensors(&[(b"a", dims, 0, 4)], 64)),
        Err(GgufError::MisalignedOffset { ref tensor, offset: 4, alignment: 32 }) if tensor == "a"
    ));
    assert!(matches!(
        parse(&with_tensors(
            &[(b"a", dims, 0, 0), (b"b", &[16], 0, 0)],
            64
        )),
        Err(GgufError::TensorOverlap { .. })
    ));
    assert!(matches!(
        parse(&with_tensors(&[(b"a", &[16], 0, 0), (b"b", dims, 0, 32)], 96)),
        Err(GgufError::TensorOverlap { ref tensor, ref other }) if tensor == "b" && other == "a"
    ));
    assert!(matches!(
        parse(&with_tensors(&[(b"a", dims, 0, 32)], 32)),
        Err(GgufError::TensorOutOfBounds { ref tensor, .. }) if tensor == "a"
    ));
    assert!(matches!(
        parse(&with_tensors(&[(b"a", dims, 0, u64::MAX - 31)], 32)),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
    // Adjacent and in bounds is fine; a zero-size tensor overlaps nothing.
    let ok = parse(&with_tensors(
        &[(b"a", dims, 0, 0), (b"b", dims, 0, 32), (b"e", &[0], 0, 32)],
        64,
    ))
    .unwrap();
    assert_eq!(ok.tensor("b").unwrap().bytes.len(), 32);
    assert_eq!(ok.tensor("e").unwrap().bytes.len(), 0);
}

#[test]
fn dimension_problems_are_checked() {
    let big = 1u64 << 32;
    assert!(matches!(
        parse(&with_tensors(&[(b"a", &[big, big, big], 0, 0)], 32)),
        Err(GgufError::SizeOverflow { ref tensor, .. }) if tensor == "a"
    ));
    // Element count fits but the byte size does not.
    assert!(matches!(
        parse(&with_tensors(&[(b"a", &[1 << 62, 1], 0, 0)], 32)),
        Err(GgufError::SizeOverflow { .. })
    ));
    assert!(matches!(
        parse(&with_tensors(&[(b"a", &[1, 1, 1, 1, 1], 0, 0)], 32)),
        Err(GgufError::TooManyDims { n_dims: 5, .. })
    ));
    assert!(matches!(
        parse(&with_tensors(&[(b"q", &[100, 2], 12, 0)], 1024)),
        Err(GgufError::NotBlockMultiple {
            ne0: 100,
            block_size: 256,
            ..
        })
    ));
    // n_dims claimed huge: rejected before reading any dims.
    let mut f = header(3, 1, 0);
    s(&mut f, b"a");
    f.extend(u32::MAX.to_le_bytes());
    f.extend([0u8; 64]);
    assert!(matches!(parse(&f), Err(GgufError::TooManyDims { .. })));
}

#[test]
fn unknown_type_ids_name_the_tensor() {
    for id in [4u32, 5, 31, 36, 43, 100, 123, 126, u32::MAX] {
        match parse(&with_tensors(&[(b"w.weight", &[256], id, 0)], 1024)) {
            Err(GgufError::UnknownType { tensor, id: got }) => {
                assert_eq!((tensor.as_str(), got), ("w.weight", id));
            }
            other => panic!("id {id}: {other:?}"),
        }
    }
    // The PN ids are accepted.
    let f = parse(&with_tensors(
        &[(b"p3", &[80], 124, 0), (b"p4", &[64], 125, 64)],
        128,
    ))
    .unwrap();
    assert_eq!(f.tensor("p3").unwrap().ty, GgmlType::Pn3t);
    assert_eq!(f.tensor("p4").unwrap().bytes.len(), 34);
}

#[test]
fn bad_utf8_names_the_offset() {
    // In a key.
    let mut f = header(3, 0, 1);
    s(&mut f, b"ab\xffc");
    f.extend(4u32.to_le_bytes());
    f.extend(0u32.to_le_bytes());
    assert!(matches!(
        parse(&f),
        Err(GgufError::InvalidUtf8 {
            what: "metadata key",
            offset: 34
        })
    ));
    // In a string value.
    let mut f = header(3, 0, 1);
    s(&mut f, b"k");
    f.extend(8u32.to_le_bytes());
    s(&mut f, b"\xc3(");
    assert!(matches!(
        parse(&f),
        Err(GgufError::InvalidUtf8 {
            what: "string value",
            offset: 45
        })
    ));
    // In a tensor name.
    let f = with_tensors(&[(b"t\x80", &[8], 0, 0)], 32);
    assert!(matches!(
        parse(&f),
        Err(GgufError::InvalidUtf8 {
            what: "tensor name",
            offset: 33
        })
    ));
}

#[test]
fn magic_version_and_endianness() {
    let mut f = header(3, 0, 0);
    f[0] = b'g';
    assert!(matches!(parse(&f), Err(GgufError::BadMagic { .. })));
    assert!(matches!(
        parse(b"GGML\x03\0\0\0"),
        Err(GgufError::BadMagic { .. })
    ));
    assert!(matches!(
        parse(b""),
        Err(GgufError::Truncated { what: "magic", .. })
    ));
    for v in [0u32, 1, 4, 7] {
        assert!(
            matches!(parse(&header(v, 0, 0)), Err(GgufError::UnsupportedVersion { version }) if version == v)
        );
    }
    // A big-endian v3 file: the version bytes read as 0x03000000.
    let mut be = b"GGUF".to_vec();
    be.extend(3u32.to_be_bytes());
    be.extend(0u64.to_be_bytes());
    be.extend(0u64.to_be_bytes());
    assert!(matches!(
        parse(&be),
        Err(GgufError::BigEndian { raw: 0x0300_0000 })
    ));
    let err = parse(&be).unwrap_err().to_string();
    assert!(err.contains("big-endian"), "{err}");
    // v2 files parse like v3.
    assert_eq!(parse(&header(2, 0, 0)).unwrap().version(), 2);
}

#[test]
fn metadata_problems() {
    // Duplicate key.
    let mut f = header(3, 0, 2);
    kv_u32(&mut f, b"k", 1);
    kv_u32(&mut f, b"k", 2);
    assert!(matches!(parse(&f), Err(GgufError::DuplicateKey { ref key }) if key == "k"));
    // Empty key.
    let mut f = header(3, 0, 1);
    kv_u32(&mut f, b"", 1);
    assert!(matches!(parse(&f), Err(GgufError::EmptyKey { offset: 24 })));
    // Unknown value type.
    let mut f = header(3, 0, 1);
    s(&mut f, b"k");
    f.extend(13u32.to_le_bytes());
    f.extend([0u8; 8]);
    assert!(matches!(
        parse(&f),
        Err(GgufError::UnknownValueType { type_id: 13, .. })
    ));
    // Bool other than 0/1.
    let mut f = header(3, 0, 1);
    s(&mut f, b"k");
    f.extend(7u32.to_le_bytes());
    f.push(2);
    assert!(matches!(
        parse(&f),
        Err(GgufError::InvalidBool { byte: 2, .. })
    ));
    // Duplicate tensor name.
    assert!(matches!(
        parse(&with_tensors(&[(b"a", &[8], 0, 0), (b"a", &[8], 0, 32)], 64)),
        Err(GgufError::DuplicateTensor { ref name }) if name == "a"
    ));
}

fn nested(depth: usize) -> Vec<u8> {
    let mut f = header(3, 0, 1);
    s(&mut f, b"deep");
    f.extend(9u32.to_le_bytes());
    for _ in 0..depth - 1 {
        f.extend(9u32.to_le_bytes());
        f.extend(1u64.to_le_bytes());
    }
    f.extend(0u32.to_le_bytes());
    f.extend(1u64.to_le_bytes());
    f.push(42);
    f
}

#[test]
fn array_nesting_is_limited() {
    let ok = parse(&nested(gguf_io::MAX_ARRAY_DEPTH)).unwrap();
    assert_eq!(ok.get_array("deep").unwrap().len(), 1);
    assert!(matches!(
        parse(&nested(gguf_io::MAX_ARRAY_DEPTH + 1)),
        Err(GgufError::NestingTooDeep { .. })
    ));
    // Thousands of levels: an error, not a stack overflow.
    assert!(parse(&nested(5000)).is_err());
}

#[test]
fn alignment_key_is_validated_and_used() {
    for bad in [0u32, 3, 24] {
        let mut f = header(3, 0, 1);
        kv_u32(&mut f, b"general.alignment", bad);
        assert!(
            matches!(parse(&f), Err(GgufError::InvalidAlignment { .. })),
            "{bad}"
        );
    }
    let mut f = header(3, 0, 1);
    s(&mut f, b"general.alignment");
    f.extend(10u32.to_le_bytes());
    f.extend(64u64.to_le_bytes());
    assert!(matches!(parse(&f), Err(GgufError::InvalidAlignment { .. })));
    // A valid 64-byte alignment moves the data section and is enforced on offsets.
    let mut f = header(3, 1, 1);
    kv_u32(&mut f, b"general.alignment", 64);
    tinfo(&mut f, b"t", &[8], 0, 32);
    pad_to(&mut f, 64);
    f.extend([0u8; 128]);
    assert!(matches!(
        parse(&f),
        Err(GgufError::MisalignedOffset { alignment: 64, .. })
    ));
}

#[test]
fn getters_name_key_and_types() {
    let f = parse(&valid_small()).unwrap();
    assert_eq!(f.get_u32("a.u8").unwrap(), 7);
    assert_eq!(f.get_u64("a.u8").unwrap(), 7);
    assert_eq!(f.get_f32("a.f32").unwrap(), 1.5);
    assert!(f.get_bool("a.bool").unwrap());
    assert_eq!(f.get_str_array("a.strs").unwrap(), vec!["x", "yz"]);
    match f.get_u32("a.strs") {
        Err(GgufError::WrongType { key, found, .. }) => {
            assert_eq!((key.as_str(), found), ("a.strs", "ARRAY[STRING]"))
        }
        other => panic!("{other:?}"),
    }
    let msg = f.get_str("a.f32").unwrap_err().to_string();
    assert!(
        msg.contains("a.f32") && msg.contains("STRING") && msg.contains("FLOAT32"),
        "{msg}"
    );
    assert!(matches!(
        f.get_f32("nope"),
        Err(GgufError::MissingKey { .. })
    ));
    assert!(matches!(
        f.tensor("nope"),
        Err(GgufError::TensorNotFound { .. })
    ));
    // Nested arrays are read.
    match f.get_array("a.nested").unwrap() {
        Array::Array(v) => assert_eq!(v[0], Array::I32(vec![1, -2])),
        other => panic!("{other:?}"),
    }
}

#[test]
fn out_of_range_integers() {
    let mut f = header(3, 0, 2);
    s(&mut f, b"neg");
    f.extend(5u32.to_le_bytes());
    f.extend((-1i32).to_le_bytes());
    s(&mut f, b"huge");
    f.extend(10u32.to_le_bytes());
    f.extend(u64::MAX.to_le_bytes());
    let g = parse(&f).unwrap();
    assert!(matches!(
        g.get_u32("neg"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert!(matches!(
        g.get_u32("huge"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert_eq!(g.get_u64("huge").unwrap(), u64::MAX);
    assert!(matches!(
        g.get_i64("huge"),
        Err(GgufError::OutOfRange { .. })
    ));
}

#[test]
fn fuzz_regression_empty_tensor_past_the_end() {
    // Found by cargo-fuzz (gguf_parse): 64-byte alignment puts the data section past the end of
    // a file whose only tensor is empty; viewing it must give an empty slice, not a panic.
    let mut f = header(3, 1, 1);
    kv_u32(&mut f, b"general.alignment", 64);
    tinfo(&mut f, b"x", &[0], 0, 0);
    f.extend([0u8; 23]);
    let g = parse(&f).unwrap();
    assert!(g.data_offset() > g.file_len());
    assert_eq!(g.tensor("x").unwrap().bytes, &[] as &[u8]);
    assert_eq!(g.tensors().count(), 1);
}
