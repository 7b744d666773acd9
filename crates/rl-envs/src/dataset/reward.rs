//! The built-in ways to compare a reply with the reference answer: exact, normalized, difflib
//! ratio, a regex capture, the last `\boxed{...}`, or the last number within a tolerance.

use regex::Regex;

/// How a reply is scored against the answer (each gives 0..=1).
#[derive(Debug, Clone)]
pub(crate) enum Matcher {
    /// Trimmed texts are equal.
    Exact,
    /// Equal after normalizing (lowercase, no punctuation or articles, single spaces).
    Normalized,
    /// `difflib.SequenceMatcher(None, reply, answer).ratio()` of the trimmed texts.
    Difflib,
    /// The pattern's first capture group (or whole match), last match in the reply, normalized-equal.
    Regex(Regex),
    /// The content of the last `\boxed{...}`, equal as numbers (with the tolerance) or normalized
    /// to the answer's (its own last `\boxed{...}` when it has one, as MATH's solutions do).
    Boxed { tolerance: f64 },
    /// The last number in the reply is within `tolerance * max(1, |answer|)` of the answer's
    /// number (the answer's last number when it is not one, as GSM8K's `... #### 72`).
    Numeric { tolerance: f64 },
}

impl Matcher {
    /// The part of the reply this matcher compares (None: nothing to extract).
    pub(crate) fn extract<'a>(&self, reply: &'a str) -> Option<&'a str> {
        match self {
            Matcher::Exact | Matcher::Normalized | Matcher::Difflib => Some(reply.trim()),
            Matcher::Regex(re) => {
                re.captures_iter(reply).last().and_then(|c| c.get(1).or_else(|| c.get(0))).map(|m| m.as_str())
            }
            Matcher::Boxed { .. } => last_boxed(reply),
            Matcher::Numeric { .. } => last_number(reply),
        }
    }

    /// The score of `reply` against `answer`.
    pub(crate) fn score(&self, reply: &str, answer: &str) -> f64 {
        let Some(got) = self.extract(reply) else { return 0.0 };
        let hit = match self {
            Matcher::Exact => got == answer.trim(),
            Matcher::Normalized | Matcher::Regex(_) => normalize(got) == normalize(answer),
            Matcher::Difflib => return crate::difflib::ratio(got, answer.trim()),
            Matcher::Boxed { tolerance } => {
                let answer = last_boxed(answer).unwrap_or(answer);
                match (parse_number(got), parse_number(answer)) {
                    (Some(a), Some(b)) => close(a, b, *tolerance),
                    _ => normalize(got) == normalize(answer),
                }
            }
            Matcher::Numeric { tolerance } => match (parse_number(got), answer_number(answer)) {
                (Some(a), Some(b)) => close(a, b, *tolerance),
                _ => false,
            },
        };
        f64::from(u8::from(hit))
    }
}

/// A reference answer's number: the whole text, else its last number.
fn answer_number(answer: &str) -> Option<f64> {
    parse_number(answer).or_else(|| last_number(answer).and_then(parse_number))
}

fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * b.abs().max(1.0)
}

/// SQuAD-style normalization: lowercase, punctuation removed, articles dropped, single spaces.
pub(crate) fn normalize(s: &str) -> String {
    let lower: String = s.to_lowercase().chars().map(|c| if c.is_ascii_punctuation() { ' ' } else { c }).collect();
    lower.split_whitespace().filter(|w| !matches!(*w, "a" | "an" | "the")).collect::<Vec<_>>().join(" ")
}

/// A number written plainly, with thousands separators, a leading `$`, or a trailing `%` or `.`.
pub(crate) fn parse_number(s: &str) -> Option<f64> {
    let t = s.trim().trim_start_matches('$').trim_end_matches(['%', '.']).replace(',', "");
    t.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// The last number in the text.
fn last_number(text: &str) -> Option<&str> {
    // -?digits with optional thousands groups, decimals and exponent.
    static NUMBER: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        Regex::new(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?").expect("a valid pattern")
    });
    NUMBER.find_iter(text).last().map(|m| m.as_str())
}

/// The content of the last `\boxed{...}` (braces balanced), trimmed.
pub(crate) fn last_boxed(text: &str) -> Option<&str> {
    let start = text.rfind("\\boxed{")? + "\\boxed{".len();
    let mut depth = 1usize;
    for (i, c) in text[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(text[start..start + i].trim());
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_matcher_scores_what_it_promises() {
        assert_eq!(Matcher::Exact.score("  42 ", "42"), 1.0);
        assert_eq!(Matcher::Exact.score("42.", "42"), 0.0);
        assert_eq!(Matcher::Normalized.score("The Eiffel Tower!", "eiffel tower"), 1.0);
        assert!((Matcher::Difflib.score("abcd", "abce") - 0.75).abs() < 1e-12);
        let re = Matcher::Regex(Regex::new(r"Answer:\s*(\S+)").unwrap());
        assert_eq!(re.score("Answer: 3 ... wait. Answer: 4", "4"), 1.0, "the last match counts");
        assert_eq!(re.score("no marker", "4"), 0.0);
        let boxed = Matcher::Boxed { tolerance: 1e-6 };
        assert_eq!(boxed.score(r"so \boxed{\frac{1}{2}} hmm \boxed{1,000}", "1000"), 1.0);
        assert_eq!(boxed.score(r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"), 1.0);
        assert_eq!(boxed.score(r"\boxed{12", "12"), 0.0, "unbalanced");
        let numeric = Matcher::Numeric { tolerance: 0.01 };
        assert_eq!(numeric.score("I think 3 apples, so 9.995 total", "10"), 1.0);
        assert_eq!(numeric.score("the total is -12,345.5", "-12345.5"), 1.0);
        assert_eq!(numeric.score("about 11", "10"), 0.0);
        assert_eq!(numeric.score("no number", "10"), 0.0);
        let gsm8k = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72";
        assert_eq!(numeric.score("She sold 72 clips.", gsm8k), 1.0, "a worked answer's last number");
        assert_eq!(numeric.score("She sold 24 clips.", gsm8k), 0.0);
        let boxed = Matcher::Boxed { tolerance: 1e-6 };
        let math = "So $x = 3$, and the sum is $\\boxed{\\frac{1}{2}}$.";
        assert_eq!(boxed.score("it is \\boxed{\\frac{1}{2}}", math), 1.0, "a solution's own boxed answer");
        assert_eq!(boxed.score("it is \\boxed{3}", math), 0.0);
    }

    #[test]
    fn numbers_parse_with_separators_units_and_trailing_marks() {
        assert_eq!(parse_number("$1,234.50"), Some(1234.5));
        assert_eq!(parse_number("50%"), Some(50.0));
        assert_eq!(parse_number("7."), Some(7.0));
        assert_eq!(parse_number("x7"), None);
        assert_eq!(last_boxed(r"\boxed{ {a} }"), Some("{a}"));
    }
}
