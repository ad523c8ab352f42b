//! GPT-2's byte ↔ unicode map (`bytes_to_unicode` in openai/gpt-2 `encoder.py`, HF
//! `tokenizers` `byte_level.rs`): printable bytes `!`..`~`, `¡`..`¬`, `®`..`ÿ` map to the
//! code point of the same value; the other 68 bytes map, in increasing order, to
//! U+0100, U+0101, ... (so space → `Ġ` U+0120, `\n` → `Ċ` U+010A).

/// `BYTE_TO_CHAR[b]` is the character byte `b` is written as in vocabulary strings.
pub const BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

const fn is_printable(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_byte_to_char() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if is_printable(b as u8) {
            b as u32
        } else {
            n += 1;
            255 + n
        };
        // All values are < 0x200, far from the surrogate range.
        out[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => panic!("byte-level map out of range"),
        };
        b += 1;
    }
    out
}

/// The non-printable bytes in increasing order: byte `NON_PRINTABLE[n]` maps to `256 + n`.
const NON_PRINTABLE: [u8; 68] = build_non_printable();

const fn build_non_printable() -> [u8; 68] {
    let mut out = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        if !is_printable(b as u8) {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    out
}

/// The byte a vocabulary character stands for, or `None` for characters outside the
/// 256-character alphabet.
#[inline]
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 {
        is_printable(cp as u8).then_some(cp as u8)
    } else {
        NON_PRINTABLE.get(cp as usize - 256).copied()
    }
}

/// Appends the byte-level spelling of `bytes` to `out`.
pub fn encode_into(bytes: &[u8], out: &mut String) {
    out.extend(bytes.iter().map(|&b| BYTE_TO_CHAR[b as usize]));
}

/// The bytes a token string stands for under HF's ByteLevel decoder: every character
/// mapped back through the alphabet, or -- if any character is outside it (added tokens
/// such as `〈|EOS|〉`) -- the token's own UTF-8 bytes.
pub fn decode_token(token: &str) -> Vec<u8> {
    token
        .chars()
        .map(char_to_byte)
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_points() {
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[0], 'Ā');
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a');
        assert_eq!(BYTE_TO_CHAR[0xAD], 'Ń');
        assert_eq!(BYTE_TO_CHAR[0xFF], 'ÿ');
    }

    #[test]
    fn bijective() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = BYTE_TO_CHAR[b as usize];
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(char_to_byte('〈'), None);
        assert_eq!(char_to_byte(char::from_u32(256 + 68).unwrap()), None);
    }

    #[test]
    fn decode_falls_back_to_raw() {
        assert_eq!(decode_token("ĠhelloĊ"), b" hello\n");
        assert_eq!(decode_token("〈|EOS|〉"), "〈|EOS|〉".as_bytes());
        assert_eq!(decode_token("a b"), b"a b"); // ' ' is not in the alphabet
    }
}
