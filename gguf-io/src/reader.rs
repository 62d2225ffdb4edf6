//! Opening a GGUF file: memory-map it, parse and validate the header, hand out tensor bytes in
//! place.

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use crate::cursor::{bounded_capacity, Cursor};
use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::{Array, MetadataEntry, Value, ValueType};

/// `GGUF` as the first four bytes of a file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest array nesting the reader accepts (the spec allows nesting; model files never nest,
/// and the limit keeps hostile files from exhausting the stack).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Smallest possible metadata pair: empty-length key (8), value type (4), one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest possible tensor-info record: name length (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// One tensor-info record, validated against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (unique within the file).
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in GGUF order: `dims[0]` is the contiguous row length (ne0).
    pub dims: Vec<u64>,
    /// Offset of the first byte relative to the start of the data section.
    pub offset: u64,
    /// Size of the tensor data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Total number of elements (the product of `dims`; 1 for zero dimensions).
    pub fn n_elements(&self) -> u64 {
        // Checked during parsing, so the product cannot overflow here.
        self.dims.iter().product()
    }
}

/// A tensor's data in place, borrowed from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorView<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in GGUF order (fastest first).
    pub dims: &'a [u64],
    /// The tensor's bytes, exactly `n_bytes` long.
    pub bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Elements per row (`dims[0]`, or 1 for a zero-dimensional tensor).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of all dimensions but the first).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Total number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        // Validated at parse time: ne0 is a whole number of blocks and the size fits the file.
        self.ty.row_bytes(self.row_len()).unwrap_or(0) as usize
    }

    /// The bytes of row `i`, or `None` past the last row.
    pub fn row(&self, i: usize) -> Option<&'a [u8]> {
        let rb = self.row_bytes();
        let start = i.checked_mul(rb)?;
        self.bytes.get(start..start.checked_add(rb)?)
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
    /// Bytes that live as long as the program (a model embedded with `include_bytes!`).
    Static(&'static [u8]),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
            Backing::Static(s) => s,
        }
    }
}

/// An open GGUF file: parsed header, metadata and tensor table over a memory map (or an owned
/// buffer). Tensor data is never read until asked for.
pub struct GgufFile {
    backing: Backing,
    header: Header,
    /// A file map's registration for the SIGBUS report (see [`crate::mapwatch`]).
    watch: Option<crate::mapwatch::MapWatch>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("alignment", &self.header.alignment)
            .field("data_offset", &self.header.data_offset)
            .field("n_metadata", &self.header.raw_meta.len())
            .field("n_tensors", &self.header.tensors.len())
            .finish()
    }
}

/// A metadata pair as found at open: scalars are decoded, arrays are validated and their
/// position kept, to be decoded on first access (a vocabulary of 750k strings would otherwise
/// dominate the time to open a model).
struct RawEntry {
    key: String,
    value: RawValue,
}

enum RawValue {
    Ready(Value),
    /// An array whose element-type field starts at this absolute offset.
    ArrayAt(usize),
}

/// Everything parsed from the bytes before the data section.
struct Header {
    version: u32,
    alignment: u64,
    data_offset: u64,
    raw_meta: Vec<RawEntry>,
    /// Decoded on first access by [`GgufFile::metadata`].
    metadata: OnceLock<Vec<MetadataEntry>>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`. Only the header pages are touched.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let open_err = |source| GgufError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        if len == 0 {
            // Mapping an empty file fails on some platforms; parse an empty buffer instead so
            // the error is the same as for any other truncated file.
            return GgufFile::from_bytes(Vec::new());
        }
        // SAFETY: the map is read-only. Like every mmap-based reader we rely on the file not
        // being truncated or rewritten by another process while it is open (a truncation is
        // reported by the SIGBUS handler of crate::mapwatch, once installed); the header is
        // validated once, after which only bounds-checked slices of the map are handed out.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(open_err)?;
        let watch = crate::mapwatch::MapWatch::new(&map, &file, path);
        let header = parse(&map)?;
        Ok(GgufFile {
            backing: Backing::Mmap(map),
            header,
            watch: Some(watch),
        })
    }

    /// Reads the whole file at `path` into memory (llama.cpp's `--no-mmap`): nothing done to
    /// the file afterwards (truncation, rewriting) changes what was read. The buffer is an
    /// anonymous page-aligned map, so tensors keep the file's alignment as with
    /// [`GgufFile::open`]. Same checks as [`GgufFile::open`].
    pub fn read(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        use std::io::Read;
        let path = path.as_ref();
        let open_err = |source| GgufError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        if len == 0 {
            return GgufFile::from_bytes(Vec::new());
        }
        let len = usize::try_from(len).map_err(|_| {
            open_err(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                "the file does not fit the address space",
            ))
        })?;
        let mut buf = memmap2::MmapMut::map_anon(len).map_err(open_err)?;
        file.read_exact(&mut buf).map_err(open_err)?;
        let map = buf.make_read_only().map_err(open_err)?;
        let header = parse(&map)?;
        Ok(GgufFile {
            backing: Backing::Mmap(map),
            header,
            watch: None,
        })
    }

    /// `Some(reason)` when the mapped file was changed on disk since it was opened (length or
    /// modification time; see [`MapWatch::changed`](crate::mapwatch::MapWatch::changed)): its
    /// bytes may no longer be the ones validated. Always `None` for a file read into memory.
    pub fn changed_on_disk(&self) -> Option<String> {
        self.watch.as_ref()?.changed()
    }

    /// Parses a GGUF held in memory, with the same checks as [`GgufFile::open`].
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let header = parse(&bytes)?;
        Ok(GgufFile {
            backing: Backing::Owned(bytes),
            header,
            watch: None,
        })
    }

    /// Parses a GGUF that lives as long as the program, such as a model embedded in the
    /// executable with `include_bytes!`, without copying it: tensors are borrowed in place as
    /// from a memory map. Same checks as [`GgufFile::open`].
    ///
    /// Tensor data is handed out at its offset from the start of `bytes`, so the backends that
    /// read it as `f32`/`f16` words need `bytes` to start on a boundary at least as strict as
    /// the file's alignment: embed it in a `#[repr(C, align(64))]` wrapper.
    pub fn from_static(bytes: &'static [u8]) -> Result<GgufFile, GgufError> {
        let header = parse(bytes)?;
        Ok(GgufFile {
            backing: Backing::Static(bytes),
            header,
            watch: None,
        })
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// Alignment of the data section and of every tensor's offset.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute file offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// The whole file.
    pub fn as_bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// All metadata pairs in file order. Arrays are decoded on the first call (they were
    /// validated when the file was opened).
    pub fn metadata(&self) -> &[MetadataEntry] {
        self.header.metadata.get_or_init(|| {
            let bytes = self.backing.bytes();
            self.header
                .raw_meta
                .iter()
                .map(|e| {
                    let value = match &e.value {
                        RawValue::Ready(v) => v.clone(),
                        RawValue::ArrayAt(off) => {
                            let mut c = Cursor::new(bytes);
                            c.seek(*off);
                            // Same bytes, same grammar as the validating pass at open: this
                            // cannot fail unless the mapped file was changed underneath us.
                            Value::Array(
                                read_array(&mut c, &e.key, 1, true)
                                    .expect("metadata array changed after it was validated"),
                            )
                        }
                    };
                    MetadataEntry {
                        key: e.key.clone(),
                        value,
                    }
                })
                .collect()
        })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let i = *self.header.key_index.get(key)?;
        if let RawValue::Ready(v) = &self.header.raw_meta[i].value {
            // Scalars need no decoding: don't force the arrays.
            return Some(v);
        }
        Some(&self.metadata()[i].value)
    }

    /// All tensor-info records in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor-info record of `name`, if present.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.header
            .tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The tensor `name` with its bytes borrowed in place.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::TensorNotFound {
                name: name.to_string(),
            })?;
        Ok(self.view(info))
    }

    /// Views of all tensors in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> + '_ {
        self.header.tensors.iter().map(|info| self.view(info))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // Bounds were checked at parse time: data_offset + offset + n_bytes <= file length for
        // every tensor with data. An empty tensor may sit past the end (a file with only empty
        // tensors can end before its aligned data section), so it gets an empty slice.
        let bytes = if info.n_bytes == 0 {
            &[][..]
        } else {
            let start = (self.header.data_offset + info.offset) as usize;
            &self.backing.bytes()[start..start + info.n_bytes as usize]
        };
        TensorView {
            name: &info.name,
            ty: info.ty,
            dims: &info.dims,
            bytes,
        }
    }
}

fn parse(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor::new(buf);

    let magic_len = buf.len().min(4);
    if buf[..magic_len] != GGUF_MAGIC[..magic_len] {
        return Err(GgufError::BadMagic {
            found: buf[..magic_len].to_vec(),
        });
    }
    c.bytes(4, "magic")?;

    let version = c.u32("version")?;
    if version != 0 && version & 0xFFFF == 0 {
        return Err(GgufError::BigEndian { raw: version });
    }
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }

    let n_tensors_offset = c.pos();
    let n_tensors_raw = c.u64("tensor count")?;
    let n_kv = c.count("metadata pair", MIN_KV_BYTES)?;
    // The tensor count is checked after the metadata, against what is left then; check it
    // loosely here already so a file claiming 2^60 tensors fails before parsing metadata.
    check_count(
        "tensor",
        n_tensors_raw,
        MIN_TENSOR_INFO_BYTES,
        n_tensors_offset,
        c.remaining(),
    )?;

    let mut raw_meta = Vec::with_capacity(bounded_capacity::<RawEntry>(n_kv, c.remaining()));
    // The index grows with the entries actually read (no capacity taken from the file).
    let mut key_index = HashMap::new();
    for _ in 0..n_kv {
        let key_offset = c.pos();
        let key = c.string("metadata key")?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { offset: key_offset });
        }
        if key_index.contains_key(key) {
            return Err(GgufError::DuplicateKey {
                key: key.to_string(),
            });
        }
        let type_offset = c.pos();
        let type_id = c.u32("metadata value type")?;
        let vt = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_string(),
            type_id,
            offset: type_offset,
        })?;
        let value = if vt == ValueType::Array {
            let at = c.pos() as usize;
            // Validate now (counts, UTF-8, bools, nesting) without allocating the elements.
            read_array(&mut c, key, 1, false)?;
            RawValue::ArrayAt(at)
        } else {
            RawValue::Ready(read_value(&mut c, key, vt, 0)?)
        };
        key_index.insert(key.to_string(), raw_meta.len());
        raw_meta.push(RawEntry {
            key: key.to_string(),
            value,
        });
    }

    let alignment = match key_index.get(ALIGNMENT_KEY).map(|&i| &raw_meta[i].value) {
        None => DEFAULT_ALIGNMENT,
        Some(RawValue::Ready(Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some(RawValue::Ready(other)) => {
            return Err(GgufError::InvalidAlignment {
                value: format!("{other:?}"),
            })
        }
        Some(RawValue::ArrayAt(_)) => {
            return Err(GgufError::InvalidAlignment {
                value: "an array".to_string(),
            })
        }
    };

    let n_tensors = check_count(
        "tensor",
        n_tensors_raw,
        MIN_TENSOR_INFO_BYTES,
        n_tensors_offset,
        c.remaining(),
    )?;
    let mut tensors = Vec::with_capacity(bounded_capacity::<TensorInfo>(n_tensors, c.remaining()));
    let mut tensor_index = HashMap::new();
    for _ in 0..n_tensors {
        let info = read_tensor_info(&mut c)?;
        if tensor_index.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        tensor_index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }

    let end_of_infos = c.pos();
    // end_of_infos <= file length < 2^63 and alignment <= 2^31, so this cannot overflow.
    let data_offset = end_of_infos.div_ceil(alignment) * alignment;
    let data_len = (buf.len() as u64).saturating_sub(data_offset);
    check_tensor_ranges(&tensors, alignment, data_len)?;

    Ok(Header {
        version,
        alignment,
        data_offset,
        raw_meta,
        metadata: OnceLock::new(),
        key_index,
        tensors,
        tensor_index,
    })
}

fn check_count(
    what: &'static str,
    count: u64,
    min_item: u64,
    offset: u64,
    remaining: u64,
) -> Result<u64, GgufError> {
    match count.checked_mul(min_item) {
        Some(need) if need <= remaining => Ok(count),
        _ => Err(GgufError::CountTooLarge {
            what,
            count,
            offset,
            remaining,
        }),
    }
}

fn read_value(
    c: &mut Cursor<'_>,
    key: &str,
    vt: ValueType,
    depth: usize,
) -> Result<Value, GgufError> {
    Ok(match vt {
        ValueType::U8 => Value::U8(c.u8("UINT8 value")?),
        ValueType::I8 => Value::I8(c.u8("INT8 value")? as i8),
        ValueType::U16 => Value::U16(c.u16("UINT16 value")?),
        ValueType::I16 => Value::I16(c.u16("INT16 value")? as i16),
        ValueType::U32 => Value::U32(c.u32("UINT32 value")?),
        ValueType::I32 => Value::I32(c.u32("INT32 value")? as i32),
        ValueType::F32 => Value::F32(f32::from_bits(c.u32("FLOAT32 value")?)),
        ValueType::U64 => Value::U64(c.u64("UINT64 value")?),
        ValueType::I64 => Value::I64(c.u64("INT64 value")? as i64),
        ValueType::F64 => Value::F64(f64::from_bits(c.u64("FLOAT64 value")?)),
        ValueType::Bool => Value::Bool(read_bool(c, key)?),
        ValueType::String => Value::String(c.string("string value")?.to_string()),
        ValueType::Array => Value::Array(read_array(c, key, depth + 1, true)?),
    })
}

fn read_bool(c: &mut Cursor<'_>, key: &str) -> Result<bool, GgufError> {
    let offset = c.pos();
    match c.u8("BOOL value")? {
        0 => Ok(false),
        1 => Ok(true),
        byte => Err(GgufError::InvalidBool {
            key: key.to_string(),
            byte,
            offset,
        }),
    }
}

/// Reads `count` fixed-size little-endian values of `N` bytes each.
fn read_fixed<T, const N: usize>(
    c: &mut Cursor<'_>,
    count: u64,
    what: &'static str,
    build: bool,
    conv: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    // count * N <= remaining was checked by `Cursor::count`, so this cannot overflow.
    let bytes = c.bytes(count * N as u64, what)?;
    if !build {
        return Ok(Vec::new());
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|ch| {
            let mut a = [0u8; N];
            a.copy_from_slice(ch);
            conv(a)
        })
        .collect())
}

/// Reads (or with `build == false` only validates, returning an empty array of the right type)
/// an array value whose element-type field is next.
fn read_array(
    c: &mut Cursor<'_>,
    key: &str,
    depth: usize,
    build: bool,
) -> Result<Array, GgufError> {
    let header_offset = c.pos();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            max: MAX_ARRAY_DEPTH,
            offset: header_offset,
        });
    }
    let type_id = c.u32("array element type")?;
    let et = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_string(),
        type_id,
        offset: header_offset,
    })?;
    let count = c.count("array element", et.min_encoded_size())?;
    Ok(match et {
        ValueType::U8 => Array::U8(read_fixed(c, count, "UINT8 array", build, |[b]| b)?),
        ValueType::I8 => Array::I8(read_fixed(c, count, "INT8 array", build, |[b]| b as i8)?),
        ValueType::U16 => Array::U16(read_fixed(
            c,
            count,
            "UINT16 array",
            build,
            u16::from_le_bytes,
        )?),
        ValueType::I16 => Array::I16(read_fixed(
            c,
            count,
            "INT16 array",
            build,
            i16::from_le_bytes,
        )?),
        ValueType::U32 => Array::U32(read_fixed(
            c,
            count,
            "UINT32 array",
            build,
            u32::from_le_bytes,
        )?),
        ValueType::I32 => Array::I32(read_fixed(
            c,
            count,
            "INT32 array",
            build,
            i32::from_le_bytes,
        )?),
        ValueType::F32 => Array::F32(read_fixed(
            c,
            count,
            "FLOAT32 array",
            build,
            f32::from_le_bytes,
        )?),
        ValueType::U64 => Array::U64(read_fixed(
            c,
            count,
            "UINT64 array",
            build,
            u64::from_le_bytes,
        )?),
        ValueType::I64 => Array::I64(read_fixed(
            c,
            count,
            "INT64 array",
            build,
            i64::from_le_bytes,
        )?),
        ValueType::F64 => Array::F64(read_fixed(
            c,
            count,
            "FLOAT64 array",
            build,
            f64::from_le_bytes,
        )?),
        ValueType::Bool => {
            let mut v = Vec::with_capacity(if build {
                bounded_capacity::<bool>(count, c.remaining())
            } else {
                0
            });
            for _ in 0..count {
                let b = read_bool(c, key)?;
                if build {
                    v.push(b);
                }
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(if build {
                bounded_capacity::<String>(count, c.remaining())
            } else {
                0
            });
            if !build && c.skip_strings(count) {
                return Ok(Array::String(v));
            }
            for _ in 0..count {
                let s = c.string("string array element")?;
                if build {
                    v.push(s.to_string());
                }
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(if build {
                bounded_capacity::<Array>(count, c.remaining())
            } else {
                0
            });
            for _ in 0..count {
                let a = read_array(c, key, depth + 1, build)?;
                if build {
                    v.push(a);
                }
            }
            Array::Array(v)
        }
    })
}

fn read_tensor_info(c: &mut Cursor<'_>) -> Result<TensorInfo, GgufError> {
    let name = c.string("tensor name")?.to_string();
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            n_dims,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownType {
        tensor: name.clone(),
        id: type_id,
    })?;
    let offset = c.u64("tensor offset")?;

    let ne0 = dims.first().copied().unwrap_or(1);
    let overflow = || GgufError::SizeOverflow {
        tensor: name.clone(),
        dims: dims.clone(),
    };
    // The element count must fit even though only the byte size is used: ggml rejects the
    // same files, and n_elements() relies on it.
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    if ne0 % ty.block_size() as u64 != 0 {
        return Err(GgufError::NotBlockMultiple {
            tensor: name,
            ty: ty.name(),
            ne0,
            block_size: ty.block_size(),
        });
    }
    let row_bytes = ty.row_bytes(ne0).ok_or_else(overflow)?;
    let n_bytes = dims
        .iter()
        .skip(1)
        .try_fold(row_bytes, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    Ok(TensorInfo {
        name,
        ty,
        dims,
        offset,
        n_bytes,
    })
}

fn check_tensor_ranges(
    tensors: &[TensorInfo],
    alignment: u64,
    data_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedOffset {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let in_bounds = t
            .offset
            .checked_add(t.n_bytes)
            .is_some_and(|end| end <= data_len);
        if !in_bounds {
            return Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                offset: t.offset,
                n_bytes: t.n_bytes,
                data_len,
            });
        }
    }
    // Empty tensors occupy no bytes and cannot overlap anything.
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::TensorOverlap {
                tensor: b.name.clone(),
                other: a.name.clone(),
            });
        }
    }
    Ok(())
}
