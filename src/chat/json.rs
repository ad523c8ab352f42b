//! Python `json.dumps` over template values (transformers' `tojson` filter), and
//! `serde_json::Value` → template values with key order kept.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// A JSON value as the template sees it (objects keep their key order).
pub(crate) fn to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::from(()),
        serde_json::Value::Bool(b) => Value::from(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::from(a.iter().map(to_value).collect::<Vec<_>>()),
        serde_json::Value::Object(o) => Value::from_pairs(
            o.iter()
                .map(|(k, v)| (Value::from(k.as_str()), to_value(v))),
        ),
    }
}

pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    pub indent: Option<String>,
    pub separators: (String, String),
    pub sort_keys: bool,
}

/// Python's `repr(float)` as `json.dumps` writes it.
pub(crate) fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Shortest round-trip digits and decimal exponent.
    let e = format!("{:e}", f.abs());
    let (mant, exp) = e.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("exponent");
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let s = if exp >= 0 {
            if n > exp + 1 {
                format!(
                    "{}.{}",
                    &digits[..(exp + 1) as usize],
                    &digits[(exp + 1) as usize..]
                )
            } else {
                format!("{}{}.0", digits, "0".repeat((exp + 1 - n) as usize))
            }
        } else {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let es = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

fn dump_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn newline(opts: &DumpOptions, level: usize, out: &mut String) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn bad(msg: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg)
}

pub(crate) fn dump(
    v: &Value,
    opts: &DumpOptions,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&py_float(f));
            }
        }
        ValueKind::String => dump_str(v.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.separators.0);
                }
                newline(opts, level + 1, out);
                dump(item, opts, level + 1, out)?;
            }
            newline(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.separators.0);
                }
                newline(opts, level + 1, out);
                match k.kind() {
                    ValueKind::String => {
                        dump_str(k.as_str().unwrap_or_default(), opts.ensure_ascii, out)
                    }
                    ValueKind::Bool => {
                        out.push_str(if k.is_true() { "\"true\"" } else { "\"false\"" })
                    }
                    ValueKind::None => out.push_str("\"null\""),
                    ValueKind::Number => {
                        out.push('"');
                        if k.is_integer() {
                            out.push_str(&k.to_string());
                        } else {
                            out.push_str(&py_float(f64::try_from(k.clone())?));
                        }
                        out.push('"');
                    }
                    _ => {
                        return Err(bad(format!(
                            "tojson: keys must be str, int, float, bool or None, not {k}"
                        )));
                    }
                }
                out.push_str(&opts.separators.1);
                dump(&v.get_item(k)?, opts, level + 1, out)?;
            }
            newline(opts, level, out);
            out.push('}');
        }
        _ => {
            return Err(bad(format!(
                "tojson: object of kind {} is not JSON serializable",
                v.kind()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::py_float;

    #[test]
    fn python_float_repr() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (123.456, "123.456"),
            (1.5e300, "1.5e+300"),
            (0.1 + 0.2, "0.30000000000000004"),
        ] {
            assert_eq!(py_float(f), s, "{f}");
        }
    }
}
