//! The GPT-2 byte-to-unicode mapping that "byte-level" BPE vocabularies are written in.
//!
//! Byte-level BPE works on bytes, but tokenizer.json stores its vocabulary and merges as text. To
//! make every byte a printable character, GPT-2 (openai/gpt-2 `encoder.py`, `bytes_to_unicode`)
//! maps the 188 bytes that are already printable Latin-1 characters (`!`..`~`, `¡`..`¬`, `®`..`ÿ`)
//! to themselves and the other 68 (controls, space, DEL, NBSP, soft hyphen) to U+0100 and up, in
//! byte order. So the space byte 0x20 becomes `Ġ` (U+0120) and `\n` becomes `Ċ` (U+010A): the
//! token `Ġworld` in tokenizer.json is the bytes of " world".
//!
//! The exporter undoes this mapping once, so the tokenizer file and the runtime only see bytes.

/// Whether byte `b` is one of the printable bytes GPT-2 maps to the character of the same value.
fn maps_to_itself(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The character that stands for byte `b` in a byte-level vocabulary.
pub fn byte_to_char(b: u8) -> char {
    if maps_to_itself(b) {
        return char::from(b);
    }
    // The n-th byte (in byte order) that is not printable maps to U+0100 + n.
    let n = (0..b).filter(|&x| !maps_to_itself(x)).count() as u32;
    char::from_u32(0x100 + n).expect("U+0100..U+0143 are valid characters")
}

/// The byte a byte-level character stands for, or `None` for a character outside the alphabet.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 {
        let b = cp as u8;
        return maps_to_itself(b).then_some(b);
    }
    // U+0100 + n is the n-th non-printable byte.
    let n = cp.checked_sub(0x100)?;
    (0..=255u8).filter(|&x| !maps_to_itself(x)).nth(n as usize)
}

/// The bytes a byte-level token string stands for, or `None` if a character is outside the
/// alphabet (then the string is not byte-level text).
pub fn decode_str(s: &str) -> Option<Vec<u8>> {
    s.chars().map(char_to_byte).collect()
}

/// The byte-level text of `bytes` (one character per byte), as tokenizer.json writes tokens.
pub fn encode_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_characters() {
        // Values from GPT-2's bytes_to_unicode: space -> U+0120 'Ġ', '\n' -> U+010A 'Ċ',
        // 0x00 -> U+0100 'Ā', 0xAD (soft hyphen) -> U+0143 'Ń', 'a' -> 'a', 0xE9 -> 'é'.
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xE9), 'é');
    }

    #[test]
    fn mapping_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte('世'), None);
    }
}
