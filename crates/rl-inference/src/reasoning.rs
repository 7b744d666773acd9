//! vLLM's reasoning parsers (`--reasoning-parser`, `inference.reasoning_parser`): a thinking
//! model's reply split at `</think>` into its reasoning (`reasoning_content`) and its answer
//! (`content`). The split is one function of the text so far, so a streamed reply's reasoning and
//! content deltas add up to the whole reply's.
//!
//! A reply reasons when it opens with `<think>`, or when its prompt already opened it (Qwen3
//! thinking models' templates end the prompt with `<think>`); `deepseek_r1` replies always do.
//! Reasoning runs to `</think>` (a reply cut before it is all reasoning); a `qwen3` reply that
//! does not open with `<think>` is all content.

use std::ops::Range;

const START: &str = "<think>";
const END: &str = "</think>";

/// The parsers, by vLLM's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReasoningParser {
    Qwen3,
    DeepseekR1,
}

/// Where a reply's reasoning and content lie (byte ranges of its text); both empty while the text
/// cannot be told apart yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parts {
    pub(crate) reasoning: Range<usize>,
    pub(crate) content: Range<usize>,
}

impl ReasoningParser {
    /// The parser `inference.reasoning_parser` names (`None` for `none`).
    pub(crate) fn named(name: &str) -> Option<Self> {
        match name {
            "qwen3" => Some(ReasoningParser::Qwen3),
            "deepseek_r1" => Some(ReasoningParser::DeepseekR1),
            _ => None,
        }
    }

    /// The parts of `text`; `opened`: the prompt ends with `<think>`; `done`: the reply is whole
    /// (else a partial `<think>` or `</think>` at its end is held back, undecided).
    pub(crate) fn parts(self, opened: bool, text: &str, done: bool) -> Parts {
        let decided = |content: Range<usize>| Parts { reasoning: 0..0, content };
        let lead = text.len() - text.trim_start().len();
        let rest = &text[lead..];
        let body = if rest.starts_with(START) {
            lead + START.len()
        } else if !done && START.starts_with(rest) {
            return decided(0..0); // whitespace, or the start of `<think>`
        } else if opened || self == ReasoningParser::DeepseekR1 {
            0
        } else {
            return decided(0..text.len());
        };
        match text[body..].find(END) {
            Some(at) => Parts { reasoning: body..body + at, content: body + at + END.len()..text.len() },
            None if done => Parts { reasoning: body..text.len(), content: text.len()..text.len() },
            None => {
                let hold = (1..END.len()).rev().find(|&n| text.ends_with(&END[..n])).unwrap_or(0);
                let end = (text.len() - hold).max(body);
                Parts { reasoning: body..end, content: end..end }
            }
        }
    }
}

/// Whether a prompt leaves the reply inside `<think>` (a thinking model's template opened it).
pub(crate) fn prompt_opens_thinking(prompt: &str) -> bool {
    prompt.trim_end().ends_with(START)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: ReasoningParser, opened: bool, text: &str) -> (String, String) {
        let parts = p.parts(opened, text, true);
        (text[parts.reasoning].to_owned(), text[parts.content].to_owned())
    }

    #[test]
    fn replies_split_at_the_end_of_thinking() {
        let q = ReasoningParser::Qwen3;
        assert_eq!(split(q, false, "<think>\nhm\n</think>\n\nIt is 4."), ("\nhm\n".into(), "\n\nIt is 4.".into()));
        assert_eq!(split(q, false, "It is 4."), (String::new(), "It is 4.".into()), "no thinking: all content");
        assert_eq!(split(q, true, "hm</think>It is 4."), ("hm".into(), "It is 4.".into()), "opened by the prompt");
        assert_eq!(split(q, false, "<think>cut mid-thou"), ("cut mid-thou".into(), String::new()));
        let r1 = ReasoningParser::DeepseekR1;
        assert_eq!(split(r1, false, "hm</think>4"), ("hm".into(), "4".into()));
        assert_eq!(split(r1, false, "still thinking"), ("still thinking".into(), String::new()));
        assert!(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }

    #[test]
    fn every_prefix_splits_into_prefixes_of_the_whole_split() {
        for (p, opened, text) in [
            (ReasoningParser::Qwen3, false, " <think>a</th b</think>\n\nc</think>d"),
            (ReasoningParser::Qwen3, false, "<thin plain"),
            (ReasoningParser::Qwen3, true, "x</think>y"),
            (ReasoningParser::DeepseekR1, false, "<think>r</think>c"),
        ] {
            let whole = p.parts(opened, text, true);
            let (r, c) = (&text[whole.reasoning.clone()], &text[whole.content.clone()]);
            let mut seen = (0, 0);
            for end in (0..=text.len()).filter(|&e| text.is_char_boundary(e)) {
                let part = p.parts(opened, &text[..end], false);
                let (pr, pc) = (&text[part.reasoning], &text[part.content]);
                assert!(r.starts_with(pr) && c.starts_with(pc), "{text:?} at {end}: {pr:?} / {pc:?} vs {r:?} / {c:?}");
                assert!(pr.len() >= seen.0 && pc.len() >= seen.1, "{text:?} at {end}: parts never shrink");
                seen = (pr.len(), pc.len());
            }
        }
    }
}
