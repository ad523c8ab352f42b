//! Argument-value coercion of vLLM's `PoolsideV1ToolParser._deserialize`, and Python's
//! `json.dumps(..., ensure_ascii=False)` that serialises the result.
//!
//! The reference (vllm 0.33.0 `tool_parsers/poolside_v1_tool_parser.py`, CPython 3.11):
//!
//! ```text
//! _deserialize(v):  json.loads(v)            -> value      (JSONDecodeError: next)
//!                   ast.literal_eval(v)      -> value      (ValueError/SyntaxError: next)
//!                   v                        (the raw string)
//! ```
//!
//! Any other exception escapes `_deserialize`; so does a `TypeError` from `json.dumps` on a
//! value JSON cannot hold (set, bytes, complex, `...`, tuple keys). In the non-streaming
//! path that makes vLLM drop every tool call of the message and return the text as content
//! ([`Coerced::Fatal`]). Values are kept as [`PyVal`] (Python objects) because JSON numbers
//! here are Python ints of any size and floats that may be NaN or infinite, and dict keys
//! merge by Python equality (`1`, `1.0` and `True` are one key).

use super::pyliteral;

/// CPython's `sys.get_int_max_str_digits()` default: converting a longer int to or from
/// decimal raises `ValueError`.
pub(crate) const INT_MAX_STR_DIGITS: usize = 4300;

/// A Python value as produced by `json.loads` or `ast.literal_eval`.
#[derive(Debug, Clone)]
pub(crate) enum PyVal {
    None,
    Bool(bool),
    /// Sign and decimal digits without leading zeros ("0" for zero, never negative zero).
    Int {
        neg: bool,
        digits: String,
    },
    Float(f64),
    Str(String),
    List(Vec<PyVal>),
    Tuple(Vec<PyVal>),
    /// Insertion-ordered; keys unique under Python equality.
    Dict(Vec<(PyVal, PyVal)>),
    /// A set (its members only matter for hashing while it is built).
    Set,
    /// Values JSON cannot serialise; their contents never matter.
    Bytes,
    Complex,
    Ellipsis,
}

/// Outcome of `_deserialize` on one (already stripped) argument value.
#[derive(Debug)]
pub(crate) enum Coerced {
    Value(PyVal),
    /// Neither JSON nor a Python literal: the raw string is kept.
    Raw,
    /// An exception the reference does not catch here (see the module docs).
    Fatal,
}

/// `_deserialize`: `json.loads`, then `ast.literal_eval`, then the raw string.
pub(crate) fn deserialize(s: &str) -> Coerced {
    match json_loads(s) {
        Ok(v) => Coerced::Value(v),
        Err(JsonError::Fatal) => Coerced::Fatal,
        Err(JsonError::Decode) => pyliteral::literal_eval(s),
    }
}

/// `json.dumps(v, ensure_ascii=False)` appended to `out`; `Err` where Python raises.
pub(crate) fn dumps(v: &PyVal, out: &mut String) -> Result<(), ()> {
    match v {
        PyVal::None => out.push_str("null"),
        PyVal::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        PyVal::Int { neg, digits } => {
            if digits.len() > INT_MAX_STR_DIGITS {
                return Err(());
            }
            if *neg {
                out.push('-');
            }
            out.push_str(digits);
        }
        PyVal::Float(f) => float_json(*f, out),
        PyVal::Str(s) => dump_str(s, out),
        PyVal::List(items) | PyVal::Tuple(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dumps(item, out)?;
            }
            out.push(']');
        }
        PyVal::Dict(pairs) => {
            out.push('{');
            for (i, (k, item)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                // The C encoder's key rules: str as is; float, bool, None, int stringified.
                match k {
                    PyVal::Str(s) => dump_str(s, out),
                    PyVal::Float(_) | PyVal::Bool(_) | PyVal::None | PyVal::Int { .. } => {
                        let mut key = String::new();
                        dumps(k, &mut key)?;
                        dump_str(&key, out);
                    }
                    _ => return Err(()),
                }
                out.push_str(": ");
                dumps(item, out)?;
            }
            out.push('}');
        }
        PyVal::Set | PyVal::Bytes | PyVal::Complex | PyVal::Ellipsis => return Err(()),
    }
    Ok(())
}

/// A JSON string literal the way `json.dumps(ensure_ascii=False)` writes it.
pub(crate) fn dump_str(s: &str, out: &mut String) {
    out.push('"');
    escape_into(s, out);
    out.push('"');
}

/// The inside of a JSON string literal (`json.dumps(s, ensure_ascii=False)[1:-1]`).
pub(crate) fn escape_into(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
}

/// `float.__repr__` (and json's NaN / Infinity spellings).
fn float_json(f: f64, out: &mut String) {
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&float_repr(f));
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional when the decimal
/// exponent is in [-4, 16), else `d.ddde±XX` (CPython `format_float_short`, mode 'r').
pub(crate) fn float_repr(f: f64) -> String {
    // Rust's `{:e}` gives the same shortest round-trip digits: "d.ddde-7".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let neg = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let decpt = exp + 1; // value = 0.DIGITS × 10^decpt
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    let n = digits.len() as i32;
    if -4 < decpt && decpt <= 16 {
        if decpt <= 0 {
            s.push_str("0.");
            s.extend(std::iter::repeat_n('0', (-decpt) as usize));
            s.push_str(&digits);
        } else if decpt >= n {
            s.push_str(&digits);
            s.extend(std::iter::repeat_n('0', (decpt - n) as usize));
            s.push_str(".0");
        } else {
            s.push_str(&digits[..decpt as usize]);
            s.push('.');
            s.push_str(&digits[decpt as usize..]);
        }
    } else {
        s.push_str(&digits[..1]);
        if n > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let e = decpt - 1;
        s.push_str(&format!("e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs()));
    }
    s
}

/// An int from decimal digits (no sign, may have leading zeros).
pub(crate) fn int_from_decimal(neg: bool, digits: &str) -> PyVal {
    let trimmed = digits.trim_start_matches('0');
    let digits = if trimmed.is_empty() { "0" } else { trimmed };
    PyVal::Int {
        neg: neg && digits != "0",
        digits: digits.to_string(),
    }
}

/// An int from digits in base 2, 8 or 16 (already validated), as decimal.
pub(crate) fn int_from_radix(digits: &str, radix: u32) -> PyVal {
    // Little-endian base-1e9 limbs; quadratic, fine for argument-sized literals.
    let mut limbs: Vec<u64> = vec![0];
    for c in digits.chars() {
        let d = c.to_digit(radix).expect("validated digit") as u64;
        let mut carry = d;
        for limb in limbs.iter_mut() {
            let v = *limb * radix as u64 + carry;
            *limb = v % 1_000_000_000;
            carry = v / 1_000_000_000;
        }
        if carry > 0 {
            limbs.push(carry);
        }
    }
    let mut s = limbs.last().expect("one limb").to_string();
    for limb in limbs.iter().rev().skip(1) {
        s.push_str(&format!("{limb:09}"));
    }
    int_from_decimal(false, &s)
}

/// Python `==` between dict keys / set members (only hashable values reach here).
pub(crate) fn py_eq(a: &PyVal, b: &PyVal) -> bool {
    use PyVal::*;
    match (a, b) {
        (None, None) => true,
        (Str(x), Str(y)) => x == y,
        (Tuple(x), Tuple(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q)),
        (Bool(_) | Int { .. } | Float(_), Bool(_) | Int { .. } | Float(_)) => num_eq(a, b),
        _ => false,
    }
}

fn num_eq(a: &PyVal, b: &PyVal) -> bool {
    // Exact comparison, as Python does between int and float.
    fn as_int(v: &PyVal) -> Option<(bool, String)> {
        match v {
            PyVal::Bool(b) => Some((false, if *b { "1" } else { "0" }.into())),
            PyVal::Int { neg, digits } => Some((*neg, digits.clone())),
            PyVal::Float(f) if f.is_finite() && f.fract() == 0.0 => {
                let s = format!("{:.0}", f.abs());
                Some((*f < 0.0 && s != "0", s))
            }
            _ => Option::None,
        }
    }
    match (a, b) {
        (PyVal::Float(x), PyVal::Float(y)) => x == y,
        _ => matches!((as_int(a), as_int(b)), (Some(x), Some(y)) if x == y),
    }
}

/// Whether Python can hash the value (a dict key or set member).
pub(crate) fn hashable(v: &PyVal) -> bool {
    match v {
        PyVal::List(_) | PyVal::Dict(_) | PyVal::Set => false,
        PyVal::Tuple(items) => items.iter().all(hashable),
        _ => true,
    }
}

#[derive(Debug, PartialEq)]
pub(crate) enum JsonError {
    /// `json.JSONDecodeError`.
    Decode,
    /// Another exception (an int over [`INT_MAX_STR_DIGITS`] digits).
    Fatal,
}

/// CPython's `json.loads` (C scanner, `strict=True`): NaN / Infinity / -Infinity accepted,
/// ints of any size, duplicate keys keep the first position and the last value. A lone
/// surrogate escape (`"\ud800"`) becomes U+FFFD (Python keeps the lone surrogate).
pub(crate) fn json_loads(s: &str) -> Result<PyVal, JsonError> {
    let mut p = Json {
        b: s.as_bytes(),
        s,
        i: 0,
    };
    p.ws();
    let v = p.value()?;
    p.ws();
    if p.i != p.b.len() {
        return Err(JsonError::Decode);
    }
    Ok(v)
}

struct Json<'a> {
    b: &'a [u8],
    s: &'a str,
    i: usize,
}

impl Json<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.b[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<PyVal, JsonError> {
        let Some(&c) = self.b.get(self.i) else {
            return Err(JsonError::Decode);
        };
        match c {
            b'{' => self.object(),
            b'[' => self.array(),
            b'"' => Ok(PyVal::Str(self.string()?)),
            b'n' if self.eat("null") => Ok(PyVal::None),
            b't' if self.eat("true") => Ok(PyVal::Bool(true)),
            b'f' if self.eat("false") => Ok(PyVal::Bool(false)),
            b'N' if self.eat("NaN") => Ok(PyVal::Float(f64::NAN)),
            b'I' if self.eat("Infinity") => Ok(PyVal::Float(f64::INFINITY)),
            b'-' if self.b[self.i..].starts_with(b"-Infinity") => {
                self.i += 9;
                Ok(PyVal::Float(f64::NEG_INFINITY))
            }
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(JsonError::Decode),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.i < self.b.len() && self.b[self.i].is_ascii_digit() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<PyVal, JsonError> {
        // -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?
        let start = self.i;
        let neg = self.b[self.i] == b'-';
        if neg {
            self.i += 1;
        }
        let int_start = self.i;
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(JsonError::Decode),
        }
        let int_end = self.i;
        let mut is_float = false;
        if self.b.get(self.i) == Some(&b'.') {
            let save = self.i;
            self.i += 1;
            if self.digits() == 0 {
                self.i = save;
            } else {
                is_float = true;
            }
        }
        if matches!(self.b.get(self.i), Some(b'e' | b'E')) {
            let save = self.i;
            self.i += 1;
            if matches!(self.b.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                self.i = save;
            } else {
                is_float = true;
            }
        }
        if is_float {
            let f: f64 = self.s[start..self.i]
                .parse()
                .map_err(|_| JsonError::Decode)?;
            Ok(PyVal::Float(f))
        } else {
            let digits = &self.s[int_start..int_end];
            if digits.len() > INT_MAX_STR_DIGITS {
                return Err(JsonError::Fatal);
            }
            Ok(int_from_decimal(neg, digits))
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let h = self.b.get(self.i..self.i + 4).ok_or(JsonError::Decode)?;
        let mut v = 0u32;
        for &c in h {
            v = v * 16 + (c as char).to_digit(16).ok_or(JsonError::Decode)?;
        }
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.i += 1; // opening quote
        let mut out = String::new();
        loop {
            let rest = &self.s[self.i..];
            let Some(c) = rest.chars().next() else {
                return Err(JsonError::Decode);
            };
            self.i += c.len_utf8();
            match c {
                '"' => return Ok(out),
                c if (c as u32) < 0x20 => return Err(JsonError::Decode),
                '\\' => {
                    let Some(&e) = self.b.get(self.i) else {
                        return Err(JsonError::Decode);
                    };
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let u = self.hex4()?;
                            let cp = if (0xd800..0xdc00).contains(&u)
                                && self.b[self.i..].starts_with(b"\\u")
                            {
                                let save = self.i;
                                self.i += 2;
                                let lo = self.hex4()?;
                                if (0xdc00..0xe000).contains(&lo) {
                                    0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00)
                                } else {
                                    self.i = save;
                                    u
                                }
                            } else {
                                u
                            };
                            out.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                        }
                        _ => return Err(JsonError::Decode),
                    }
                }
                c => out.push(c),
            }
        }
    }

    fn array(&mut self) -> Result<PyVal, JsonError> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat("]") {
            return Ok(PyVal::List(items));
        }
        loop {
            self.ws();
            items.push(self.value()?);
            self.ws();
            if self.eat("]") {
                return Ok(PyVal::List(items));
            }
            if !self.eat(",") {
                return Err(JsonError::Decode);
            }
        }
    }

    fn object(&mut self) -> Result<PyVal, JsonError> {
        self.i += 1;
        let mut pairs: Vec<(PyVal, PyVal)> = Vec::new();
        self.ws();
        if self.eat("}") {
            return Ok(PyVal::Dict(pairs));
        }
        loop {
            self.ws();
            if self.b.get(self.i) != Some(&b'"') {
                return Err(JsonError::Decode);
            }
            let key = PyVal::Str(self.string()?);
            self.ws();
            if !self.eat(":") {
                return Err(JsonError::Decode);
            }
            self.ws();
            let v = self.value()?;
            dict_insert(&mut pairs, key, v);
            self.ws();
            if self.eat("}") {
                return Ok(PyVal::Dict(pairs));
            }
            if !self.eat(",") {
                return Err(JsonError::Decode);
            }
        }
    }
}

/// `d[key] = v`: an equal key keeps its first position and object, takes the new value.
pub(crate) fn dict_insert(pairs: &mut Vec<(PyVal, PyVal)>, key: PyVal, v: PyVal) {
    if let Some(slot) = pairs.iter_mut().find(|(k, _)| py_eq(k, &key)) {
        slot.1 = v;
    } else {
        pairs.push((key, v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coerce(s: &str) -> String {
        match deserialize(s) {
            Coerced::Value(v) => {
                let mut out = String::new();
                match dumps(&v, &mut out) {
                    Ok(()) => out,
                    Err(()) => "FATAL".into(),
                }
            }
            Coerced::Raw => "RAW".into(),
            Coerced::Fatal => "FATAL".into(),
        }
    }

    #[test]
    fn float_repr_matches_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (2.5e-7, "2.5e-07"),
            (-0.0, "-0.0"),
            (123.456, "123.456"),
            (-2.5e300, "-2.5e+300"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
        ] {
            assert_eq!(float_repr(f), s, "{f}");
        }
    }

    #[test]
    fn json_then_literal_then_raw() {
        assert_eq!(coerce("[1, 2.0, \"a\"]"), "[1, 2.0, \"a\"]");
        assert_eq!(coerce("{\"a\":1,\"b\":2,\"a\":3}"), "{\"a\": 3, \"b\": 2}");
        assert_eq!(coerce("-0"), "0");
        assert_eq!(coerce("1E400"), "Infinity");
        assert_eq!(coerce("(1, 'x')"), "[1, \"x\"]");
        assert_eq!(coerce("0xff"), "255");
        assert_eq!(coerce("{1, 2}"), "FATAL");
        assert_eq!(coerce("hello world"), "RAW");
        assert_eq!(coerce("[1, 2"), "RAW");
        assert_eq!(coerce(&"9".repeat(4301)), "FATAL");
    }

    /// Expected values printed by CPython 3.11 (`json.loads` → `ast.literal_eval` → raw).
    #[test]
    fn python_literal_spellings() {
        for (src, want) in [
            ("1.e5", "100000.0"),
            ("1_0.5e-1_0", "1.05e-09"),
            ("0_0", "0"),
            ("0x_1f", "31"),
            ("1.5j", "FATAL"),
            ("-(1)", "-1"),
            ("- 1", "-1"),
            ("+1.5", "1.5"),
            ("\"\\ud83d\\ude00\"", "\"😀\""),
            ("[1, 2,]", "[1, 2]"),
            ("\"\\x41\" 'b'", "\"Ab\""),
            ("{(1, 2): 3}", "FATAL"),
            ("((1),)", "[1]"),
            ("1,", "[1]"),
            ("'''a\nb'''", "\"a\\nb\""),
            ("0.1e-3_0", "1e-31"),
            ("007", "RAW"),
            ("1__0", "RAW"),
            ("--1", "RAW"),
            ("-True", "RAW"),
            ("1 + 2", "RAW"),
            ("[1, x]", "RAW"),
            ("{[1]: x}", "RAW"),
            ("[{[1]: 2}, x]", "FATAL"),
        ] {
            assert_eq!(coerce(src), want, "{src:?}");
        }
    }

    #[test]
    fn radix_ints_convert_exactly() {
        let v = int_from_radix("ffffffffffffffffffff", 16);
        let mut s = String::new();
        dumps(&v, &mut s).unwrap();
        assert_eq!(s, "1208925819614629174706175");
    }
}
