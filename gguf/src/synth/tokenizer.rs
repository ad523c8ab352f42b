//! A small valid GPT-2-style byte-level BPE vocabulary of any size (spec/laguna.md §7.1),
//! so llama.cpp and lagoon load the model and can tokenise any text (byte by byte: there
//! are no merges). Special ids are Laguna's: 0 `<unk>`, 2 `〈|EOS|〉` (BOS and EOS), 9 pad,
//! 24 `</assistant>` (EOT).

/// Reserved special ids, then the 256 byte tokens.
pub const N_SPECIAL: usize = 32;
/// The smallest vocabulary: the specials and one token per byte.
pub const MIN_VOCAB: usize = N_SPECIAL + 256;

pub const UNK: u32 = 0;
pub const BOS: u32 = 2;
pub const EOS: u32 = 2;
pub const PAD: u32 = 9;
pub const EOT: u32 = 24;

/// llama.cpp `LLAMA_TOKEN_TYPE_*`.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes map to themselves, the others to
/// U+0100 upwards in byte order.
pub fn byte_to_unicode() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut map = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..256u32 {
        map[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('?')
        } else {
            let c = char::from_u32(next).unwrap_or('?');
            next += 1;
            c
        };
    }
    map
}

/// Token texts and llama.cpp token types for a vocabulary of `n` (≥ [`MIN_VOCAB`])
/// tokens: specials, the 256 byte tokens, then distinct ASCII filler words (`Ġw1a` ...).
pub fn vocab(n: usize) -> (Vec<String>, Vec<i32>) {
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for id in 0..N_SPECIAL as u32 {
        tokens.push(match id {
            UNK => "<unk>".to_string(),
            EOS => "〈|EOS|〉".to_string(),
            PAD => "<pad>".to_string(),
            EOT => "</assistant>".to_string(),
            _ => format!("<|reserved_{id}|>"),
        });
        types.push(CONTROL);
    }
    for c in byte_to_unicode() {
        tokens.push(c.to_string());
        types.push(NORMAL);
    }
    let mut k = 0usize;
    while tokens.len() < n {
        // `Ġ` (a space) then base-36 digits: distinct, and valid byte-level text.
        tokens.push(format!("\u{120}w{}", base36(k)));
        types.push(NORMAL);
        k += 1;
    }
    tokens.truncate(n);
    types.truncate(n);
    (tokens, types)
}

fn base36(mut k: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = Vec::new();
    loop {
        s.push(DIGITS[k % 36]);
        k /= 36;
        if k == 0 {
            break;
        }
    }
    s.reverse();
    String::from_utf8(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn vocab_is_distinct_and_sized() {
        let (t, ty) = vocab(5000);
        assert_eq!((t.len(), ty.len()), (5000, 5000));
        let set: HashSet<&String> = t.iter().collect();
        assert_eq!(set.len(), 5000);
        assert_eq!(t[2], "〈|EOS|〉");
        assert_eq!(t[N_SPECIAL + b' ' as usize], "\u{120}");
        assert_eq!(t[N_SPECIAL + b'a' as usize], "a");
    }

    #[test]
    fn byte_map_is_a_bijection() {
        let m = byte_to_unicode();
        let set: HashSet<char> = m.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(m[b'\n' as usize], '\u{10A}');
    }
}
