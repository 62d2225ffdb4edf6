//! Snapshot files: insta's `.snap` layout (a `---` front matter, then the reviewed body), one
//! file per case and backend, so they read and diff like the insta snapshots elsewhere in the
//! workspace.
//!
//! The body is one field per line, `<kind> <key>: <payload>`:
//! - `=` exact: the payload must match byte for byte (token ids, bytes, digests of exact math);
//! - `~` bounded: whitespace-separated numbers, each within the case's tolerance;
//! - `#` info: printed for the reviewer (oracle distance, digests of reordered sums), never
//!   compared, because it is either checked against a fixed bound in code or allowed to move.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// How a field is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Byte-for-byte.
    Exact,
    /// Numbers within the case tolerance.
    Bounded,
    /// Not compared.
    Info,
}

impl Kind {
    fn marker(self) -> char {
        match self {
            Kind::Exact => '=',
            Kind::Bounded => '~',
            Kind::Info => '#',
        }
    }
}

/// One line of a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Comparison kind.
    pub kind: Kind,
    /// Name, unique within the case (no `": "`, no newline).
    pub key: String,
    /// Value on one line.
    pub payload: String,
}

impl Field {
    /// An exact field; the payload is escaped onto one line if needed.
    pub fn exact(key: impl Into<String>, payload: impl Into<String>) -> Field {
        Field::new(Kind::Exact, key, payload)
    }

    /// A bounded field of numbers (printed with enough digits to round-trip an f32).
    pub fn bounded(key: impl Into<String>, values: &[f32]) -> Field {
        let mut s = String::new();
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            let _ = write!(s, "{v:e}");
        }
        Field::new(Kind::Bounded, key, s)
    }

    /// An info field.
    pub fn info(key: impl Into<String>, payload: impl Into<String>) -> Field {
        Field::new(Kind::Info, key, payload)
    }

    fn new(kind: Kind, key: impl Into<String>, payload: impl Into<String>) -> Field {
        let payload: String = payload.into();
        // A newline would end the field early: keep every payload on one line.
        let payload = if payload.contains(['\n', '\r']) {
            format!("{payload:?}")
        } else {
            payload
        };
        Field {
            kind,
            key: key.into(),
            payload,
        }
    }
}

/// A snapshot: the front matter's `case` plus the fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Case name and backend, as in the table.
    pub case: String,
    /// Tolerance text (for the reviewer; the code's tolerance is what is applied).
    pub tolerance: String,
    /// The fields in order.
    pub fields: Vec<Field>,
}

/// Errors reading a snapshot file.
#[derive(Debug)]
pub struct SnapshotError(pub String);

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SnapshotError {}

impl Snapshot {
    /// The file text.
    pub fn render(&self) -> String {
        let mut s = format!(
            "---\nsource: xtask/src/golden\nexpression: {}\ntolerance: {}\n---\n",
            self.case, self.tolerance
        );
        for f in &self.fields {
            let _ = writeln!(s, "{} {}: {}", f.kind.marker(), f.key, f.payload);
        }
        s
    }

    /// Parses a file's text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Snapshot, SnapshotError> {
        let err = |line: usize, what: &str| {
            SnapshotError(format!("{}:{}: {what}", path.display(), line + 1))
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, "---")) => {}
            _ => return Err(err(0, "expected `---` front matter")),
        }
        let (mut case, mut tolerance) = (String::new(), String::new());
        loop {
            let Some((i, l)) = lines.next() else {
                return Err(err(0, "front matter not closed by `---`"));
            };
            if l == "---" {
                break;
            }
            if let Some(v) = l.strip_prefix("expression: ") {
                case = v.to_string();
            } else if let Some(v) = l.strip_prefix("tolerance: ") {
                tolerance = v.to_string();
            } else if !l.starts_with("source: ") {
                return Err(err(i, "unknown front-matter line"));
            }
        }
        let mut fields = Vec::new();
        for (i, l) in lines {
            if l.is_empty() {
                continue;
            }
            let kind = match l.as_bytes()[0] {
                b'=' => Kind::Exact,
                b'~' => Kind::Bounded,
                b'#' => Kind::Info,
                _ => return Err(err(i, "a field starts with `=`, `~` or `#`")),
            };
            let rest = l.get(2..).ok_or_else(|| err(i, "empty field"))?;
            let (key, payload) = rest
                .split_once(": ")
                .ok_or_else(|| err(i, "field without `key: value`"))?;
            fields.push(Field {
                kind,
                key: key.to_string(),
                payload: payload.to_string(),
            });
        }
        Ok(Snapshot {
            case,
            tolerance,
            fields,
        })
    }
}

/// Path of a case's snapshot: `<dir>/<case with '/' as "__">@<backend>.snap`.
pub fn path_for(dir: &Path, case: &str, backend: &str) -> PathBuf {
    dir.join(format!("{}@{backend}.snap", case.replace('/', "__")))
}

/// The difference found by [`compare`]: a one-line description, and the max abs diff seen over
/// bounded fields (also when within tolerance).
#[derive(Debug, Default, Clone)]
pub struct Comparison {
    /// Mismatches, each naming the field (empty: the case passes).
    pub failures: Vec<String>,
    /// Largest |got - want| over bounded fields.
    pub max_abs_diff: f64,
    /// Whether any field differs at all (bounded fields within tolerance included).
    pub moved: bool,
}

/// Compares `got` with the committed `want`, bounded fields within `tol` (absolute).
pub fn compare(got: &[Field], want: &[Field], tol: f64) -> Comparison {
    let mut c = Comparison::default();
    let comparable = |f: &&Field| f.kind != Kind::Info;
    let got_c: Vec<&Field> = got.iter().filter(comparable).collect();
    let want_c: Vec<&Field> = want.iter().filter(comparable).collect();
    for w in &want_c {
        let Some(g) = got_c.iter().find(|g| g.key == w.key) else {
            c.failures.push(format!("{}: missing from this run", w.key));
            continue;
        };
        if g.kind != w.kind {
            c.failures.push(format!("{}: kind changed", w.key));
            continue;
        }
        match w.kind {
            Kind::Exact => {
                if g.payload != w.payload {
                    c.moved = true;
                    c.failures.push(format!(
                        "{}: {}",
                        w.key,
                        first_difference(&g.payload, &w.payload)
                    ));
                }
            }
            Kind::Bounded => match bounded_diff(&g.payload, &w.payload) {
                Ok((d, i)) => {
                    if d > 0.0 {
                        c.moved = true;
                    }
                    c.max_abs_diff = c.max_abs_diff.max(d);
                    if d > tol || d.is_nan() {
                        c.failures.push(format!(
                            "{}: |diff| {d:.3e} > {tol:.0e} at value {i}",
                            w.key
                        ));
                    }
                }
                Err(e) => {
                    c.moved = true;
                    c.failures.push(format!("{}: {e}", w.key));
                }
            },
            Kind::Info => {}
        }
    }
    for g in &got_c {
        if !want_c.iter().any(|w| w.key == g.key) {
            c.failures
                .push(format!("{}: new field, not in the snapshot", g.key));
        }
    }
    c
}

/// Largest |got - want| over two number lists and its index.
fn bounded_diff(got: &str, want: &str) -> Result<(f64, usize), String> {
    let parse = |s: &str| -> Result<Vec<f64>, String> {
        s.split_whitespace()
            .map(|t| t.parse::<f64>().map_err(|_| format!("not a number: {t:?}")))
            .collect()
    };
    let (g, w) = (parse(got)?, parse(want)?);
    if g.len() != w.len() {
        return Err(format!("{} values, snapshot has {}", g.len(), w.len()));
    }
    let mut worst = (0.0f64, 0usize);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let d = if a == b { 0.0 } else { (a - b).abs() };
        // NaN anywhere is a regression: make it the worst value.
        let d = if d.is_nan() { f64::INFINITY } else { d };
        if d > worst.0 {
            worst = (d, i);
        }
    }
    Ok(worst)
}

/// "first differing token i: got X, want Y" for id lists, else the first differing character.
fn first_difference(got: &str, want: &str) -> String {
    let ids = |s: &str| -> Option<Vec<String>> {
        let inner = s.strip_prefix('[')?.strip_suffix(']')?;
        Some(inner.split(", ").map(str::to_string).collect())
    };
    if let (Some(g), Some(w)) = (ids(got), ids(want)) {
        let i = g.iter().zip(&w).take_while(|(a, b)| a == b).count();
        let show = |v: &[String]| v.get(i).cloned().unwrap_or_else(|| "<end>".into());
        return format!(
            "first differing token {i}: got {}, want {}",
            show(&g),
            show(&w)
        );
    }
    let i = got
        .chars()
        .zip(want.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let tail = |s: &str| s.chars().skip(i).take(24).collect::<String>();
    format!(
        "differs at char {i}: got {:?}, want {:?}",
        tail(got),
        tail(want)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_then_parse_round_trips() {
        let s = Snapshot {
            case: "x/y@cpu".into(),
            tolerance: "exact".into(),
            fields: vec![
                Field::exact("ids", "[1, 2, 3]"),
                Field::bounded("v", &[1.5, -2.0e-7]),
                Field::info("note", "a: b\nc"),
            ],
        };
        let back = Snapshot::parse(&s.render(), Path::new("t")).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn compare_reports_each_kind_of_change() {
        let want = vec![
            Field::exact("ids", "[1, 2, 3]"),
            Field::bounded("v", &[1.0, 2.0]),
        ];
        let same = compare(&want, &want, 0.0);
        assert!(same.failures.is_empty() && !same.moved);
        let got = vec![
            Field::exact("ids", "[1, 5, 3]"),
            Field::bounded("v", &[1.0, 2.001]),
        ];
        let c = compare(&got, &want, 1e-2);
        assert_eq!(c.failures.len(), 1, "{:?}", c.failures);
        assert!(c.failures[0].contains("first differing token 1: got 5, want 2"));
        assert!(c.moved && (c.max_abs_diff - 1e-3).abs() < 1e-9);
        let c = compare(&got, &want, 1e-4);
        assert_eq!(c.failures.len(), 2);
        let c = compare(&got[..1], &want, 1.0);
        assert!(c.failures.iter().any(|f| f.contains("missing")));
    }
}
