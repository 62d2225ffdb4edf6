//! Streaming GGUF v3 writer: the header is built in memory (it is small), tensor data is
//! streamed in record order with zero padding to the alignment, so a 12 GB model is never held
//! in memory.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::GgufError;
use crate::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use crate::types::GgmlType;
use crate::value::{Array, MetadataEntry, Value};

/// The version this writer produces.
pub const WRITE_VERSION: u32 = 3;

struct PendingTensor {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    n_bytes: u64,
    offset: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting metadata and tensor infos.
    Collecting,
    /// Header written; `next` is the index of the next tensor whose data is expected.
    Data { next: usize },
}

/// Writes a GGUF v3 file: add metadata and tensor infos, write the header, then each tensor's
/// data in the order the infos were added, then [`GgufWriter::finish`].
///
/// ```
/// use gguf_io::{GgmlType, GgufWriter, Value};
/// let mut w = GgufWriter::new(std::io::Cursor::new(Vec::new()));
/// w.add_metadata("general.architecture", Value::String("demo".into()))?;
/// w.add_tensor_info("x", GgmlType::F32, &[2])?;
/// w.write_header()?;
/// w.write_tensor_data("x", &[0u8; 8])?;
/// let bytes = w.finish()?.into_inner();
/// let f = gguf_io::GgufFile::from_bytes(bytes)?;
/// assert_eq!(f.tensor("x")?.bytes, &[0u8; 8]);
/// # Ok::<(), gguf_io::GgufError>(())
/// ```
pub struct GgufWriter<W: Write + Seek> {
    w: W,
    metadata: Vec<MetadataEntry>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
    alignment: u64,
    state: State,
    /// Stream position of the start of the data section.
    data_start: u64,
    /// Where the file must end once everything is written (may lie past the last byte actually
    /// written when tensors were skipped sparsely).
    end: u64,
    /// Position of the stream after the last real write.
    written_to: u64,
}

fn writer_err(msg: impl Into<String>) -> GgufError {
    GgufError::Writer(msg.into())
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

impl<W: Write + Seek> GgufWriter<W> {
    /// A writer that will write to `w`, starting at its current position.
    pub fn new(w: W) -> Self {
        GgufWriter {
            w,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            alignment: DEFAULT_ALIGNMENT,
            state: State::Collecting,
            data_start: 0,
            end: 0,
            written_to: 0,
        }
    }

    fn expect_collecting(&self, what: &str) -> Result<(), GgufError> {
        if self.state != State::Collecting {
            return Err(writer_err(format!("{what} after the header was written")));
        }
        Ok(())
    }

    /// Adds a metadata pair. `general.alignment` must be a UINT32 power of two and sets the
    /// alignment used for the data section.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> Result<(), GgufError> {
        self.expect_collecting("add_metadata")?;
        let key = key.into();
        if key.is_empty() {
            return Err(writer_err("empty metadata key"));
        }
        if self.keys.contains(&key) {
            return Err(GgufError::DuplicateKey { key });
        }
        if key == ALIGNMENT_KEY {
            match value {
                Value::U32(a) if a.is_power_of_two() => self.alignment = u64::from(a),
                ref other => {
                    return Err(GgufError::InvalidAlignment {
                        value: format!("{other:?}"),
                    })
                }
            }
        }
        self.keys.insert(key.clone());
        self.metadata.push(MetadataEntry { key, value });
        Ok(())
    }

    /// Declares a tensor; its data must later be written in declaration order.
    pub fn add_tensor_info(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
    ) -> Result<(), GgufError> {
        self.expect_collecting("add_tensor_info")?;
        let name = name.into();
        if self.names.contains(&name) {
            return Err(GgufError::DuplicateTensor { name });
        }
        if dims.len() > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims: dims.len() as u32,
            });
        }
        let overflow = || GgufError::SizeOverflow {
            tensor: name.clone(),
            dims: dims.to_vec(),
        };
        dims.iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(overflow)?;
        let ne0 = dims.first().copied().unwrap_or(1);
        let row = ty
            .row_bytes(ne0)
            .ok_or_else(|| GgufError::NotBlockMultiple {
                tensor: name.clone(),
                ty: ty.name(),
                ne0,
                block_size: ty.block_size(),
            })?;
        let n_bytes = dims
            .iter()
            .skip(1)
            .try_fold(row, |a, &d| a.checked_mul(d))
            .ok_or_else(overflow)?;
        self.names.insert(name.clone());
        self.tensors.push(PendingTensor {
            name,
            ty,
            dims: dims.to_vec(),
            n_bytes,
            offset: 0,
        });
        Ok(())
    }

    /// Writes magic, counts, metadata, tensor infos and the padding up to the data section.
    pub fn write_header(&mut self) -> Result<(), GgufError> {
        self.expect_collecting("write_header")?;
        // Assign offsets now that the alignment is final.
        let mut next = 0u64;
        for t in &mut self.tensors {
            t.offset = next;
            next = t
                .offset
                .checked_add(t.n_bytes)
                .and_then(|e| align_up(e, self.alignment))
                .ok_or_else(|| writer_err("total data size overflows u64"))?;
        }
        let data_len = next;

        let mut h = Vec::new();
        h.extend_from_slice(&GGUF_MAGIC);
        h.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for e in &self.metadata {
            put_str(&mut h, &e.key);
            h.extend_from_slice(&e.value.value_type().id().to_le_bytes());
            put_value(&mut h, &e.value);
        }
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        // Offsets are relative to where the GGUF starts in the stream.
        let base = self.w.stream_position()?;
        let header_len = h.len() as u64;
        let padded =
            align_up(header_len, self.alignment).ok_or_else(|| writer_err("header too large"))?;
        self.w.write_all(&h)?;
        // Stream the padding: alignments up to 2^31 are valid, so never build it in memory.
        std::io::copy(
            &mut std::io::repeat(0).take(padded - header_len),
            &mut self.w,
        )?;
        let data_start = base + padded;
        self.data_start = data_start;
        self.written_to = data_start;
        self.end = data_start
            .checked_add(data_len)
            .ok_or_else(|| writer_err("file size overflows u64"))?;
        self.state = State::Data { next: 0 };
        Ok(())
    }

    /// Checks that `name` is the next tensor due and returns its index.
    fn next_tensor(&mut self, name: &str) -> Result<usize, GgufError> {
        let State::Data { next } = self.state else {
            return Err(writer_err("tensor data before write_header"));
        };
        match self.tensors.get(next) {
            Some(t) if t.name == name => Ok(next),
            Some(t) => Err(writer_err(format!(
                "expected data of tensor {:?}, got {name:?}",
                t.name
            ))),
            None => Err(writer_err(format!(
                "tensor {name:?}: all tensors already written"
            ))),
        }
    }

    fn padding_after(&self, i: usize) -> u64 {
        let t = &self.tensors[i];
        let end = t.offset + t.n_bytes;
        // Cannot overflow: checked in write_header.
        align_up(end, self.alignment).unwrap_or(end) - end
    }

    fn write_padding(&mut self, i: usize) -> Result<(), GgufError> {
        let pad = self.padding_after(i);
        if pad <= 256 {
            self.w.write_all(&[0u8; 256][..pad as usize])?;
        } else {
            std::io::copy(&mut std::io::repeat(0).take(pad), &mut self.w)?;
        }
        Ok(())
    }

    fn sync_position(&mut self, i: usize) -> Result<(), GgufError> {
        let want = self.data_start + self.tensors[i].offset;
        if self.written_to != want {
            // The previous tensor was skipped sparsely: seek to this tensor's start.
            self.w.seek(SeekFrom::Start(want))?;
            self.written_to = want;
        }
        Ok(())
    }

    /// Writes the data of tensor `name`, which must be the next one declared and exactly its
    /// size, followed by padding.
    pub fn write_tensor_data(&mut self, name: &str, bytes: &[u8]) -> Result<(), GgufError> {
        let i = self.next_tensor(name)?;
        if bytes.len() as u64 != self.tensors[i].n_bytes {
            return Err(writer_err(format!(
                "tensor {name:?}: got {} bytes, its type and dims need {}",
                bytes.len(),
                self.tensors[i].n_bytes
            )));
        }
        self.sync_position(i)?;
        self.w.write_all(bytes)?;
        self.write_padding(i)?;
        self.advance(i);
        Ok(())
    }

    /// Streams the data of tensor `name` from `r` (exactly its size is read), then pads.
    pub fn write_tensor_from_reader(
        &mut self,
        name: &str,
        r: &mut impl Read,
    ) -> Result<(), GgufError> {
        let i = self.next_tensor(name)?;
        let n = self.tensors[i].n_bytes;
        self.sync_position(i)?;
        let copied = std::io::copy(&mut r.take(n), &mut self.w)?;
        if copied != n {
            return Err(writer_err(format!(
                "tensor {name:?}: reader gave {copied} of {n} bytes"
            )));
        }
        self.write_padding(i)?;
        self.advance(i);
        Ok(())
    }

    /// Leaves the data of tensor `name` unwritten: the writer seeks past it, so on a file system
    /// with sparse files it takes no space and reads back as zeros. Meant for size tests.
    pub fn skip_tensor_data(&mut self, name: &str) -> Result<(), GgufError> {
        let i = self.next_tensor(name)?;
        self.state = State::Data { next: i + 1 };
        Ok(())
    }

    fn advance(&mut self, i: usize) {
        let t = &self.tensors[i];
        self.written_to = self.data_start + t.offset + t.n_bytes + self.padding_after(i);
        self.state = State::Data { next: i + 1 };
    }

    /// Checks that every tensor was written, makes the stream exactly as long as the file must
    /// be, flushes, and returns the inner writer.
    pub fn finish(mut self) -> Result<W, GgufError> {
        match self.state {
            State::Collecting => self.write_header()?,
            State::Data { .. } => {}
        }
        let State::Data { next } = self.state else {
            unreachable!("write_header sets the Data state")
        };
        if next != self.tensors.len() {
            return Err(writer_err(format!(
                "finish: tensor {:?} and {} more were not written",
                self.tensors[next].name,
                self.tensors.len() - next - 1
            )));
        }
        if self.written_to < self.end {
            // Trailing tensors were skipped: write the last byte so the file has its full length.
            self.w.seek(SeekFrom::Start(self.end - 1))?;
            self.w.write_all(&[0])?;
        }
        self.w.flush()?;
        Ok(self.w)
    }
}

fn put_str(h: &mut Vec<u8>, s: &str) {
    h.extend_from_slice(&(s.len() as u64).to_le_bytes());
    h.extend_from_slice(s.as_bytes());
}

fn put_value(h: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => h.push(*x),
        Value::I8(x) => h.push(*x as u8),
        Value::U16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => h.push(u8::from(*x)),
        Value::String(s) => put_str(h, s),
        Value::Array(a) => put_array(h, a),
        Value::U64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => h.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => h.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(h: &mut Vec<u8>, a: &Array) {
    h.extend_from_slice(&a.element_type().id().to_le_bytes());
    h.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                h.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => h.extend_from_slice(v),
        Array::I8(v) => h.extend(v.iter().map(|&x| x as u8)),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::Bool(v) => h.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(h, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(h, inner)),
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F64(v) => le!(v),
    }
}

/// One tensor for [`write_gguf`]: name, type, dims (GGUF order) and bytes.
pub type TensorSpec<'a> = (&'a str, GgmlType, &'a [u64], &'a [u8]);

/// Writes a whole GGUF v3 to `w` in one call (tests and small files).
pub fn write_gguf_to<W: Write + Seek>(
    w: W,
    metadata: &[MetadataEntry],
    tensors: &[TensorSpec<'_>],
) -> Result<W, GgufError> {
    let mut g = GgufWriter::new(w);
    for e in metadata {
        g.add_metadata(e.key.clone(), e.value.clone())?;
    }
    for &(name, ty, dims, _) in tensors {
        g.add_tensor_info(name, ty, dims)?;
    }
    g.write_header()?;
    for &(name, _, _, bytes) in tensors {
        g.write_tensor_data(name, bytes)?;
    }
    g.finish()
}

/// Writes a whole GGUF v3 into memory.
pub fn write_gguf_to_vec(
    metadata: &[MetadataEntry],
    tensors: &[TensorSpec<'_>],
) -> Result<Vec<u8>, GgufError> {
    Ok(write_gguf_to(std::io::Cursor::new(Vec::new()), metadata, tensors)?.into_inner())
}

/// Writes a whole GGUF v3 file at `path` (tests and small files).
pub fn write_gguf(
    path: impl AsRef<Path>,
    metadata: &[MetadataEntry],
    tensors: &[TensorSpec<'_>],
) -> Result<(), GgufError> {
    let file = std::fs::File::create(path.as_ref())?;
    let w = write_gguf_to(std::io::BufWriter::new(file), metadata, tensors)?;
    w.into_inner().map_err(|e| GgufError::Io(e.into_error()))?;
    Ok(())
}
