//! The writer round-trips everything the reader reads (proptest over random metadata and
//! tensors), honours the alignment, and streams data.

use gguf_io::{
    write_gguf_to_vec, Array, GgmlType, GgufError, GgufFile, GgufWriter, MetadataEntry, TensorSpec,
    Value,
};
use proptest::collection::vec;
use proptest::prelude::*;

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        any::<f32>().prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::String),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        any::<f64>().prop_map(Value::F64),
    ]
}

fn flat_array() -> impl Strategy<Value = Array> {
    prop_oneof![
        vec(any::<u8>(), 0..8).prop_map(Array::U8),
        vec(any::<i8>(), 0..8).prop_map(Array::I8),
        vec(any::<u16>(), 0..8).prop_map(Array::U16),
        vec(any::<i16>(), 0..8).prop_map(Array::I16),
        vec(any::<u32>(), 0..8).prop_map(Array::U32),
        vec(any::<i32>(), 0..8).prop_map(Array::I32),
        vec(any::<f32>(), 0..8).prop_map(Array::F32),
        vec(any::<bool>(), 0..8).prop_map(Array::Bool),
        vec(".{0,6}", 0..8).prop_map(Array::String),
        vec(any::<u64>(), 0..8).prop_map(Array::U64),
        vec(any::<i64>(), 0..8).prop_map(Array::I64),
        vec(any::<f64>(), 0..8).prop_map(Array::F64),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => scalar(),
        2 => flat_array().prop_map(Value::Array),
        1 => vec(flat_array(), 0..3).prop_map(|v| Value::Array(Array::Array(v))),
    ]
}

const TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Q3K,
    GgmlType::I8,
    GgmlType::Pn3t,
    GgmlType::Pn4t,
];

/// (type, dims) with small sizes; data bytes are generated to fit.
fn tensor_shape() -> impl Strategy<Value = (GgmlType, Vec<u64>)> {
    (0..TYPES.len(), 1u64..3, vec(1u64..4, 0..4)).prop_map(|(t, blocks, rest)| {
        let ty = TYPES[t];
        let mut dims = vec![blocks * ty.block_size() as u64];
        dims.extend(rest);
        (ty, dims)
    })
}

#[derive(Debug)]
struct Case {
    meta: Vec<MetadataEntry>,
    tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        vec(value(), 0..8),
        vec(tensor_shape(), 0..6),
        prop_oneof![
            Just(None),
            Just(Some(1u32)),
            Just(Some(8)),
            Just(Some(64)),
            Just(Some(256))
        ],
        any::<u64>(),
    )
        .prop_map(|(values, shapes, align, seed)| {
            let mut meta: Vec<MetadataEntry> = values
                .into_iter()
                .enumerate()
                .map(|(i, v)| MetadataEntry::new(format!("k.{i}"), v))
                .collect();
            if let Some(a) = align {
                meta.push(MetadataEntry::new("general.alignment", Value::U32(a)));
            }
            let mut x = seed | 1;
            let tensors = shapes
                .into_iter()
                .enumerate()
                .map(|(i, (ty, dims))| {
                    let n = ty.row_bytes(dims[0]).unwrap() * dims[1..].iter().product::<u64>();
                    let bytes = (0..n)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        })
                        .collect();
                    (format!("t.{i}"), ty, dims, bytes)
                })
                .collect();
            Case { meta, tensors }
        })
}

fn write(c: &Case) -> Vec<u8> {
    let specs: Vec<TensorSpec<'_>> = c
        .tensors
        .iter()
        .map(|(n, t, d, b)| (n.as_str(), *t, d.as_slice(), b.as_slice()))
        .collect();
    write_gguf_to_vec(&c.meta, &specs).unwrap()
}

/// Equality that treats NaNs with equal bits as equal.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(x), Value::Array(y)) => same_array(x, y),
        _ => a == b,
    }
}

fn same_array(a: &Array, b: &Array) -> bool {
    match (a, b) {
        (Array::F32(x), Array::F32(y)) => x
            .iter()
            .map(|v| v.to_bits())
            .eq(y.iter().map(|v| v.to_bits())),
        (Array::F64(x), Array::F64(y)) => x
            .iter()
            .map(|v| v.to_bits())
            .eq(y.iter().map(|v| v.to_bits())),
        (Array::Array(x), Array::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_array(p, q))
        }
        _ => a == b,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn write_then_read_gives_back_everything(c in case()) {
        let bytes = write(&c);
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        prop_assert_eq!(f.version(), 3);
        prop_assert_eq!(f.metadata().len(), c.meta.len());
        for (got, want) in f.metadata().iter().zip(&c.meta) {
            prop_assert_eq!(&got.key, &want.key);
            prop_assert!(same_value(&got.value, &want.value), "{}: {:?} vs {:?}", want.key, got.value, want.value);
        }
        let align = f.alignment();
        prop_assert_eq!(f.data_offset() % align, 0);
        prop_assert_eq!(f.tensor_infos().len(), c.tensors.len());
        for (name, ty, dims, data) in &c.tensors {
            let t = f.tensor(name).unwrap();
            prop_assert_eq!(t.ty, *ty);
            prop_assert_eq!(t.dims, dims.as_slice());
            prop_assert_eq!(t.bytes, data.as_slice());
            prop_assert_eq!((t.bytes.as_ptr() as usize - f.as_bytes().as_ptr() as usize) as u64 % align, 0);
        }
        // Re-writing what was read gives the same bytes.
        let again = Case {
            meta: f.metadata().to_vec(),
            tensors: f.tensors().map(|t| (t.name.to_string(), t.ty, t.dims.to_vec(), t.bytes.to_vec())).collect(),
        };
        prop_assert_eq!(write(&again), bytes);
    }
}

#[test]
fn real_files_rewrite_byte_identically() {
    // gguf-py's writer and ours agree on the layout: reading the gguf-py file and writing it
    // back gives the same bytes.
    let path = pn_tests::data("real-gguf", "slices.gguf");
    let original = std::fs::read(&path).unwrap();
    let f = GgufFile::from_bytes(original.clone()).unwrap();
    let c = Case {
        meta: f.metadata().to_vec(),
        tensors: f
            .tensors()
            .map(|t| (t.name.to_string(), t.ty, t.dims.to_vec(), t.bytes.to_vec()))
            .collect(),
    };
    assert_eq!(write(&c), original);
}

#[test]
fn writer_enforces_order_sizes_and_keys() {
    let mut w = GgufWriter::new(std::io::Cursor::new(Vec::new()));
    w.add_metadata("a", Value::U32(1)).unwrap();
    assert!(matches!(
        w.add_metadata("a", Value::U32(2)),
        Err(GgufError::DuplicateKey { .. })
    ));
    assert!(matches!(
        w.add_metadata("general.alignment", Value::U32(48)),
        Err(GgufError::InvalidAlignment { .. })
    ));
    w.add_tensor_info("x", GgmlType::F32, &[4]).unwrap();
    w.add_tensor_info("y", GgmlType::Q4K, &[256]).unwrap();
    assert!(matches!(
        w.add_tensor_info("x", GgmlType::F32, &[4]),
        Err(GgufError::DuplicateTensor { .. })
    ));
    assert!(matches!(
        w.add_tensor_info("z", GgmlType::Q4K, &[100]),
        Err(GgufError::NotBlockMultiple { .. })
    ));
    assert!(matches!(
        w.write_tensor_data("x", &[0; 16]),
        Err(GgufError::Writer(_))
    ));
    w.write_header().unwrap();
    assert!(matches!(
        w.write_tensor_data("y", &[0; 144]),
        Err(GgufError::Writer(_))
    ));
    assert!(matches!(
        w.write_tensor_data("x", &[0; 15]),
        Err(GgufError::Writer(_))
    ));
    w.write_tensor_from_reader("x", &mut &[1u8; 16][..])
        .unwrap();
    let mut short = &[0u8; 10][..];
    assert!(matches!(
        w.write_tensor_from_reader("y", &mut short),
        Err(GgufError::Writer(_))
    ));
}

#[test]
fn unfinished_writer_is_an_error() {
    let mut w = GgufWriter::new(std::io::Cursor::new(Vec::new()));
    w.add_tensor_info("x", GgmlType::F32, &[4]).unwrap();
    w.write_header().unwrap();
    assert!(matches!(w.finish(), Err(GgufError::Writer(_))));
}

#[test]
fn skipped_tensors_leave_zeros_and_full_length() {
    let mut w = GgufWriter::new(std::io::Cursor::new(Vec::new()));
    w.add_tensor_info("a", GgmlType::F32, &[3]).unwrap();
    w.add_tensor_info("b", GgmlType::F32, &[5]).unwrap();
    w.add_tensor_info("c", GgmlType::F32, &[2]).unwrap();
    w.write_header().unwrap();
    w.skip_tensor_data("a").unwrap();
    w.write_tensor_data("b", &[7u8; 20]).unwrap();
    w.skip_tensor_data("c").unwrap();
    let bytes = w.finish().unwrap().into_inner();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.tensor("a").unwrap().bytes, &[0u8; 12]);
    assert_eq!(f.tensor("b").unwrap().bytes, &[7u8; 20]);
    assert_eq!(f.tensor("c").unwrap().bytes, &[0u8; 8]);
    assert_eq!(f.file_len(), f.data_offset() + 64 + 32);
}

/// A file borrowed from `'static` bytes (an embedded model) reads exactly as the same bytes
/// opened from disk, with its tensors in place (no copy).
#[test]
fn static_bytes_read_as_the_file() {
    let path = pn_tests::data("real-gguf", "slices.gguf");
    let bytes: &'static [u8] = Box::leak(std::fs::read(&path).unwrap().into_boxed_slice());
    let f = GgufFile::from_static(bytes).unwrap();
    let disk = GgufFile::open(&path).unwrap();
    assert_eq!(f.file_len(), disk.file_len());
    assert_eq!(f.metadata(), disk.metadata());
    assert_eq!(f.tensor_infos(), disk.tensor_infos());
    for (a, b) in f.tensors().zip(disk.tensors()) {
        assert_eq!(a.bytes, b.bytes, "{}", a.name);
        let range = bytes.as_ptr_range();
        assert!(
            range.contains(&a.bytes.as_ptr()) || a.bytes.is_empty(),
            "{}",
            a.name
        );
    }
    assert!(GgufFile::from_static(b"GGUF\x03\0\0\0").is_err());
}
