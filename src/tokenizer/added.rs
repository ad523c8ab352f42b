//! Added tokens (`added_tokens` in tokenizer.json; CONTROL / USER_DEFINED tokens in GGUF),
//! matched in the raw text before pre-tokenization exactly as HF `tokenizers`
//! (`added_vocabulary.rs`): leftmost-longest matching, first of the tokens with
//! `normalized = false` over the whole text, then of those with `normalized = true` over
//! the pieces in between; `single_word`, `lstrip`, `rstrip` applied per match. Special and
//! non-special added tokens are both matched (HF's `special` flag only matters for
//! decoding with `skip_special_tokens` and for `split_special_tokens`).

use std::ops::Range;

use super::pretokenize::{char_at, decode_non_ascii, is_space_at};

/// One added token and its flags (HF `AddedToken`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddedToken {
    pub content: String,
    pub id: u32,
    pub special: bool,
    pub normalized: bool,
    pub lstrip: bool,
    pub rstrip: bool,
    pub single_word: bool,
}

/// A run of input: text for the pre-tokenizer, or an added token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    Text(Range<usize>),
    Token(u32),
}

/// Candidates by first byte, longest first: the first candidate that matches at a
/// position is the leftmost-longest match there.
#[derive(Clone, Debug)]
struct Matcher {
    by_first_byte: Vec<Vec<u32>>,
}

impl Matcher {
    fn new(tokens: &[AddedToken], select: impl Fn(&AddedToken) -> bool) -> Matcher {
        let mut by_first_byte = vec![Vec::new(); 256];
        for (i, t) in tokens.iter().enumerate() {
            if select(t) && !t.content.is_empty() {
                by_first_byte[t.content.as_bytes()[0] as usize].push(i as u32);
            }
        }
        for v in &mut by_first_byte {
            v.sort_by_key(|&i| std::cmp::Reverse(tokens[i as usize].content.len()));
        }
        Matcher { by_first_byte }
    }

    fn is_empty(&self) -> bool {
        self.by_first_byte.iter().all(Vec::is_empty)
    }

    /// The leftmost-longest match in `s[from..]`: `(start, end, token index)`.
    fn find(&self, tokens: &[AddedToken], s: &[u8], from: usize) -> Option<(usize, usize, usize)> {
        for i in from..s.len() {
            for &t in &self.by_first_byte[s[i] as usize] {
                let c = tokens[t as usize].content.as_bytes();
                if s[i..].starts_with(c) {
                    return Some((i, i + c.len(), t as usize));
                }
            }
        }
        None
    }
}

/// The added-token vocabulary and its two matchers.
#[derive(Clone, Debug)]
pub(crate) struct AddedVocab {
    pub tokens: Vec<AddedToken>,
    raw: Matcher,
    normalized: Matcher,
}

impl AddedVocab {
    pub fn new(tokens: Vec<AddedToken>) -> AddedVocab {
        let raw = Matcher::new(&tokens, |t| !t.normalized);
        let normalized = Matcher::new(&tokens, |t| t.normalized);
        AddedVocab {
            tokens,
            raw,
            normalized,
        }
    }

    /// Splits `s` into text and added-token segments. `split_special` leaves tokens with
    /// `special = true` as text (HF `split_special_tokens` / `encode_special_tokens`).
    pub fn split(&self, s: &[u8], split_special: bool, out: &mut Vec<Segment>) {
        out.clear();
        if self.raw.is_empty() && self.normalized.is_empty() {
            if !s.is_empty() {
                out.push(Segment::Text(0..s.len()));
            }
            return;
        }
        let mut first = Vec::new();
        self.split_one(&self.raw, s, 0..s.len(), split_special, &mut first);
        if self.normalized.is_empty() {
            *out = first;
            return;
        }
        for seg in first {
            match seg {
                Segment::Text(r) => self.split_one(&self.normalized, s, r, split_special, out),
                t => out.push(t),
            }
        }
    }

    /// HF `find_matches` on the sentence `s[range]`.
    fn split_one(
        &self,
        m: &Matcher,
        s: &[u8],
        range: Range<usize>,
        split_special: bool,
        out: &mut Vec<Segment>,
    ) {
        let base = range.start;
        let sent = &s[range];
        let mut start_offset = 0;
        let mut from = 0;
        while let Some((mut start, mut stop, t)) = m.find(&self.tokens, sent, from) {
            // The match iterator resumes after this match even when it is discarded.
            from = stop;
            let tok = &self.tokens[t];
            if split_special && tok.special {
                continue;
            }
            if tok.single_word {
                let start_ok = start == 0 || !ends_with_word(&sent[..start]);
                let stop_ok = stop == sent.len() || !starts_with_word(&sent[stop..]);
                if !start_ok || !stop_ok {
                    continue;
                }
            }
            if tok.lstrip {
                // `\s*$` on sent[..start], never reaching back before the previous match.
                start =
                    trailing_space_start(sent, start_offset.min(start), start).max(start_offset);
            }
            if tok.rstrip {
                stop = leading_space_end(sent, stop);
            }
            if start_offset < start {
                out.push(Segment::Text(base + start_offset..base + start));
            }
            out.push(Segment::Token(tok.id));
            start_offset = stop;
        }
        if start_offset < sent.len() {
            out.push(Segment::Text(base + start_offset..base + sent.len()));
        }
    }
}

/// Start of the whitespace run that ends at `end`, scanning from `from` (a character
/// boundary).
fn trailing_space_start(s: &[u8], from: usize, end: usize) -> usize {
    let mut run_start = None;
    let mut i = from;
    while i < end {
        let (space, len) = is_space_at(s, i);
        if space {
            run_start.get_or_insert(i);
        } else {
            run_start = None;
        }
        i += len;
    }
    run_start.unwrap_or(end)
}

/// End of the whitespace run that starts at `i`.
fn leading_space_end(s: &[u8], mut i: usize) -> usize {
    while i < s.len() {
        let (space, len) = is_space_at(s, i);
        if !space {
            break;
        }
        i += len;
    }
    i
}

/// Approximates the Rust `regex` crate's Unicode `\w` (Alphabetic, marks, decimal
/// digits, connector punctuation, joiners) that HF uses for `single_word`; `is_numeric`
/// also admits No/Nl digits such as `²`. Only `single_word` tokens look at this.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '\u{200c}' || c == '\u{200d}'
}

fn starts_with_word(s: &[u8]) -> bool {
    if s.is_empty() {
        return false;
    }
    if s[0] < 0x80 {
        return is_word_char(s[0] as char);
    }
    match decode_non_ascii(s, 0) {
        Ok((cp, _)) => char::from_u32(cp).is_some_and(is_word_char),
        Err(_) => false,
    }
}

fn ends_with_word(s: &[u8]) -> bool {
    // The last character starts at the last byte that is not a continuation byte.
    let Some(start) = (s.len().saturating_sub(4)..s.len())
        .rev()
        .find(|&i| s[i] & 0xC0 != 0x80)
    else {
        return false;
    };
    let (_, len) = char_at(s, start);
    if start + len != s.len() {
        return false; // invalid tail
    }
    if s[start] < 0x80 {
        return is_word_char(s[start] as char);
    }
    match decode_non_ascii(s, start) {
        Ok((cp, _)) => char::from_u32(cp).is_some_and(is_word_char),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(content: &str, id: u32) -> AddedToken {
        AddedToken {
            content: content.into(),
            id,
            special: true,
            normalized: false,
            lstrip: false,
            rstrip: false,
            single_word: false,
        }
    }

    #[test]
    fn leftmost_longest() {
        let v = AddedVocab::new(vec![tok("<a>", 1), tok("<a><b>", 2), tok("<b>", 3)]);
        let mut out = Vec::new();
        v.split(b"x<a><b><a>y<b", false, &mut out);
        assert_eq!(
            out,
            [
                Segment::Text(0..1),
                Segment::Token(2),
                Segment::Token(1),
                Segment::Text(10..13)
            ]
        );
        v.split(b"<a>", true, &mut out);
        assert_eq!(out, [Segment::Text(0..3)]);
    }

    #[test]
    fn strip_flags() {
        let mut l = tok("<m>", 7);
        l.lstrip = true;
        l.rstrip = true;
        let v = AddedVocab::new(vec![l]);
        let mut out = Vec::new();
        v.split(b"a  <m>  b", false, &mut out);
        assert_eq!(
            out,
            [Segment::Text(0..1), Segment::Token(7), Segment::Text(8..9)]
        );
    }
}
