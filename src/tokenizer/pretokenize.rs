//! The Laguna pre-tokenizer (spec/laguna.md §7.1), written as explicit scanners over
//! bytes so that it needs no regex engine and behaves exactly like HF `tokenizers`
//! (Oniguruma) on the two patterns it uses:
//!
//! 1. `Split((?:\r?\n)+(?!\r?\n), MergedWithNext)`: a piece boundary at the start of
//!    every maximal run of `\n` / `\r\n` units (a lone `\r` is not part of a run); the run
//!    stays attached to the text after it. `for_each_line_piece`
//! 2. `Split(<Qwen2 regex>, Isolated)` with the single-digit `\p{N}`:
//!    `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//!    `qwen2_piece_end`; every character is in exactly one of `\p{L}`, `\p{N}`, `\s` or
//!    "other", so every position starts a match and the matches tile the input.
//! 3. ByteLevel (`add_prefix_space = false`, `use_regex = false`) only maps bytes; that
//!    happens in the BPE step.
//!
//! Classes come from `unicode_tables.rs`, probed from Oniguruma itself (Rust's
//! `is_alphabetic` is the wider Alphabetic property and would split e.g. Devanagari vowel
//! signs differently). Input that is not valid UTF-8 is scanned too: each maximal invalid
//! subpart (the unit `String::from_utf8_lossy` replaces) is one character of class
//! `Class::Other`, the class of U+FFFD that HF would see after lossy decoding.

use std::ops::Range;

use super::unicode_tables::{ASCII, RANGES};

/// Which of the regex's character classes a character is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// `\p{L}`
    Letter,
    /// `\p{N}`
    Number,
    /// `\s` (Unicode White_Space, including `\r` and `\n`)
    Space,
    /// Everything else, including invalid UTF-8.
    Other,
}

/// Which pre-tokenizer a vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// Line-break split, then the Qwen2 regex (`tokenizer.ggml.pre = laguna`).
    Laguna,
    /// The Qwen2 regex alone (`tokenizer.ggml.pre = qwen2`; Qwen2's own NFC normalizer is
    /// not supported).
    Qwen2,
}

impl PreTokenizer {
    /// Calls `f` with the byte range of each piece of `s`, in order; the ranges tile `s`.
    pub fn for_each_piece(self, s: &[u8], mut f: impl FnMut(Range<usize>)) {
        match self {
            PreTokenizer::Laguna => for_each_line_piece(s, |r| {
                let base = r.start;
                for_each_qwen2_piece(&s[r], |p| f(base + p.start..base + p.end));
            }),
            PreTokenizer::Qwen2 => for_each_qwen2_piece(s, f),
        }
    }

    /// The pieces of `s` as byte ranges (for inspection and tests).
    pub fn pieces(self, s: &[u8]) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        self.for_each_piece(s, |r| out.push(r));
        out
    }
}

/// The class and byte length of the character starting at `s[i]` (`i < s.len()`).
#[inline]
pub(crate) fn char_at(s: &[u8], i: usize) -> (Class, usize) {
    let b = s[i];
    if b < 0x80 {
        return (ASCII[b as usize], 1);
    }
    match decode_non_ascii(s, i) {
        Ok((cp, len)) => (class_of(cp), len),
        Err(len) => (Class::Other, len),
    }
}

/// Decodes the non-ASCII character at `s[i]`: `Ok((code point, length))`, or
/// `Err(length of the maximal invalid subpart)` (Unicode Table 3-7; the same units Rust's
/// `Utf8Chunks` and Python's `errors='replace'` use).
#[inline]
pub(crate) fn decode_non_ascii(s: &[u8], i: usize) -> Result<(u32, usize), usize> {
    let b0 = s[i];
    let (len, lo, hi) = match b0 {
        0xC2..=0xDF => (2, 0x80, 0xBF),
        0xE0 => (3, 0xA0, 0xBF),
        0xE1..=0xEC | 0xEE..=0xEF => (3, 0x80, 0xBF),
        0xED => (3, 0x80, 0x9F),
        0xF0 => (4, 0x90, 0xBF),
        0xF1..=0xF3 => (4, 0x80, 0xBF),
        0xF4 => (4, 0x80, 0x8F),
        _ => return Err(1),
    };
    let mut cp = match len {
        2 => (b0 & 0x1F) as u32,
        3 => (b0 & 0x0F) as u32,
        _ => (b0 & 0x07) as u32,
    };
    for k in 1..len {
        let Some(&b) = s.get(i + k) else {
            return Err(k);
        };
        let (lo, hi) = if k == 1 { (lo, hi) } else { (0x80, 0xBF) };
        if !(lo..=hi).contains(&b) {
            return Err(k);
        }
        cp = (cp << 6) | (b & 0x3F) as u32;
    }
    Ok((cp, len))
}

/// The class of a non-ASCII code point (binary search over the generated ranges).
#[inline]
fn class_of(cp: u32) -> Class {
    match RANGES.binary_search_by(|&(lo, hi, _)| {
        if hi < cp {
            std::cmp::Ordering::Less
        } else if lo > cp {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }) {
        Ok(k) => RANGES[k].2,
        Err(_) => Class::Other,
    }
}

/// Whether `c` is `\s` (for the added-token `lstrip` / `rstrip` rules).
pub(crate) fn is_space_at(s: &[u8], i: usize) -> (bool, usize) {
    let (c, len) = char_at(s, i);
    (c == Class::Space, len)
}

/// Step 1: calls `f` with each piece of the line-break split (MergedWithNext).
pub(crate) fn for_each_line_piece(s: &[u8], mut f: impl FnMut(Range<usize>)) {
    let mut start = 0;
    let mut i = 0;
    while let Some(off) = s[i..].iter().position(|&b| b == b'\n') {
        let mut p = i + off;
        // A run may begin with "\r\n"; `p > i` because s[i..] never starts a run here
        // except at i == 0, where there is nothing before it.
        if p > i && s[p - 1] == b'\r' {
            p -= 1;
        }
        let mut e = p;
        loop {
            if s.get(e) == Some(&b'\n') {
                e += 1;
            } else if s.get(e) == Some(&b'\r') && s.get(e + 1) == Some(&b'\n') {
                e += 2;
            } else {
                break;
            }
        }
        if p > start {
            f(start..p);
            start = p;
        }
        i = e;
    }
    if start < s.len() {
        f(start..s.len());
    }
}

/// Step 2: calls `f` with each match of the Qwen2 regex in `s`.
pub(crate) fn for_each_qwen2_piece(s: &[u8], mut f: impl FnMut(Range<usize>)) {
    let mut i = 0;
    while i < s.len() {
        let e = qwen2_piece_end(s, i);
        debug_assert!(e > i);
        f(i..e);
        i = e;
    }
}

/// Length of a contraction `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `s[i..]` (which starts with
/// `'`), or 0. Oniguruma's case folding also lets `s` match U+017F `ſ` (probed: no other
/// non-ASCII character folds to one of these letters).
#[inline]
fn contraction_len(s: &[u8], i: usize) -> usize {
    let lower = |k: usize| s.get(i + k).map(|b| b.to_ascii_lowercase());
    match lower(1) {
        Some(b's' | b't' | b'm' | b'd') => 2,
        Some(b'r' | b'v') if lower(2) == Some(b'e') => 3,
        Some(b'l') if lower(2) == Some(b'l') => 3,
        _ if s.get(i + 1..i + 3) == Some("ſ".as_bytes()) => 3,
        _ => 0,
    }
}

/// End of the run of characters of class `class` that starts at `i`.
#[inline]
fn run_end(s: &[u8], mut i: usize, class: Class) -> usize {
    while i < s.len() {
        let (c, len) = char_at(s, i);
        if c != class {
            break;
        }
        i += len;
    }
    i
}

/// `[\r\n]*` from `i`.
#[inline]
fn crlf_end(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && matches!(s[i], b'\r' | b'\n') {
        i += 1;
    }
    i
}

/// End of the Qwen2-regex match that starts at `s[i]`, trying the alternatives in order
/// as Oniguruma does (backtracking worked out by hand per alternative).
pub(crate) fn qwen2_piece_end(s: &[u8], i: usize) -> usize {
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if s[i] == b'\'' {
        let n = contraction_len(s, i);
        if n > 0 {
            return i + n;
        }
    }
    let (c0, l0) = char_at(s, i);
    match c0 {
        // [^\r\n\p{L}\p{N}]?\p{L}+ with the optional part empty
        Class::Letter => return run_end(s, i, Class::Letter),
        // \p{N}
        Class::Number => return i + l0,
        Class::Space | Class::Other => {}
    }
    let i1 = i + l0;
    let is_crlf = matches!(s[i], b'\r' | b'\n');
    // [^\r\n\p{L}\p{N}]?\p{L}+ with one leading non-letter
    if !is_crlf && i1 < s.len() && char_at(s, i1).0 == Class::Letter {
        return run_end(s, i1, Class::Letter);
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    if c0 == Class::Other {
        return crlf_end(s, run_end(s, i, Class::Other));
    }
    if s[i] == b' ' && i1 < s.len() && char_at(s, i1).0 == Class::Other {
        return crlf_end(s, run_end(s, i1, Class::Other));
    }
    // c0 is whitespace. Scan the whole run once.
    let mut j = i;
    let mut last_start = i;
    let mut last_crlf_end = None;
    while j < s.len() {
        let (c, len) = char_at(s, j);
        if c != Class::Space {
            break;
        }
        if matches!(s[j], b'\r' | b'\n') {
            last_crlf_end = Some(j + len);
        }
        last_start = j;
        j += len;
    }
    // \s*[\r\n]+ : \s* backs off to the last line break of the run.
    if let Some(e) = last_crlf_end {
        return e;
    }
    // \s+(?!\S) : the whole run at the end of input, else all but its last character.
    if j == s.len() {
        return j;
    }
    if last_start > i {
        return last_start;
    }
    // \s+
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: PreTokenizer, s: &str) -> Vec<&str> {
        p.pieces(s.as_bytes()).into_iter().map(|r| &s[r]).collect()
    }

    // Expected pieces recorded from HF tokenizers 0.23.3 (Sequence[Split, Split]).
    #[test]
    fn line_breaks_and_regex() {
        let l = PreTokenizer::Laguna;
        assert_eq!(split(l, "a\nb"), ["a", "\n", "b"]);
        assert_eq!(split(l, "a\r\n\r\nb\n"), ["a", "\r\n\r\n", "b", "\n"]);
        assert_eq!(split(l, "a \nb"), ["a", " ", "\n", "b"]);
        assert_eq!(split(l, "x\r\ry"), ["x", "\r\r", "y"]);
        assert_eq!(split(l, "a\n\r\r\nb"), ["a", "\n\r", "\r\n", "b"]);
        assert_eq!(
            split(l, "'S 'ſ 'LL 'Re"),
            ["'S", " '", "ſ", " '", "LL", " '", "Re"]
        );
        assert_eq!(
            split(l, "ab  cd\t\n e"),
            ["ab", " ", " cd", "\t", "\n", " e"]
        );
        // without the line-break split the space joins the line break
        assert_eq!(split(PreTokenizer::Qwen2, "a \nb"), ["a", " \n", "b"]);
    }

    #[test]
    fn digits_and_letters() {
        let l = PreTokenizer::Laguna;
        assert_eq!(split(l, "x=123"), ["x", "=", "1", "2", "3"]);
        assert_eq!(split(l, ".abc  def"), [".abc", " ", " def"]);
        // U+093F (a vowel sign, Mc) is Alphabetic but not \p{L}
        assert_eq!(split(l, "हिन्दी"), ["ह", "िन", "्द", "ी"]);
    }

    #[test]
    fn invalid_utf8_is_one_other_char_per_subpart() {
        assert_eq!(decode_non_ascii(b"\xe2\x82x", 0), Err(2));
        assert_eq!(decode_non_ascii(b"\xe2\x82", 0), Err(2));
        assert_eq!(decode_non_ascii(b"\xed\xa0\x80", 0), Err(1));
        assert_eq!(decode_non_ascii(b"\xf4\x90", 0), Err(1));
        assert_eq!(decode_non_ascii("é".as_bytes(), 0), Ok((0xE9, 2)));
        let s = b"\xfeabc \xe2\x82abc";
        let p = PreTokenizer::Laguna.pieces(s);
        assert_eq!(p, [0..4, 4..7, 7..10]);
    }
}
