//! llama.cpp GBNF grammars rewritten in llguidance's Lark syntax (what llguidance's own
//! `gbnf_to_lark.py` does, in Rust): `name ::= ...` rules become `name: ...` (`root` is
//! `start`), string literals are re-quoted as JSON strings, character classes and `.` become
//! regexes, and `*`, `+`, `?`, `{m,n}`, `|`, `( )` carry over unchanged.

/// One lexical element of a GBNF grammar.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// A rule name.
    Name(String),
    /// `::=`.
    Define,
    /// A string literal, unescaped.
    Literal(String),
    /// A character class, its text between the brackets as written (regex-compatible).
    Class(String),
    /// `.`: any character.
    Any,
    /// `|`, `(`, `)`, `*`, `+`, `?` or a `{m,n}` repetition, as written.
    Op(String),
}

/// Converts a GBNF grammar to Lark. The message of an error names the position and what was
/// expected.
pub fn gbnf_to_lark(gbnf: &str) -> Result<String, String> {
    let toks = lex(gbnf)?;
    let mut out = String::new();
    let mut i = 0;
    let mut seen_root = false;
    while i < toks.len() {
        let Tok::Name(name) = &toks[i] else {
            return Err(format!("expected a rule name, found {:?}", toks[i]));
        };
        if toks.get(i + 1) != Some(&Tok::Define) {
            return Err(format!("expected `::=` after rule name `{name}`"));
        }
        seen_root |= name == "root";
        out.push_str(&rule_name(name));
        out.push(':');
        i += 2;
        let start = i;
        // A rule's body runs until the next `name ::=`.
        while i < toks.len()
            && !(matches!(toks[i], Tok::Name(_)) && toks.get(i + 1) == Some(&Tok::Define))
        {
            out.push(' ');
            match &toks[i] {
                Tok::Name(n) => out.push_str(&rule_name(n)),
                Tok::Define => return Err("unexpected `::=`".into()),
                Tok::Literal(s) => {
                    out.push_str(&serde_json::to_string(s).map_err(|e| e.to_string())?)
                }
                Tok::Class(c) => {
                    out.push_str("/[");
                    out.push_str(&c.replace('/', "\\/"));
                    out.push_str("]/");
                }
                Tok::Any => out.push_str("/(?s:.)/"),
                Tok::Op(o) => out.push_str(o),
            }
            i += 1;
        }
        if i == start {
            return Err(format!("rule `{name}` is empty"));
        }
        out.push('\n');
    }
    if !seen_root {
        return Err("the grammar has no `root` rule".into());
    }
    Ok(out)
}

/// The Lark name of GBNF rule `name`: lower case, `-` as `_`; `root` is Lark's `start` (and a
/// GBNF rule called `start` moves aside).
fn rule_name(name: &str) -> String {
    match name {
        "root" => "start".into(),
        "start" => "start_".into(),
        _ => {
            let n = name.to_ascii_lowercase().replace('-', "_");
            if n.starts_with(|c: char| c.is_ascii_digit()) {
                format!("r_{n}")
            } else {
                n
            }
        }
    }
}

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ':' if chars.get(i + 1) == Some(&':') && chars.get(i + 2) == Some(&'=') => {
                toks.push(Tok::Define);
                i += 3;
            }
            '"' => {
                let (s, next) = literal(&chars, i + 1)?;
                toks.push(Tok::Literal(s));
                i = next;
            }
            '[' => {
                let mut j = i + 1;
                let mut body = String::new();
                loop {
                    match chars.get(j) {
                        None => return Err(format!("unterminated character class at {i}")),
                        Some(']') => break,
                        Some('\\') => {
                            let e = chars
                                .get(j + 1)
                                .ok_or_else(|| format!("unterminated character class at {i}"))?;
                            body.push('\\');
                            body.push(*e);
                            j += 2;
                        }
                        Some(&ch) => {
                            body.push(ch);
                            j += 1;
                        }
                    }
                }
                toks.push(Tok::Class(body));
                i = j + 1;
            }
            '.' => {
                toks.push(Tok::Any);
                i += 1;
            }
            '|' | '(' | ')' | '*' | '+' | '?' => {
                toks.push(Tok::Op(c.to_string()));
                i += 1;
            }
            '{' => {
                let end = chars[i..]
                    .iter()
                    .position(|&ch| ch == '}')
                    .ok_or_else(|| format!("unterminated repetition at {i}"))?;
                let body: String = chars[i + 1..i + end].iter().collect();
                if !body
                    .chars()
                    .all(|ch| ch.is_ascii_digit() || ch == ',' || ch == ' ')
                {
                    return Err(format!("bad repetition `{{{body}}}` at {i}"));
                }
                toks.push(Tok::Op(format!("{{{}}}", body.replace(' ', ""))));
                i += end + 1;
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let mut j = i;
                while j < chars.len()
                    && (chars[j].is_ascii_alphanumeric() || chars[j] == '-' || chars[j] == '_')
                {
                    j += 1;
                }
                toks.push(Tok::Name(chars[i..j].iter().collect()));
                i = j;
            }
            _ => return Err(format!("unexpected character `{c}` at {i}")),
        }
    }
    Ok(toks)
}

/// A string literal's text from `start` (after the opening quote) with GBNF's escapes
/// (`\n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH`) resolved, and the index after the closing
/// quote.
fn literal(chars: &[char], start: usize) -> Result<(String, usize), String> {
    let mut s = String::new();
    let mut j = start;
    loop {
        match chars.get(j) {
            None => return Err(format!("unterminated string at {}", start - 1)),
            Some('"') => return Ok((s, j + 1)),
            Some('\\') => {
                let e = *chars
                    .get(j + 1)
                    .ok_or_else(|| format!("unterminated string at {}", start - 1))?;
                let hex = |n: usize| -> Result<char, String> {
                    let h: String = chars.get(j + 2..j + 2 + n).unwrap_or(&[]).iter().collect();
                    u32::from_str_radix(&h, 16)
                        .ok()
                        .filter(|_| h.len() == n)
                        .and_then(char::from_u32)
                        .ok_or_else(|| format!("bad escape `\\{e}{h}` at {j}"))
                };
                let (ch, len) = match e {
                    'n' => ('\n', 2),
                    'r' => ('\r', 2),
                    't' => ('\t', 2),
                    'x' => (hex(2)?, 4),
                    'u' => (hex(4)?, 6),
                    'U' => (hex(8)?, 10),
                    other => (other, 2),
                };
                s.push(ch);
                j += len;
            }
            Some(&ch) => {
                s.push(ch);
                j += 1;
            }
        }
    }
}
