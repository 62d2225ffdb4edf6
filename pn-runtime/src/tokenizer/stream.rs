//! Incremental decoding: token bytes arrive one token at a time, and a UTF-8 character may be
//! split across tokens (byte-level BPE cuts emoji and CJK into pieces). The decoder emits only
//! complete characters and holds back a trailing incomplete sequence until it completes.

/// Turns a stream of byte chunks into a stream of valid UTF-8 text.
///
/// Concatenating everything [`push`](Self::push) returns plus [`finish`](Self::finish) equals
/// `String::from_utf8_lossy` of all the bytes: bytes that can never become valid UTF-8 are
/// replaced by U+FFFD as soon as that is certain.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes` and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..valid])
                            .expect("prefix reported valid"),
                    );
                    match e.error_len() {
                        // Invalid for good: replace it, as a lossy decode of the whole would.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start = valid + n;
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Whether bytes of an incomplete character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Ends the stream: held-back bytes that never completed become U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_a_split_character() {
        let mut d = StreamDecoder::new();
        let euro = "€".as_bytes(); // E2 82 AC
        assert_eq!(d.push(b"a"), "a");
        assert_eq!(d.push(&euro[..1]), "");
        assert!(d.has_pending());
        assert_eq!(d.push(&euro[1..2]), "");
        assert_eq!(d.push(&euro[2..]), "€");
        assert!(!d.has_pending());
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[0xE2, 0x82]), "");
        // 'A' cannot continue the sequence: the two bytes are one invalid unit.
        assert_eq!(d.push(b"A"), "\u{FFFD}A");
        assert_eq!(d.push(&[0xFF, b'b']), "\u{FFFD}b");
        assert_eq!(d.push(&[0xF0, 0x9F]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
