//! `ast.literal_eval` (CPython 3.11) over the part of Python's expression syntax that
//! argument values use: numbers in every spelling (`0x1F`, `1_000`, `.5`, `1e5`, `2j`),
//! string and bytes literals with prefixes, escapes and implicit concatenation, `True` /
//! `False` / `None` / `...`, tuples (also bare `1, 2`), lists, dicts, sets, `set()`,
//! unary `+`/`-` on numbers, `num ± complex`, comments and line joining inside brackets.
//!
//! Outcome, as the reference sees it:
//! * a value: Python's `literal_eval` returns it;
//! * [`Coerced::Raw`]: `SyntaxError` or `ValueError` ("malformed node"): the raw text is kept;
//! * [`Coerced::Fatal`]: `TypeError` while building a dict or set from an unhashable key
//!   (`{[1]: 2}`), reached in `literal_eval`'s own evaluation order.
//!
//! Approximations (documented divergences): syntax outside this subset (attribute access,
//! calls other than `set()`, subscripts, operators other than `+ - * / % // @ ** ~`,
//! comprehensions, lambdas, comparisons…) is treated as a syntax error, which only differs
//! from Python when it sits next to an unhashable dict key or set member that Python would
//! reach first; `\N{NAME}` escapes (no Unicode name table here) make the value raw.

use super::coerce::{
    Coerced, INT_MAX_STR_DIGITS, PyVal, dict_insert, hashable, int_from_decimal, int_from_radix,
};

/// `ast.literal_eval(s)` as seen by `_deserialize`.
pub(crate) fn literal_eval(s: &str) -> Coerced {
    let Some(tokens) = tokenize(s.trim_start_matches([' ', '\t'])) else {
        return Coerced::Raw;
    };
    let mut p = Parser { t: &tokens, i: 0 };
    let Some(node) = p.top() else {
        return Coerced::Raw;
    };
    match convert(&node) {
        Ok(v) => Coerced::Value(v),
        Err(Fail::Malformed) => Coerced::Raw,
        Err(Fail::Unhashable) => Coerced::Fatal,
    }
}

#[derive(Debug, Clone)]
enum Tok {
    /// A number constant (int, float or complex).
    Num(PyVal),
    /// A string-like literal: `Some(text)` for str, `None` for bytes; `fstr` for f-strings.
    Str {
        text: Option<String>,
        fstr: bool,
    },
    Name(String),
    Op(&'static str),
    Newline,
}

const OPS: [&str; 20] = [
    "...", "**", "//", "(", ")", "[", "]", "{", "}", ",", ":", "+", "-", "*", "/", "%", "@", "~",
    ".", ";",
];

fn is_id_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_id_continue(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Python's tokenizer over one expression; `None` on a syntax error.
fn tokenize(s: &str) -> Option<Vec<Tok>> {
    let cs: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut depth = 0usize;
    while i < cs.len() {
        let c = cs[i];
        match c {
            ' ' | '\t' | '\u{c}' => i += 1,
            '#' => {
                while i < cs.len() && cs[i] != '\n' && cs[i] != '\r' {
                    i += 1;
                }
            }
            '\n' | '\r' => {
                i += 1;
                if depth == 0 && !matches!(out.last(), None | Some(Tok::Newline)) {
                    out.push(Tok::Newline);
                }
            }
            '\\' => {
                // Line continuation only.
                match cs.get(i + 1) {
                    Some('\n') => i += 2,
                    Some('\r') => i += if cs.get(i + 2) == Some(&'\n') { 3 } else { 2 },
                    _ => return None,
                }
            }
            c if c.is_ascii_digit()
                || (c == '.' && cs.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let (tok, next) = number(&cs, i)?;
                out.push(tok);
                i = next;
            }
            c if is_id_start(c) => {
                let start = i;
                while i < cs.len() && is_id_continue(cs[i]) {
                    i += 1;
                }
                let word: String = cs[start..i].iter().collect();
                if matches!(cs.get(i), Some('\'' | '"'))
                    && let Some(prefix) = string_prefix(&word)
                {
                    let (tok, next) = string(&cs, i, prefix)?;
                    out.push(tok);
                    i = next;
                    continue;
                }
                out.push(Tok::Name(word));
            }
            '\'' | '"' => {
                let (tok, next) = string(&cs, i, Prefix::default())?;
                out.push(tok);
                i = next;
            }
            _ => {
                let rest: String = cs[i..cs.len().min(i + 3)].iter().collect();
                let op = OPS.iter().find(|op| rest.starts_with(**op))?;
                match *op {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => depth = depth.checked_sub(1)?,
                    _ => {}
                }
                out.push(Tok::Op(op));
                i += op.chars().count();
            }
        }
    }
    if depth != 0 {
        return None;
    }
    Some(out)
}

/// A number token starting at `i`: (token, next index).
fn number(cs: &[char], mut i: usize) -> Option<(Tok, usize)> {
    // Digits with single underscores between them.
    fn digitpart(cs: &[char], i: &mut usize, ok: impl Fn(char) -> bool, out: &mut String) -> bool {
        let start = *i;
        while *i < cs.len() {
            if ok(cs[*i]) {
                out.push(cs[*i]);
                *i += 1;
            } else if cs[*i] == '_' && *i > start && cs.get(*i + 1).is_some_and(|&c| ok(c)) {
                *i += 1;
            } else {
                break;
            }
        }
        *i > start
    }
    let end_ok = |cs: &[char], j: usize| !cs.get(j).is_some_and(|&c| is_id_continue(c) || c == '.');
    if cs[i] == '0' && matches!(cs.get(i + 1), Some('x' | 'X' | 'o' | 'O' | 'b' | 'B')) {
        let radix = match cs[i + 1] {
            'x' | 'X' => 16,
            'o' | 'O' => 8,
            _ => 2,
        };
        i += 2;
        if cs.get(i) == Some(&'_') {
            i += 1;
        }
        let mut d = String::new();
        if !digitpart(cs, &mut i, |c| c.is_digit(radix), &mut d) || !end_ok(cs, i) {
            return None;
        }
        return Some((Tok::Num(int_from_radix(&d, radix)), i));
    }
    let mut text = String::new();
    let int_digits = digitpart(cs, &mut i, |c| c.is_ascii_digit(), &mut text);
    let int_part = text.clone();
    let mut is_float = false;
    if cs.get(i) == Some(&'.') {
        is_float = true;
        text.push('.');
        i += 1;
        let mut frac = String::new();
        if cs.get(i).is_some_and(char::is_ascii_digit) {
            digitpart(cs, &mut i, |c| c.is_ascii_digit(), &mut frac);
        }
        if !int_digits && frac.is_empty() {
            return None;
        }
        text.push_str(&frac);
    }
    if matches!(cs.get(i), Some('e' | 'E')) {
        let mut j = i + 1;
        let mut exp = String::from("e");
        if let Some(&s @ ('+' | '-')) = cs.get(j) {
            exp.push(s);
            j += 1;
        }
        let mut d = String::new();
        if digitpart(cs, &mut j, |c| c.is_ascii_digit(), &mut d) {
            exp.push_str(&d);
            text.push_str(&exp);
            is_float = true;
            i = j;
        } else {
            return None; // "1e" / "1e+" is an invalid literal
        }
    }
    if matches!(cs.get(i), Some('j' | 'J')) {
        i += 1;
        if !end_ok(cs, i) {
            return None;
        }
        return Some((Tok::Num(PyVal::Complex), i));
    }
    if !end_ok(cs, i) {
        return None;
    }
    if is_float {
        let f: f64 = text.parse().ok()?;
        return Some((Tok::Num(PyVal::Float(f)), i));
    }
    // Decimal int: no leading zeros unless all zeros.
    if int_part.len() > 1 && int_part.starts_with('0') && int_part.chars().any(|c| c != '0') {
        return None;
    }
    if int_part.len() > INT_MAX_STR_DIGITS {
        return None; // CPython raises SyntaxError (int max str digits) at compile time
    }
    Some((Tok::Num(int_from_decimal(false, &int_part)), i))
}

#[derive(Default, Clone, Copy)]
struct Prefix {
    raw: bool,
    bytes: bool,
    fstr: bool,
}

fn string_prefix(word: &str) -> Option<Prefix> {
    let w = word.to_ascii_lowercase();
    let p = match w.as_str() {
        "r" => Prefix {
            raw: true,
            ..Prefix::default()
        },
        "u" => Prefix::default(),
        "b" => Prefix {
            bytes: true,
            ..Prefix::default()
        },
        "br" | "rb" => Prefix {
            raw: true,
            bytes: true,
            fstr: false,
        },
        "f" => Prefix {
            fstr: true,
            ..Prefix::default()
        },
        "fr" | "rf" => Prefix {
            raw: true,
            fstr: true,
            bytes: false,
        },
        _ => return None,
    };
    Some(p)
}

/// A string literal whose opening quote is at `i`.
fn string(cs: &[char], mut i: usize, p: Prefix) -> Option<(Tok, usize)> {
    let q = cs[i];
    let triple = cs.get(i + 1) == Some(&q) && cs.get(i + 2) == Some(&q);
    i += if triple { 3 } else { 1 };
    let mut text = String::new();
    loop {
        let c = *cs.get(i)?;
        if c == q && (!triple || (cs.get(i + 1) == Some(&q) && cs.get(i + 2) == Some(&q))) {
            i += if triple { 3 } else { 1 };
            break;
        }
        if (c == '\n' || c == '\r') && !triple {
            return None;
        }
        if p.bytes && !c.is_ascii() {
            return None;
        }
        if c != '\\' {
            text.push(c);
            i += 1;
            continue;
        }
        let e = *cs.get(i + 1)?;
        i += 2;
        if p.raw {
            text.push('\\');
            text.push(e);
            continue;
        }
        match e {
            '\n' => {}
            '\r' => {
                if cs.get(i) == Some(&'\n') {
                    i += 1;
                }
            }
            '\\' => text.push('\\'),
            '\'' => text.push('\''),
            '"' => text.push('"'),
            'a' => text.push('\u{7}'),
            'b' => text.push('\u{8}'),
            'f' => text.push('\u{c}'),
            'n' => text.push('\n'),
            'r' => text.push('\r'),
            't' => text.push('\t'),
            'v' => text.push('\u{b}'),
            '0'..='7' => {
                let mut v = e.to_digit(8)?;
                for _ in 0..2 {
                    match cs.get(i).and_then(|c| c.to_digit(8)) {
                        Some(d) => {
                            v = v * 8 + d;
                            i += 1;
                        }
                        None => break,
                    }
                }
                text.push(char::from_u32(v).unwrap_or('\u{fffd}'));
            }
            'x' | 'u' | 'U' if !(p.bytes && e != 'x') => {
                let n = match e {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let hex: String = cs.get(i..i + n)?.iter().collect();
                let v = u32::from_str_radix(&hex, 16).ok()?;
                if hex.len() != n || !hex.chars().all(|c| c.is_ascii_hexdigit()) || v > 0x10ffff {
                    return None;
                }
                i += n;
                // A lone surrogate stays one in Python; it cannot live in a Rust string.
                text.push(char::from_u32(v).unwrap_or('\u{fffd}'));
            }
            'N' if !p.bytes => return None, // \N{NAME}: no name table here (module docs)
            other => {
                text.push('\\');
                text.push(other);
            }
        }
    }
    let tok = Tok::Str {
        text: if p.bytes { None } else { Some(text) },
        fstr: p.fstr,
    };
    Some((tok, i))
}

/// The subset of Python's AST that `literal_eval` distinguishes.
#[derive(Debug)]
enum Node {
    Const(PyVal),
    Tuple(Vec<Node>),
    List(Vec<Node>),
    Set(Vec<Node>),
    Dict(Vec<(Node, Node)>),
    EmptySetCall,
    UnaryOp {
        op: &'static str,
        operand: Box<Node>,
    },
    /// `+` / `-` (others are `Other`); which one does not matter to `literal_eval`'s outcome.
    BinOp {
        left: Box<Node>,
        right: Box<Node>,
    },
    /// Valid syntax that is never a literal (names, f-strings, other operators).
    Other,
}

struct Parser<'a> {
    t: &'a [Tok],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.t.get(self.i)
    }

    fn op(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Op(o)) if *o == op) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// eval input: an expression list, then only NEWLINEs.
    fn top(&mut self) -> Option<Node> {
        let node = self.exprlist(&[])?;
        while matches!(self.peek(), Some(Tok::Newline)) {
            self.i += 1;
        }
        (self.i == self.t.len()).then_some(node)
    }

    fn starts_expr(&self) -> bool {
        match self.peek() {
            Some(Tok::Op(o)) => matches!(*o, "(" | "[" | "{" | "+" | "-" | "~" | "..."),
            Some(Tok::Newline) | None => false,
            _ => true,
        }
    }

    /// `a, b, c` (a tuple when there is a comma); `stop` ends it before a closer.
    fn exprlist(&mut self, stop: &[&str]) -> Option<Node> {
        let (mut items, comma) = self.exprlist_items(stop)?;
        Some(if comma {
            Node::Tuple(items)
        } else {
            items.pop()?
        })
    }

    /// The items of `a, b, c` and whether a comma was seen.
    fn exprlist_items(&mut self, stop: &[&str]) -> Option<(Vec<Node>, bool)> {
        let mut items = vec![self.expr()?];
        let mut comma = false;
        while self.op(",") {
            comma = true;
            if !self.starts_expr() || matches!(self.peek(), Some(Tok::Op(o)) if stop.contains(o)) {
                break;
            }
            items.push(self.expr()?);
        }
        Some((items, comma))
    }

    fn expr(&mut self) -> Option<Node> {
        let mut left = self.term()?;
        loop {
            if !(self.op("+") || self.op("-")) {
                return Some(left);
            }
            let right = self.term()?;
            left = Node::BinOp {
                left: Box::new(left),
                right: Box::new(right),
            };
        }
    }

    fn term(&mut self) -> Option<Node> {
        let mut left = self.factor()?;
        while ["*", "/", "//", "%", "@"].iter().any(|o| self.op(o)) {
            self.factor()?;
            left = Node::Other;
        }
        Some(left)
    }

    fn factor(&mut self) -> Option<Node> {
        for op in ["+", "-", "~"] {
            if self.op(op) {
                let operand = self.factor()?;
                return Some(Node::UnaryOp {
                    op,
                    operand: Box::new(operand),
                });
            }
        }
        let base = self.primary()?;
        if self.op("**") {
            self.factor()?;
            return Some(Node::Other);
        }
        Some(base)
    }

    fn primary(&mut self) -> Option<Node> {
        let is_set_name = matches!(self.peek(), Some(Tok::Name(n)) if n == "set");
        let mut node = self.atom()?;
        let mut first = true;
        loop {
            if self.op("(") {
                if is_set_name && first && self.op(")") {
                    node = Node::EmptySetCall;
                } else {
                    if !self.op(")") {
                        self.exprlist(&[")"])?;
                        if !self.op(")") {
                            return None;
                        }
                    }
                    node = Node::Other;
                }
            } else if self.op("[") {
                self.exprlist(&["]"])?;
                if !self.op("]") {
                    return None;
                }
                node = Node::Other;
            } else if self.op(".") {
                match self.peek() {
                    Some(Tok::Name(_)) => self.i += 1,
                    _ => return None,
                }
                node = Node::Other;
            } else {
                return Some(node);
            }
            first = false;
        }
    }

    fn atom(&mut self) -> Option<Node> {
        let tok = self.peek()?.clone();
        self.i += 1;
        match tok {
            Tok::Num(v) => Some(Node::Const(v)),
            Tok::Name(n) => Some(match n.as_str() {
                "True" => Node::Const(PyVal::Bool(true)),
                "False" => Node::Const(PyVal::Bool(false)),
                "None" => Node::Const(PyVal::None),
                _ => Node::Other,
            }),
            Tok::Str { text, fstr } => {
                // Implicit concatenation; bytes cannot mix with str.
                let (mut text, mut any_f) = (text, fstr);
                let is_bytes = text.is_none();
                while let Some(Tok::Str { text: t, fstr: f }) = self.peek().cloned() {
                    if t.is_none() != is_bytes {
                        return None;
                    }
                    if let (Some(a), Some(b)) = (text.as_mut(), t) {
                        a.push_str(&b);
                    }
                    any_f |= f;
                    self.i += 1;
                }
                Some(match (any_f, text) {
                    (true, _) => Node::Other,
                    (false, Some(s)) => Node::Const(PyVal::Str(s)),
                    (false, None) => Node::Const(PyVal::Bytes),
                })
            }
            Tok::Op("...") => Some(Node::Const(PyVal::Ellipsis)),
            Tok::Op("(") => {
                if self.op(")") {
                    return Some(Node::Tuple(Vec::new()));
                }
                let inner = self.exprlist(&[")"])?;
                self.op(")").then_some(inner)
            }
            Tok::Op("[") => {
                if self.op("]") {
                    return Some(Node::List(Vec::new()));
                }
                let (items, _) = self.exprlist_items(&["]"])?;
                self.op("]").then_some(Node::List(items))
            }
            Tok::Op("{") => {
                if self.op("}") {
                    return Some(Node::Dict(Vec::new()));
                }
                let first = self.expr()?;
                if self.op(":") {
                    let mut pairs = vec![(first, self.expr()?)];
                    while self.op(",") {
                        if matches!(self.peek(), Some(Tok::Op("}"))) {
                            break;
                        }
                        let k = self.expr()?;
                        if !self.op(":") {
                            return None;
                        }
                        pairs.push((k, self.expr()?));
                    }
                    self.op("}").then_some(Node::Dict(pairs))
                } else {
                    let mut items = vec![first];
                    while self.op(",") {
                        if matches!(self.peek(), Some(Tok::Op("}"))) {
                            break;
                        }
                        items.push(self.expr()?);
                    }
                    self.op("}").then_some(Node::Set(items))
                }
            }
            _ => None,
        }
    }
}

enum Fail {
    /// `ValueError: malformed node or string`.
    Malformed,
    /// `TypeError: unhashable type`.
    Unhashable,
}

/// `literal_eval`'s `_convert`, in its evaluation order.
fn convert(n: &Node) -> Result<PyVal, Fail> {
    match n {
        Node::Const(v) => Ok(v.clone()),
        Node::Tuple(items) => Ok(PyVal::Tuple(
            items.iter().map(convert).collect::<Result<_, _>>()?,
        )),
        Node::List(items) => Ok(PyVal::List(
            items.iter().map(convert).collect::<Result<_, _>>()?,
        )),
        Node::Set(items) => {
            let mut pairs = Vec::new();
            for item in items {
                let v = convert(item)?;
                if !hashable(&v) {
                    return Err(Fail::Unhashable);
                }
                dict_insert(&mut pairs, v, PyVal::None);
            }
            Ok(PyVal::Set)
        }
        Node::EmptySetCall => Ok(PyVal::Set),
        Node::Dict(pairs) => {
            let mut out = Vec::new();
            for (k, v) in pairs {
                let k = convert(k)?;
                let v = convert(v)?;
                if !hashable(&k) {
                    return Err(Fail::Unhashable);
                }
                dict_insert(&mut out, k, v);
            }
            Ok(PyVal::Dict(out))
        }
        Node::BinOp { left, right } => {
            let l = signed_num(left)?;
            let r = num(right)?;
            if matches!(l, PyVal::Int { .. } | PyVal::Float(_)) && matches!(r, PyVal::Complex) {
                Ok(PyVal::Complex)
            } else {
                Err(Fail::Malformed)
            }
        }
        _ => signed_num(n),
    }
}

fn signed_num(n: &Node) -> Result<PyVal, Fail> {
    if let Node::UnaryOp {
        op: op @ ("+" | "-"),
        operand,
    } = n
    {
        let v = num(operand)?;
        if *op == "+" {
            return Ok(v);
        }
        return Ok(match v {
            PyVal::Int { neg, digits } => PyVal::Int {
                neg: !neg && digits != "0",
                digits,
            },
            PyVal::Float(f) => PyVal::Float(-f),
            other => other,
        });
    }
    num(n)
}

fn num(n: &Node) -> Result<PyVal, Fail> {
    match n {
        Node::Const(v @ (PyVal::Int { .. } | PyVal::Float(_) | PyVal::Complex)) => Ok(v.clone()),
        _ => Err(Fail::Malformed),
    }
}
