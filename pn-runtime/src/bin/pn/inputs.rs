//! Reading what the commands take as input: text files (`-` = stdin), piped stdin as a prompt,
//! and token files in every form `pn` writes or reads.

use std::io::{IsTerminal, Read};
use std::path::Path;

/// The text of `path`, or all of stdin for `-` (llama.cpp's `-f -`).
pub fn read_text(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let bytes = if path == Path::new("-") {
        let mut b = Vec::new();
        std::io::stdin()
            .read_to_end(&mut b)
            .map_err(|e| format!("cannot read stdin: {e}"))?;
        b
    } else {
        std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?
    };
    String::from_utf8(bytes)
        .map_err(|e| format!("{} is not valid UTF-8: {e}", path.display()).into())
}

/// The prompt piped into stdin, when stdin is not a terminal and holds something (`echo hi |
/// pn run`); `None` for a terminal or an empty input.
pub fn piped_prompt() -> Result<Option<String>, Box<dyn std::error::Error>> {
    if std::io::stdin().is_terminal() {
        return Ok(None);
    }
    let text = read_text(Path::new("-"))?;
    Ok(Some(text).filter(|t| !t.is_empty()))
}

/// Token ids from a file: `{"tokens": [...]}` (as the test data and `pn logits` use), a bare
/// JSON array (as `pn tokenize` prints), or whitespace/comma-separated integers.
pub fn read_tokens(path: &Path) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    parse_tokens(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// [`read_tokens`] of a file's text.
pub fn parse_tokens(text: &str) -> Result<Vec<u32>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let arr = v
            .get("tokens")
            .unwrap_or(&v)
            .as_array()
            .ok_or("expected {\"tokens\": [...]} or an array of token ids")?;
        return arr
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| format!("token {i} is not a token id: {x}"))
            })
            .collect();
    }
    text.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(i, s)| {
            s.parse::<u32>()
                .map_err(|_| format!("token {i} {s:?} is not a token id"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every token-file form reads to the same ids; anything else is refused with the position.
    #[test]
    fn token_files_in_every_form() {
        for text in ["[1, 2, 30]", "{\"tokens\": [1,2,30]}", "1 2 30\n", "1,2,30"] {
            assert_eq!(parse_tokens(text).unwrap(), [1, 2, 30], "{text}");
        }
        assert!(parse_tokens("[1, -2]").unwrap_err().contains("token 1"));
        assert!(parse_tokens("1 x").unwrap_err().contains("token 1"));
        assert!(parse_tokens("{\"ids\": [1]}").is_err());
    }
}
