//! Python's way of turning values into text, which HF chat templates rely on: `str()` (`True`,
//! `None`, `0.001`, `{'a': 1}`), and transformers' `tojson` (`json.dumps` with `", "`/`": "`
//! separators, `ensure_ascii=False`, keys in insertion order, no HTML escaping).
//!
//! Output goes through a [`Sink`] that charges the template's fuel as it grows and stops at the
//! output limit, so a small value referenced many times cannot be expanded into gigabytes.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, State, Value};

/// Bytes written between fuel charges (minijinja charges one fuel per 64 bytes).
const CHARGE_EVERY: usize = 4096;

/// A growing string that pays for itself.
pub(crate) struct Sink<'s, 'e> {
    pub(crate) buf: String,
    state: Option<&'s State<'s, 'e>>,
    limit: usize,
    uncharged: usize,
}

impl<'s, 'e> Sink<'s, 'e> {
    pub(crate) fn new(state: Option<&'s State<'s, 'e>>, limit: usize) -> Self {
        Sink {
            buf: String::new(),
            state,
            limit,
            uncharged: 0,
        }
    }

    pub(crate) fn push(&mut self, s: &str) -> Result<(), Error> {
        if self.buf.len() + s.len() > self.limit {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "value text longer than the output limit of {} bytes",
                    self.limit
                ),
            ));
        }
        self.buf.push_str(s);
        self.uncharged += s.len();
        if self.uncharged >= CHARGE_EVERY {
            if let Some(state) = self.state {
                state.consume_fuel((self.uncharged / 64) as u64)?;
            }
            self.uncharged %= 64;
        }
        Ok(())
    }

    fn push_char(&mut self, c: char) -> Result<(), Error> {
        self.push(c.encode_utf8(&mut [0; 4]))
    }
}

/// Python `repr(float)`: shortest round-trip digits, scientific below 1e-4 and from 1e16 on.
pub(crate) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` also prints the shortest round-trip digits: only the layout differs.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if !(-4..16).contains(&exp) {
        let (head, tail) = digits.split_at(1);
        let frac = if tail.is_empty() {
            String::new()
        } else {
            format!(".{tail}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{head}{frac}e{esign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        let zeros = "0".repeat(int_len - digits.len());
        format!("{sign}{digits}{zeros}.0")
    } else {
        format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
    }
}

/// Python `str(value)`.
pub(crate) fn py_str(value: &Value, sink: &mut Sink) -> Result<(), Error> {
    match value.kind() {
        ValueKind::String => sink.push(value.as_str().unwrap_or_default()),
        _ => py_repr(value, sink),
    }
}

/// Python `repr(value)` (strings quoted, containers recursive).
pub(crate) fn py_repr(value: &Value, sink: &mut Sink) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => Ok(()),
        ValueKind::None => sink.push("None"),
        ValueKind::Bool => sink.push(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => sink.push(&number_text(value)),
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), sink),
        ValueKind::Seq | ValueKind::Iterable => {
            sink.push("[")?;
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    sink.push(", ")?;
                }
                py_repr(&item, sink)?;
            }
            sink.push("]")
        }
        ValueKind::Map => {
            sink.push("{")?;
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    sink.push(", ")?;
                }
                py_repr(&key, sink)?;
                sink.push(": ")?;
                py_repr(&value.get_item(&key)?, sink)?;
            }
            sink.push("}")
        }
        _ => sink.push(&value.to_string()),
    }
}

/// Integers in decimal, floats as Python `repr`.
fn number_text(value: &Value) -> String {
    if value.is_integer() {
        value.to_string()
    } else {
        float_repr(f64::try_from(value.clone()).unwrap_or(f64::NAN))
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`.
fn string_repr(s: &str, sink: &mut Sink) -> Result<(), Error> {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    sink.push_char(quote)?;
    for c in s.chars() {
        match c {
            '\\' => sink.push("\\\\")?,
            '\n' => sink.push("\\n")?,
            '\r' => sink.push("\\r")?,
            '\t' => sink.push("\\t")?,
            c if c == quote => {
                sink.push("\\")?;
                sink.push_char(c)?;
            }
            c if !is_printable(c) => {
                let n = c as u32;
                let esc = if n < 0x100 {
                    format!("\\x{n:02x}")
                } else if n < 0x10000 {
                    format!("\\u{n:04x}")
                } else {
                    format!("\\U{n:08x}")
                };
                sink.push(&esc)?;
            }
            c => sink.push_char(c)?,
        }
    }
    sink.push_char(quote)
}

/// Python's `str.isprintable` for the characters that occur in practice: controls, non-space
/// separators and invisible format characters are escaped by `repr`.
fn is_printable(c: char) -> bool {
    !(c.is_control()
        || matches!(c, '\u{a0}' | '\u{ad}' | '\u{2000}'..='\u{200f}' | '\u{2028}'..='\u{202f}'
            | '\u{205f}'..='\u{206f}' | '\u{3000}' | '\u{feff}' | '\u{1680}' | '\u{180e}'))
}

/// Options of transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
#[derive(Debug, Clone, Default)]
pub(crate) struct JsonOptions {
    pub(crate) ensure_ascii: bool,
    /// Indentation text per level; `None` writes one line.
    pub(crate) indent: Option<String>,
    /// Item and key separators; default `", "`/`": "` (`","`/`": "` with an indent).
    pub(crate) separators: Option<(String, String)>,
    pub(crate) sort_keys: bool,
}

/// Python `json.dumps(value, ...)`.
pub(crate) fn json_dumps(value: &Value, opts: &JsonOptions, sink: &mut Sink) -> Result<(), Error> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((a, b)) => (a.clone(), b.clone()),
        None if opts.indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let mut w = JsonWriter {
        opts,
        item_sep,
        key_sep,
        sink,
    };
    w.value(value, 0)
}

struct JsonWriter<'a, 'b, 's, 'e> {
    opts: &'a JsonOptions,
    item_sep: String,
    key_sep: String,
    sink: &'b mut Sink<'s, 'e>,
}

impl JsonWriter<'_, '_, '_, '_> {
    fn value(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        if depth > 256 {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: value nested too deeply",
            ));
        }
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => self.sink.push("null"),
            ValueKind::Bool => self.sink.push(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                let text = number_text(v);
                // json.dumps spells the non-finite floats like JavaScript.
                let text = match text.as_str() {
                    "nan" => "NaN".to_string(),
                    "inf" => "Infinity".to_string(),
                    "-inf" => "-Infinity".to_string(),
                    _ => text,
                };
                self.sink.push(&text)
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container('[', ']', items.len(), depth, |w, i| {
                    w.value(&items[i], depth + 1)
                })
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.opts.sort_keys {
                    keys.sort_by_key(key_text);
                }
                self.container('{', '}', keys.len(), depth, |w, i| {
                    w.string(&key_text(&keys[i]))?;
                    let sep = w.key_sep.clone();
                    w.sink.push(&sep)?;
                    w.value(&v.get_item(&keys[i])?, depth + 1)
                })
            }
            _ => self.string(&v.to_string()),
        }
    }

    fn container(
        &mut self,
        open: char,
        close: char,
        n: usize,
        depth: usize,
        mut item: impl FnMut(&mut Self, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.sink.push_char(open)?;
        if n == 0 {
            return self.sink.push_char(close);
        }
        for i in 0..n {
            if i > 0 {
                let sep = self.item_sep.clone();
                self.sink.push(&sep)?;
            }
            self.newline(depth + 1)?;
            item(self, i)?;
        }
        self.newline(depth)?;
        self.sink.push_char(close)
    }

    fn newline(&mut self, depth: usize) -> Result<(), Error> {
        if let Some(indent) = &self.opts.indent {
            self.sink.push("\n")?;
            for _ in 0..depth {
                self.sink.push(indent)?;
            }
        }
        Ok(())
    }

    fn string(&mut self, s: &str) -> Result<(), Error> {
        self.sink.push("\"")?;
        for c in s.chars() {
            match c {
                '"' => self.sink.push("\\\"")?,
                '\\' => self.sink.push("\\\\")?,
                '\n' => self.sink.push("\\n")?,
                '\r' => self.sink.push("\\r")?,
                '\t' => self.sink.push("\\t")?,
                '\u{8}' => self.sink.push("\\b")?,
                '\u{c}' => self.sink.push("\\f")?,
                c if (c as u32) < 0x20 || (self.opts.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        self.sink.push(&format!("\\u{:04x}", u))?;
                    }
                }
                c => self.sink.push_char(c)?,
            }
        }
        self.sink.push("\"")
    }
}

/// A JSON object key as Python writes it: strings as they are, `True` as `true`, numbers as text.
fn key_text(k: &Value) -> String {
    match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
        ValueKind::None => "null".into(),
        ValueKind::Number => number_text(k),
        _ => k.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_repr() {
        for (f, want) in [
            (0.001, "0.001"),
            (1e-5, "1e-05"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1e15, "1000000000000000.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e-4, "0.0001"),
            (1.25e-7, "1.25e-07"),
            (1e100, "1e+100"),
            (0.0, "0.0"),
        ] {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    fn text(f: impl FnOnce(&mut Sink) -> Result<(), Error>) -> String {
        let mut s = Sink::new(None, 1 << 20);
        f(&mut s).unwrap();
        s.buf
    }

    #[test]
    fn str_and_repr_follow_python() {
        let v = Value::from(minijinja::value::Serde(
            serde_json::json!({"a": [1, 2.5, true, null, "it's"]}),
        ));
        assert_eq!(
            text(|s| py_str(&v, s)),
            r#"{'a': [1, 2.5, True, None, "it's"]}"#
        );
        assert_eq!(text(|s| py_str(&Value::from("x'y\"\n"), s)), "x'y\"\n");
        assert_eq!(
            text(|s| py_repr(&Value::from("x'y\"\n"), s)),
            r#"'x\'y"\n'"#
        );
        assert_eq!(text(|s| py_str(&Value::from(false), s)), "False");
    }

    #[test]
    fn json_dumps_uses_python_separators_and_escapes() {
        let v: Value =
            serde_json::from_str(r#"{"b": "°C\n<&>", "a": [1, 2.0, {}], "c": null}"#).unwrap();
        let opts = JsonOptions::default();
        assert_eq!(
            text(|s| json_dumps(&v, &opts, s)),
            r#"{"b": "°C\n<&>", "a": [1, 2.0, {}], "c": null}"#
        );
        let opts = JsonOptions {
            indent: Some("  ".into()),
            ensure_ascii: true,
            ..JsonOptions::default()
        };
        assert_eq!(
            text(|s| json_dumps(&v, &opts, s)),
            "{\n  \"b\": \"\\u00b0C\\n<&>\",\n  \"a\": [\n    1,\n    2.0,\n    {}\n  ],\n  \"c\": null\n}"
        );
    }

    #[test]
    fn sink_stops_at_its_limit() {
        let mut s = Sink::new(None, 10);
        assert!(s.push("0123456789").is_ok());
        assert!(s.push("x").is_err());
    }
}
