//! The GPT-2 byte-level alphabet: every byte has a printable stand-in character, so that BPE
//! vocabularies can be stored as text. Vocabulary strings are mapped back to bytes for decoding.

/// Bytes that stand for themselves: the printable Latin-1 characters except the soft hyphen.
fn is_self_mapped(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The stand-in character for every byte value.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    // Bytes that are not printable get code points 256, 257, ... in byte order.
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[b as usize] = if is_self_mapped(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("code points 256..324 are valid");
            next += 1;
            c
        };
    }
    table
}

/// Reverse lookup from stand-in character to byte; the alphabet spans code points 0..324.
pub(crate) struct ByteDecoder {
    by_char: Vec<Option<u8>>,
}

impl ByteDecoder {
    pub(crate) fn new() -> Self {
        let table = byte_to_char_table();
        let mut by_char = vec![None; 324];
        for (b, c) in table.iter().enumerate() {
            by_char[*c as usize] = Some(b as u8);
        }
        ByteDecoder { by_char }
    }

    /// The bytes a byte-level vocabulary string stands for, or `None` if it contains a character
    /// outside the alphabet (such a token is not byte-level text and decodes as its raw UTF-8).
    pub(crate) fn decode(&self, token: &str) -> Option<Vec<u8>> {
        token
            .chars()
            .map(|c| self.by_char.get(c as usize).copied().flatten())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection_over_bytes() {
        let table = byte_to_char_table();
        let mut seen = std::collections::HashSet::new();
        for c in table {
            assert!(seen.insert(c), "{c:?} used twice");
        }
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(table[b'A' as usize], 'A');
        let dec = ByteDecoder::new();
        let all: String = table.iter().collect();
        assert_eq!(dec.decode(&all).unwrap(), (0..=255u8).collect::<Vec<_>>());
        assert_eq!(dec.decode("a€"), None);
    }
}
