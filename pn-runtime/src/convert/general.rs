//! The `general.*` keys: name and size label, as llama.cpp's converter derives them when no
//! model card or override says otherwise.

/// llama.cpp's title-casing of a model id: words split on `-` and spaces; an all-lowercase word
/// that is not a version or a number is capitalised.
pub fn id_to_title(id: &str) -> String {
    id.trim()
        .replace('-', " ")
        .split_whitespace()
        .map(|w| {
            let is_version = {
                let rest = w.strip_prefix('v').unwrap_or(w);
                !rest.is_empty()
                    && rest
                        .split('.')
                        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            };
            let starts_digit = w.bytes().next().is_some_and(|b| b.is_ascii_digit());
            let lower =
                w.chars().any(|c| c.is_alphabetic()) && !w.chars().any(|c| c.is_uppercase());
            if lower && !is_version && !starts_digit {
                title_word(w)
            } else {
                w.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Python's `str.title()` on one word: a letter after a non-letter is upper-cased.
fn title_word(w: &str) -> String {
    let mut out = String::with_capacity(w.len());
    let mut prev_letter = false;
    for c in w.chars() {
        if c.is_alphabetic() {
            if prev_letter {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
            prev_letter = true;
        } else {
            out.push(c);
            prev_letter = false;
        }
    }
    out
}

/// The parameter-count label (`18M`, `27B`): at least two significant digits before the
/// suffix, as gguf-py's `model_weight_count_rounded_notation`.
pub fn size_label(params: u64) -> String {
    let p = params as f64;
    let (scaled, suffix) = if p > 1e12 {
        (p * 1e-12, "T")
    } else if p > 1e9 {
        (p * 1e-9, "B")
    } else if p > 1e6 {
        (p * 1e-6, "M")
    } else {
        (p * 1e-3, "K")
    };
    let int_digits = format!("{}", scaled.round() as u64)
        .trim_start_matches('0')
        .len();
    let fix = 2usize.saturating_sub(int_digits);
    format!("{scaled:.fix$}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_titles_follow_gguf_py() {
        assert_eq!(size_label(18_427_000), "18M");
        assert_eq!(size_label(26_900_000_000), "27B");
        assert_eq!(size_label(1_500_000_000), "1.5B");
        assert_eq!(size_label(800_000_000), "800M");
        assert_eq!(id_to_title("tiny-qwen35"), "Tiny Qwen35");
        assert_eq!(id_to_title("Qwen3.5-27B"), "Qwen3.5 27B");
        assert_eq!(id_to_title("my-model-v2"), "My Model v2");
    }
}
