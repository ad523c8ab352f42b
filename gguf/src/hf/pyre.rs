//! The subset of Python `re` that compressed-tensors `re:` targets use, matched with
//! `re.match` semantics: anchored at the start of the module name, not at its end.
//!
//! Supported: literals and escapes (`\.`, `\d \w \s` and their negations, `\n \t`), `.`,
//! classes `[...]` with ranges and negation, groups `(...)`, `(?:...)`, `(?P<name>...)`,
//! alternation, `* + ? {m} {m,} {,n} {m,n}` greedy or lazy, and `^ $ \A \Z`. Anything else
//! (look-around, back-references, inline flags) is refused when the pattern is compiled,
//! never silently mis-matched. Matching is plain backtracking with a step budget; module
//! names are short.

/// A compiled pattern.
#[derive(Clone, Debug)]
pub struct PyRegex {
    alt: Vec<Vec<Node>>,
}

#[derive(Clone, Debug)]
enum Node {
    Char(char),
    Any,
    Class {
        items: Vec<ClassItem>,
        negated: bool,
    },
    Start,
    End,
    EndAbsolute,
    Group(Vec<Vec<Node>>),
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
        greedy: bool,
    },
}

#[derive(Clone, Debug)]
enum ClassItem {
    Range(char, char),
    Digit(bool),
    Word(bool),
    Space(bool),
}

impl ClassItem {
    fn matches(&self, c: char) -> bool {
        match *self {
            ClassItem::Range(a, b) => a <= c && c <= b,
            ClassItem::Digit(neg) => c.is_ascii_digit() != neg,
            ClassItem::Word(neg) => (c.is_alphanumeric() || c == '_') != neg,
            ClassItem::Space(neg) => c.is_whitespace() != neg,
        }
    }
}

/// Work allowed for one match before giving up (treated as no match).
const STEP_BUDGET: u32 = 1_000_000;

impl PyRegex {
    /// Compiles `pattern`, or says which construct is not supported.
    pub fn new(pattern: &str) -> Result<PyRegex, String> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut p = Parser { s: &chars, i: 0 };
        let alt = p.alternation()?;
        if p.i != chars.len() {
            return Err(format!("unbalanced `)` at offset {}", p.i));
        }
        Ok(PyRegex { alt })
    }

    /// Python `re.match(pattern, s) is not None`.
    pub fn is_match(&self, s: &str) -> bool {
        let chars: Vec<char> = s.chars().collect();
        let m = Matcher {
            s: &chars,
            steps: std::cell::Cell::new(0),
        };
        m.alt(&self.alt, 0, &mut |_| true)
    }
}

struct Parser<'a> {
    s: &'a [char],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn alternation(&mut self) -> Result<Vec<Vec<Node>>, String> {
        let mut alt = vec![self.sequence()?];
        while self.peek() == Some('|') {
            self.i += 1;
            alt.push(self.sequence()?);
        }
        Ok(alt)
    }

    fn sequence(&mut self) -> Result<Vec<Node>, String> {
        let mut seq = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            let node = self.quantifier(atom)?;
            seq.push(node);
        }
        Ok(seq)
    }

    fn atom(&mut self) -> Result<Node, String> {
        let c = self.peek().ok_or("unexpected end")?;
        self.i += 1;
        Ok(match c {
            '.' => Node::Any,
            '^' => Node::Start,
            '$' => Node::End,
            '(' => {
                if self.peek() == Some('?') {
                    match self.s.get(self.i + 1) {
                        Some(':') => self.i += 2,
                        Some('P') if self.s.get(self.i + 2) == Some(&'<') => {
                            self.i += 3;
                            while self.peek().is_some_and(|c| c != '>') {
                                self.i += 1;
                            }
                            if self.peek() != Some('>') {
                                return Err("unterminated group name".into());
                            }
                            self.i += 1;
                        }
                        _ => {
                            return Err(format!(
                                "group extension `(?` at offset {} is not supported",
                                self.i - 1
                            ));
                        }
                    }
                }
                let inner = self.alternation()?;
                if self.peek() != Some(')') {
                    return Err("missing `)`".into());
                }
                self.i += 1;
                Node::Group(inner)
            }
            '[' => self.class()?,
            '\\' => self.escape(false)?,
            '*' | '+' | '?' | '{' if c != '{' || self.brace_is_quantifier(self.i - 1) => {
                return Err(format!("nothing to repeat at offset {}", self.i - 1));
            }
            ')' => return Err("unbalanced `)`".into()),
            c => Node::Char(c),
        })
    }

    /// Whether `{` at `at` starts a valid `{m}`, `{m,}`, `{,n}` or `{m,n}` (Python treats
    /// any other `{` as a literal).
    fn brace_is_quantifier(&self, at: usize) -> bool {
        self.parse_brace(at).is_some()
    }

    fn parse_brace(&self, at: usize) -> Option<(u32, Option<u32>, usize)> {
        let mut j = at + 1;
        let num = |j: &mut usize| -> Option<u32> {
            let st = *j;
            while self.s.get(*j).is_some_and(|c| c.is_ascii_digit()) {
                *j += 1;
            }
            if *j == st {
                None
            } else {
                self.s[st..*j].iter().collect::<String>().parse().ok()
            }
        };
        let lo = num(&mut j);
        let (min, max) = if self.s.get(j) == Some(&',') {
            j += 1;
            let hi = num(&mut j);
            (lo.unwrap_or(0), hi)
        } else {
            let m = lo?;
            (m, Some(m))
        };
        if self.s.get(j) != Some(&'}') {
            return None;
        }
        Some((min, max, j + 1))
    }

    fn quantifier(&mut self, atom: Node) -> Result<Node, String> {
        let (min, max) = match self.peek() {
            Some('*') => {
                self.i += 1;
                (0, None)
            }
            Some('+') => {
                self.i += 1;
                (1, None)
            }
            Some('?') => {
                self.i += 1;
                (0, Some(1))
            }
            Some('{') => match self.parse_brace(self.i) {
                Some((min, max, next)) => {
                    self.i = next;
                    (min, max)
                }
                None => return Ok(atom),
            },
            _ => return Ok(atom),
        };
        if matches!(atom, Node::Start | Node::End | Node::EndAbsolute) {
            return Err("nothing to repeat".into());
        }
        if max.is_some_and(|m| m < min) {
            return Err("min repeat greater than max repeat".into());
        }
        let greedy = if self.peek() == Some('?') {
            self.i += 1;
            false
        } else {
            true
        };
        if matches!(self.peek(), Some('*' | '+')) {
            return Err("multiple repeat".into());
        }
        Ok(Node::Repeat {
            node: Box::new(atom),
            min,
            max,
            greedy,
        })
    }

    fn class(&mut self) -> Result<Node, String> {
        let mut items = Vec::new();
        let negated = if self.peek() == Some('^') {
            self.i += 1;
            true
        } else {
            false
        };
        let mut first = true;
        loop {
            let c = self.peek().ok_or("unterminated character set")?;
            if c == ']' && !first {
                self.i += 1;
                break;
            }
            first = false;
            self.i += 1;
            let lo = if c == '\\' {
                match self.escape(true)? {
                    Node::Char(ch) => ch,
                    Node::Class { items: it, .. } => {
                        items.extend(it);
                        continue;
                    }
                    _ => return Err("unsupported escape in a character set".into()),
                }
            } else {
                c
            };
            if self.peek() == Some('-') && self.s.get(self.i + 1).is_some_and(|&n| n != ']') {
                self.i += 1;
                let h = self.peek().ok_or("unterminated character set")?;
                self.i += 1;
                let hi = if h == '\\' {
                    match self.escape(true)? {
                        Node::Char(ch) => ch,
                        _ => return Err("bad character range".into()),
                    }
                } else {
                    h
                };
                if hi < lo {
                    return Err("bad character range".into());
                }
                items.push(ClassItem::Range(lo, hi));
            } else {
                items.push(ClassItem::Range(lo, lo));
            }
        }
        Ok(Node::Class { items, negated })
    }

    /// After a backslash.
    fn escape(&mut self, in_class: bool) -> Result<Node, String> {
        let c = self.peek().ok_or("trailing backslash")?;
        self.i += 1;
        let class = |it: ClassItem| Node::Class {
            items: vec![it],
            negated: false,
        };
        Ok(match c {
            'd' => class(ClassItem::Digit(false)),
            'D' => class(ClassItem::Digit(true)),
            'w' => class(ClassItem::Word(false)),
            'W' => class(ClassItem::Word(true)),
            's' => class(ClassItem::Space(false)),
            'S' => class(ClassItem::Space(true)),
            'n' => Node::Char('\n'),
            't' => Node::Char('\t'),
            'r' => Node::Char('\r'),
            'A' if !in_class => Node::Start,
            'Z' if !in_class => Node::EndAbsolute,
            c if c.is_ascii_alphanumeric() => {
                return Err(format!("escape `\\{c}` is not supported"));
            }
            c => Node::Char(c),
        })
    }
}

struct Matcher<'a> {
    s: &'a [char],
    steps: std::cell::Cell<u32>,
}

type Cont<'k> = dyn FnMut(usize) -> bool + 'k;

impl Matcher<'_> {
    fn tick(&self) -> bool {
        let n = self.steps.get() + 1;
        self.steps.set(n);
        n <= STEP_BUDGET
    }

    fn alt(&self, alt: &[Vec<Node>], i: usize, k: &mut Cont<'_>) -> bool {
        alt.iter().any(|seq| self.seq(seq, i, k))
    }

    fn seq(&self, seq: &[Node], i: usize, k: &mut Cont<'_>) -> bool {
        match seq.split_first() {
            None => k(i),
            Some((first, rest)) => self.node(first, i, &mut |j| self.seq(rest, j, k)),
        }
    }

    fn node(&self, n: &Node, i: usize, k: &mut Cont<'_>) -> bool {
        if !self.tick() {
            return false;
        }
        let s = self.s;
        match n {
            Node::Char(c) => s.get(i) == Some(c) && k(i + 1),
            Node::Any => s.get(i).is_some_and(|&c| c != '\n') && k(i + 1),
            Node::Class { items, negated } => {
                s.get(i)
                    .is_some_and(|&c| items.iter().any(|it| it.matches(c)) != *negated)
                    && k(i + 1)
            }
            Node::Start => i == 0 && k(i),
            // Python `$`: the end, or just before a final newline.
            Node::End => (i == s.len() || (i + 1 == s.len() && s[i] == '\n')) && k(i),
            Node::EndAbsolute => i == s.len() && k(i),
            Node::Group(alt) => self.alt(alt, i, k),
            Node::Repeat {
                node,
                min,
                max,
                greedy,
            } => self.repeat(node, *min, *max, *greedy, 0, i, k),
        }
    }

    fn repeat(
        &self,
        node: &Node,
        min: u32,
        max: Option<u32>,
        greedy: bool,
        count: u32,
        i: usize,
        k: &mut Cont<'_>,
    ) -> bool {
        if !self.tick() {
            return false;
        }
        let can_more = max.is_none_or(|m| count < m);
        let more = |k: &mut Cont<'_>| {
            can_more
                && self.node(node, i, &mut |j| {
                    // An iteration that consumed nothing cannot help once `min` is reached.
                    (j != i || count < min) && self.repeat(node, min, max, greedy, count + 1, j, k)
                })
        };
        if count < min {
            return more(k);
        }
        if greedy {
            return more(k) || k(i);
        }
        // Lazy: as few iterations as possible first.
        k(i) || more(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        PyRegex::new(p).unwrap().is_match(s)
    }

    #[test]
    fn laguna_ignore_patterns() {
        let attn = r".*\.self_attn\.(q|k|v|o|g)_proj$";
        assert!(m(attn, "model.layers.3.self_attn.g_proj"));
        assert!(!m(attn, "model.layers.3.self_attn.g_proj.weight"));
        assert!(!m(attn, "model.layers.3.self_attn.x_proj"));
        let gate = r".*\.mlp\.gate$";
        assert!(m(gate, "model.layers.1.mlp.gate"));
        assert!(!m(gate, "model.layers.1.mlp.gate_proj"));
        let late = r"^model\.layers\.4[0-7]\.mlp\.experts(\..*)?$";
        assert!(m(late, "model.layers.45.mlp.experts.3.up_proj"));
        assert!(m(late, "model.layers.40.mlp.experts"));
        assert!(!m(late, "model.layers.48.mlp.experts.3.up_proj"));
        assert!(!m(late, "model.layers.4.mlp.experts.3.up_proj"));
        let experts = r".*experts\.[0-9]+\.(gate_proj|up_proj|down_proj)$";
        assert!(m(experts, "model.layers.2.mlp.experts.255.down_proj"));
        assert!(!m(experts, "model.layers.2.mlp.shared_expert.down_proj"));
    }

    #[test]
    fn match_is_anchored_at_start_only() {
        assert!(m("lm_head", "lm_head_extra"));
        assert!(!m("head", "lm_head"));
        assert!(m("a$", "a\n"));
        assert!(!m(r"a\Z", "a\n"));
    }

    #[test]
    fn quantifiers_and_classes() {
        assert!(m(r"a{2,3}b", "aaab"));
        assert!(!m(r"a{2,3}b", "ab"));
        assert!(m(r"a{,2}b", "b"));
        assert!(m(r"x{y", "x{y"));
        assert!(m(r"[^.]+\.w", "abc.w"));
        assert!(!m(r"[^.]+\.w$", "a.b.w"));
        assert!(m(r"(?:ab)+c", "ababc"));
        assert!(m(r"(?P<n>\d+)_\w+$", "12_ab"));
        assert!(m(r".*?x$", "aaax"));
        assert!(m(r"(a*)*b", "aaab"));
        assert!(!m(r"(a*)*b", "aaaaaaaaaaaaaaaaaaaaaaaaac"));
        assert!(m(r"[a\-z]", "-"));
        assert!(m(r"[\d.]+$", "1.5"));
    }

    #[test]
    fn refuses_unsupported_syntax() {
        assert!(PyRegex::new(r"(?=a)").is_err());
        assert!(PyRegex::new(r"(a)\1").is_err());
        assert!(PyRegex::new(r"(?i)a").is_err());
        assert!(PyRegex::new(r"*a").is_err());
        assert!(PyRegex::new(r"(a").is_err());
        assert!(PyRegex::new(r"a)").is_err());
        assert!(PyRegex::new(r"[a").is_err());
    }
}
