//! A bounds-checked little-endian reader over the header bytes of a GGUF file.
//!
//! Every read checks the remaining length first, so a hostile length or count turns into a
//! `Truncated` or `CountTooLarge` error before anything is allocated.

use crate::error::GgufError;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    /// Moves to absolute offset `pos` (at most the buffer length).
    pub(crate) fn seek(&mut self, pos: usize) {
        self.pos = pos.min(self.buf.len());
    }

    pub(crate) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn truncated(&self, what: &'static str, needed: u64) -> GgufError {
        GgufError::Truncated {
            what,
            offset: self.pos as u64,
            needed,
            file_len: self.buf.len() as u64,
        }
    }

    /// The next `n` bytes, advancing past them.
    pub(crate) fn bytes(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        // n <= remaining <= usize::MAX, so the cast is lossless.
        let n = n as usize;
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let b = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads a count field and checks that `count` items of at least `min_item` bytes each fit
    /// in the rest of the file.
    pub(crate) fn count(&mut self, what: &'static str, min_item: u64) -> Result<u64, GgufError> {
        let offset = self.pos();
        let count = self.u64(what)?;
        let remaining = self.remaining();
        let fits = count
            .checked_mul(min_item.max(1))
            .is_some_and(|need| need <= remaining);
        if !fits {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                offset,
                remaining,
            });
        }
        Ok(count)
    }

    /// Skips `count` GGUF strings if they are all well-formed, in a tight loop (a vocabulary
    /// has hundreds of thousands). Returns `false`, without moving, at the first problem, so the
    /// caller can re-read them one by one for a precise error.
    pub(crate) fn skip_strings(&mut self, count: u64) -> bool {
        let buf = self.buf;
        let mut pos = self.pos;
        for _ in 0..count {
            let Some(len_bytes) = buf.get(pos..pos + 8) else {
                return false;
            };
            let mut a = [0u8; 8];
            a.copy_from_slice(len_bytes);
            let len = u64::from_le_bytes(a);
            let start = pos + 8;
            if len > (buf.len() - start) as u64 {
                return false;
            }
            let end = start + len as usize;
            let bytes = &buf[start..end];
            if !bytes.is_ascii() && std::str::from_utf8(bytes).is_err() {
                return false;
            }
            pos = end;
        }
        self.pos = pos;
        true
    }

    /// A GGUF string: u64 length then UTF-8 bytes.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<&'a str, GgufError> {
        let len_offset = self.pos();
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(GgufError::Truncated {
                what,
                offset: len_offset,
                needed: len.saturating_add(8),
                file_len: self.buf.len() as u64,
            });
        }
        let start = self.pos();
        let bytes = self.bytes(len, what)?;
        std::str::from_utf8(bytes).map_err(|e| GgufError::InvalidUtf8 {
            what,
            offset: start + e.valid_up_to() as u64,
        })
    }
}

/// A capacity hint for a vector of `count` `T`s that never asks for more bytes than the file
/// has left: the vector grows by pushing if the data really is there.
pub(crate) fn bounded_capacity<T>(count: u64, remaining: u64) -> usize {
    let per = std::mem::size_of::<T>().max(1) as u64;
    count.min(remaining / per) as usize
}
