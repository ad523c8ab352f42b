//! Stop strings matched on decoded text across token boundaries.
//!
//! As vLLM's streaming detokenizer (`vllm/v1/engine/detokenizer.py`, `check_stop_strings`
//! and its held-back `stop_buffer_length`), text is released only once it cannot be part of
//! a stop string; unlike vLLM, which holds back a fixed `max(len(stop)) - 1` characters, only
//! the longest tail that is a proper prefix of some stop string is held back. On a match the
//! text before the stop string is released and the stop string and anything after it are
//! dropped.

/// The stop strings of one generation and the text held back while it might start one.
#[derive(Clone, Debug, Default)]
pub struct StopStrings {
    /// (index in the list given to `new`, string).
    stops: Vec<(usize, String)>,
    held: String,
}

impl StopStrings {
    /// Empty strings are ignored (they would match everywhere).
    pub fn new(stops: &[String]) -> StopStrings {
        let stops: Vec<(usize, String)> = stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i, s.clone()))
            .collect();
        let longest = stops.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
        StopStrings {
            stops,
            // Held text is shorter than the longest stop; room for it plus a large token.
            held: String::with_capacity(2 * longest + 256),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Text held back (a possible start of a stop string).
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Adds `text`. Calls `emit` with whatever is now certain not to belong to a stop string
    /// and returns the index (in the list given to [`new`](Self::new)) of the stop string
    /// found, if any. The earliest match wins; at one position,
    /// the first listed.
    pub fn push(&mut self, text: &str, mut emit: impl FnMut(&str)) -> Option<usize> {
        if self.stops.is_empty() {
            if !text.is_empty() {
                emit(text);
            }
            return None;
        }
        self.held.push_str(text);
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in &self.stops {
            let i = *i;
            if let Some(pos) = self.held.find(s.as_str())
                && best.is_none_or(|(b, _)| pos < b)
            {
                best = Some((pos, i));
            }
        }
        if let Some((pos, i)) = best {
            if pos > 0 {
                emit(&self.held[..pos]);
            }
            self.held.clear();
            return Some(i);
        }
        let cut = self.held.len() - self.partial_len();
        if cut > 0 {
            emit(&self.held[..cut]);
            self.held.drain(..cut);
        }
        None
    }

    /// Length in bytes of the longest tail of the held text that is a proper prefix of a
    /// stop string.
    fn partial_len(&self) -> usize {
        let h = &self.held;
        let longest = self.stops.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
        let first = h.len().saturating_sub(longest.saturating_sub(1));
        for j in first..h.len() {
            if !h.is_char_boundary(j) {
                continue;
            }
            let tail = &h[j..];
            if self
                .stops
                .iter()
                .any(|(_, s)| s.len() > tail.len() && s.starts_with(tail))
            {
                return tail.len();
            }
        }
        0
    }

    /// Releases the held text (the stream ended or was interrupted by a token that
    /// produces no text, so it can no longer complete a stop string).
    pub fn flush(&mut self, mut emit: impl FnMut(&str)) {
        if !self.held.is_empty() {
            emit(&self.held);
            self.held.clear();
        }
    }

    /// Forgets the held text.
    pub fn clear(&mut self) {
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks`; returns the released text and the stop index.
    fn run(stops: &[&str], chunks: &[&str]) -> (String, Option<usize>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopStrings::new(&stops);
        let mut out = String::new();
        for c in chunks {
            if let Some(i) = m.push(c, |s| out.push_str(s)) {
                return (out, Some(i));
            }
        }
        m.flush(|s| out.push_str(s));
        (out, None)
    }

    #[test]
    fn matches_across_chunks_and_drops_the_rest() {
        assert_eq!(
            run(&["STOP"], &["abc S", "T", "OPxyz"]),
            ("abc ".into(), Some(0))
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), Some(0)));
        // Earliest match wins over list order.
        assert_eq!(run(&["yz", "b"], &["abxyz"]), ("a".into(), Some(1)));
        // A partial that turns out not to match is released.
        assert_eq!(run(&["STOP"], &["ST", "OX", "!"]), ("STOX!".into(), None));
    }

    #[test]
    fn holds_back_only_possible_prefixes() {
        let stops = vec!["</end>".to_string(), "éclair".to_string()];
        let mut m = StopStrings::new(&stops);
        let mut out = String::new();
        assert_eq!(m.push("hello </e", |s| out.push_str(s)), None);
        assert_eq!((out.as_str(), m.held()), ("hello ", "</e"));
        assert_eq!(m.push("x é", |s| out.push_str(s)), None);
        assert_eq!((out.as_str(), m.held()), ("hello </ex ", "é"));
        assert_eq!(m.push("clair", |s| out.push_str(s)), Some(1));
        assert_eq!(out, "hello </ex ");
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "", "b"]), ("ab".into(), None));
        assert_eq!(run(&[""], &["a"]), ("a".into(), None));
        assert_eq!(run(&["", "b"], &["ab"]), ("a".into(), Some(1)));
    }
}
