//! Chat templates: a checkpoint's own Jinja template rendered with `minijinja` exactly as
//! transformers' `apply_chat_template` renders it (spec/laguna.md §7.2).
//!
//! transformers' environment is reproduced: `trim_blocks` + `lstrip_blocks`, loop controls,
//! `raise_exception`, `strftime_now`, its own `tojson` (Python `json.dumps`, `ensure_ascii`
//! off by default, keys in insertion order), Python string/dict methods (minijinja-contrib
//! `pycompat`), the `{% generation %}` block (rendered as its body), and the message
//! preprocessing (`reasoning_content` / `thinking` / `reasoning` aliased to each other).

mod json;

use std::fmt;
use std::path::Path;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};

/// Metadata key of the template in GGUF files.
pub const GGUF_KEY: &str = "tokenizer.chat_template";

/// Why a template could not be loaded or rendered.
#[derive(Debug)]
pub enum ChatError {
    /// The checkpoint has no chat template.
    Missing(String),
    /// A file could not be read or parsed.
    Io(String),
    /// The template does not compile.
    Syntax(String),
    /// Rendering failed (including the template's own `raise_exception`).
    Render(String),
}

impl fmt::Display for ChatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChatError::Missing(s) => write!(f, "no chat template: {s}"),
            ChatError::Io(s) => write!(f, "chat template: {s}"),
            ChatError::Syntax(s) => write!(f, "chat template syntax: {s}"),
            ChatError::Render(s) => write!(f, "chat template render: {s}"),
        }
    }
}

impl std::error::Error for ChatError {}

fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("len", &self.source.len())
            .finish()
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles a template's text.
    #[allow(clippy::should_implement_trait)]
    pub fn from_str(template: &str) -> Result<ChatTemplate, ChatError> {
        let source = template.to_owned();
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| ChatError::Syntax(describe(&e)))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, strip_generation_tags(&source))
            .map_err(|e| ChatError::Syntax(describe(&e)))?;
        Ok(ChatTemplate { env, source })
    }

    /// The template's text as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The template of a GGUF file's metadata (`tokenizer.chat_template`).
    pub fn from_gguf_metadata(
        metadata: &[(String, lagoon_gguf::gguf::Value)],
    ) -> Result<ChatTemplate, ChatError> {
        let text = metadata
            .iter()
            .find(|(k, _)| k == GGUF_KEY)
            .and_then(|(_, v)| v.as_str())
            .ok_or_else(|| ChatError::Missing(format!("GGUF metadata has no string {GGUF_KEY}")))?;
        ChatTemplate::from_str(text)
    }

    /// The template of a HF checkpoint directory: `chat_template.jinja`, else the
    /// `chat_template` of `tokenizer_config.json` (a string, or a list of named templates of
    /// which `default` is taken).
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<ChatTemplate, ChatError> {
        let dir = dir.as_ref();
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let text = std::fs::read_to_string(&jinja)
                .map_err(|e| ChatError::Io(format!("{}: {e}", jinja.display())))?;
            return ChatTemplate::from_str(&text);
        }
        let cfg_path = dir.join("tokenizer_config.json");
        let bytes = std::fs::read(&cfg_path)
            .map_err(|e| ChatError::Missing(format!("{}: {e}", cfg_path.display())))?;
        let cfg: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ChatError::Io(format!("{}: {e}", cfg_path.display())))?;
        let text = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.as_str()),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str()),
            _ => None,
        };
        let text = text.ok_or_else(|| {
            ChatError::Missing(format!("{} has no chat_template", cfg_path.display()))
        })?;
        ChatTemplate::from_str(text)
    }

    /// The template of an opened checkpoint (GGUF metadata or HF directory).
    pub fn from_checkpoint(ckpt: &lagoon_gguf::Checkpoint) -> Result<ChatTemplate, ChatError> {
        match &ckpt.source {
            lagoon_gguf::Source::Gguf { metadata, .. } => {
                ChatTemplate::from_gguf_metadata(metadata)
            }
            lagoon_gguf::Source::Hf { dir, .. } => ChatTemplate::from_hf_dir(dir),
        }
    }

    /// Renders a conversation as `apply_chat_template(messages, tools=tools,
    /// tokenize=False, add_generation_prompt=..., enable_thinking=...)` does;
    /// `enable_thinking: None` passes no such variable (the template's default applies).
    pub fn render(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        enable_thinking: Option<bool>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let messages = match messages {
            serde_json::Value::Array(list) => {
                for m in list {
                    if !m.is_object() {
                        return Err(ChatError::Render(format!(
                            "chat messages should be objects, got {m}"
                        )));
                    }
                }
                Value::from(list.iter().map(alias_reasoning).collect::<Vec<_>>())
            }
            other => {
                return Err(ChatError::Render(format!(
                    "messages should be a list, got {other}"
                )));
            }
        };
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", messages),
            ("tools", tools.map_or(Value::from(()), json::to_value)),
            ("documents", Value::from(())),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        if let Some(t) = enable_thinking {
            ctx.push(("enable_thinking", Value::from(t)));
        }
        let ctx = Value::from_pairs(ctx);
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Syntax(describe(&e)))?;
        tmpl.render(ctx)
            .map_err(|e| ChatError::Render(describe(&e)))
    }
}

/// transformers' `_alias_reasoning_fields`: the first non-null of `reasoning_content`,
/// `thinking`, `reasoning` is also given as `thinking` (first key unless present) and
/// `reasoning_content`.
fn alias_reasoning(m: &serde_json::Value) -> Value {
    let obj = m.as_object().expect("checked");
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| obj.get(*k).filter(|v| !v.is_null()));
    let Some(reasoning) = reasoning else {
        return json::to_value(m);
    };
    let mut pairs: Vec<(String, Value)> = Vec::with_capacity(obj.len() + 2);
    if !obj.contains_key("thinking") {
        pairs.push(("thinking".into(), json::to_value(reasoning)));
    }
    for (k, v) in obj {
        let v = if k == "reasoning_content" {
            reasoning
        } else {
            v
        };
        pairs.push((k.clone(), json::to_value(v)));
    }
    if !obj.contains_key("reasoning_content") {
        pairs.push(("reasoning_content".into(), json::to_value(reasoning)));
    }
    Value::from_pairs(pairs)
}

/// transformers' `{% generation %}…{% endgeneration %}` (AssistantTracker) renders its body
/// unchanged: turn the tags into an always-true `if` with the same whitespace control.
fn strip_generation_tags(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(i) = rest.find("{%") {
        out.push_str(&rest[..i]);
        let tag = &rest[i..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.chars().next() {
            Some(c @ ('-' | '+')) => (Some(c), &inner[1..]),
            _ => (None, inner),
        };
        let (body, trail) = match body.chars().last() {
            Some(c @ ('-' | '+')) => (&body[..body.len() - 1], Some(c)),
            _ => (body, None),
        };
        let word = body.trim();
        let repl = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match repl {
            Some(r) => {
                out.push_str("{%");
                if let Some(c) = lead {
                    out.push(c);
                }
                out.push(' ');
                out.push_str(r);
                out.push(' ');
                if let Some(c) = trail {
                    out.push(c);
                }
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => {
            if let Some(s) = v.as_str() {
                Some(s.to_owned())
            } else {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be int or str",
                    )
                })?;
                Some(" ".repeat(n.max(0) as usize))
            }
        }
    };
    let separators = match separators {
        Some(v) if !v.is_none() => {
            let item = v.get_item(&Value::from(0))?;
            let key = v.get_item(&Value::from(1))?;
            match (item.as_str(), key.as_str()) {
                (Some(a), Some(b)) => Some((a.to_owned(), b.to_owned())),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ));
                }
            }
        }
        _ => None,
    };
    let opts = json::DumpOptions {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        separators: separators.unwrap_or_else(|| {
            if indent.is_some() {
                (",".into(), ": ".into())
            } else {
                (", ".into(), ": ".into())
            }
        }),
        indent,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    json::dump(&value, &opts, 0, &mut out)?;
    Ok(Value::from(out))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `datetime.now().strftime(format)` for the usual directives, in UTC.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime(secs, &format)
}

fn civil(days: i64) -> (i64, u32, u32) {
    // Howard Hinnant's days_from_civil inverse.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

pub(crate) fn strftime(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
    let wd = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let jan1 = days - {
        let mut doy = 0i64;
        for mo in 1..m {
            doy += match mo {
                2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
        }
        doy + d as i64 - 1
    };
    let yday = days - jan1 + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hh + 11) % 12 + 1)),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') | Some('h') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[wd]),
            Some('a') => out.push_str(&DAYS[wd][..3]),
            Some('u') => out.push_str(&(wd + 1).to_string()),
            Some('w') => out.push_str(&((wd + 1) % 7).to_string()),
            Some('F') => out.push_str(&format!("{y}-{m:02}-{d:02}")),
            Some('T') => out.push_str(&format!("{hh:02}:{mm:02}:{ss:02}")),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_date() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(
            strftime(t, "%Y-%m-%d %H:%M:%S %a %A %b %B %j %I%p %%"),
            "2024-02-29 13:05:09 Thu Thursday Feb February 060 01PM %"
        );
    }

    #[test]
    fn generation_tags() {
        assert_eq!(
            strip_generation_tags("a{%- generation -%}b{% endgeneration %}{{ x }}{%+generation+%}"),
            "a{%- if true -%}b{% endif %}{{ x }}{%+ if true +%}"
        );
    }
}
