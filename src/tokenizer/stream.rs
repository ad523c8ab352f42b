//! Incremental decoding: feed token ids one at a time, get text as soon as it is complete
//! UTF-8. A multi-byte character split across tokens is held back until its last byte
//! arrives; bytes that can never become valid are emitted as U+FFFD, one per maximal
//! invalid subpart. The concatenated output therefore equals
//! `String::from_utf8_lossy(&tokenizer.decode(ids))` -- which is HF's `decode` text.
//!
//! After the first few calls nothing is allocated: both buffers are reused.

use super::Tokenizer;

#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    /// Bytes received but not yet emitted (at most 3: an incomplete character).
    pending: Vec<u8>,
    /// Text emitted by the last call.
    out: String,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds token `id` and returns the text it completes (often empty, never a partial
    /// character). Unknown ids add nothing.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> &str {
        let bytes = tokenizer.token_bytes(id).unwrap_or(&[]);
        self.push_bytes(bytes)
    }

    /// Adds raw bytes and returns the text they complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> &str {
        self.out.clear();
        self.pending.extend_from_slice(bytes);
        let mut pos = 0;
        loop {
            match std::str::from_utf8(&self.pending[pos..]) {
                Ok(s) => {
                    self.out.push_str(s);
                    pos = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // `from_utf8` has just validated this prefix, so this cannot fail.
                    self.out.push_str(
                        std::str::from_utf8(&self.pending[pos..pos + valid]).unwrap_or_default(),
                    );
                    pos += valid;
                    match e.error_len() {
                        Some(n) => {
                            self.out.push('\u{FFFD}');
                            pos += n;
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..pos);
        &self.out
    }

    /// Ends the stream: an incomplete character left over becomes U+FFFD.
    pub fn finish(&mut self) -> &str {
        self.out.clear();
        if !self.pending.is_empty() {
            self.out.push('\u{FFFD}');
            self.pending.clear();
        }
        &self.out
    }

    /// Whether bytes are held back waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Forgets held-back bytes (e.g. when starting a new generation).
    pub fn reset(&mut self) {
        self.pending.clear();
        self.out.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(chunks: &[&[u8]]) -> (String, Vec<String>) {
        let mut d = StreamDecoder::new();
        let mut parts: Vec<String> = chunks.iter().map(|c| d.push_bytes(c).to_string()).collect();
        parts.push(d.finish().to_string());
        (parts.concat(), parts)
    }

    #[test]
    fn holds_back_split_characters() {
        let e = "€".as_bytes(); // E2 82 AC
        let (all, parts) = stream(&[b"a", &e[..1], &e[1..2], &e[2..], b"b"]);
        assert_eq!(all, "a€b");
        assert_eq!(parts, ["a", "", "", "€", "b", ""]);
    }

    #[test]
    fn matches_lossy_on_invalid_bytes() {
        let cases: [&[&[u8]]; 4] = [
            &[b"\xe2\x82", b"A"],
            &[b"\xf0\x9f", b"\x98", b"x\xff"],
            &[b"ok\xe2"],
            &[b"\xed", b"\xa0\x80"],
        ];
        for chunks in cases {
            let whole: Vec<u8> = chunks.concat();
            assert_eq!(
                stream(chunks).0,
                String::from_utf8_lossy(&whole),
                "{chunks:?}"
            );
        }
    }
}
