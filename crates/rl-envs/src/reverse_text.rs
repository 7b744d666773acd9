//! `reverse-text`: reverse a text character by character inside `<reversed_text>` tags. Reward: the
//! difflib ratio of the tagged answer to the reversed text. Optional step-aware format penalty.

use async_trait::async_trait;
use rl_serve::{
    EnvReply, Environment, Error, Message, Result, Rubric, RubricGroup, ScoringContext, State, Task, reward_fn,
};
use serde_json::{Map, Value, json};

use crate::args::Args;
use crate::difflib::ratio;
use crate::rng::Rng;
use crate::splits::Splits;

/// The system prompt.
pub const SYSTEM_PROMPT: &str = "Reverse the text character-by-character. Put your answer in <reversed_text> tags.";

pub(crate) const WORDS: &[&str] = &[
    "the", "cat", "sat", "on", "a", "mat", "blue", "sky", "sun", "moon", "star", "tree", "leaf", "river", "stone",
    "bird", "fish", "rain", "snow", "wind", "fire", "gold", "red", "green", "old", "new", "big", "small", "fast",
    "slow", "dog", "ran", "home", "road", "hill", "sea", "ship", "map", "key", "door", "book", "pen", "cup", "tea",
    "milk", "bread", "corn", "farm", "city", "town", "king", "queen", "song", "drum", "bell", "lamp", "light", "dark",
    "warm", "cold", "day", "night", "time", "year", "good", "kind", "wise", "bold", "calm", "quick", "brown", "fox",
    "jumps", "over", "lazy", "and", "with", "from", "into", "under", "near", "far", "up", "down", "left", "right",
];

/// The reverse-text environment.
#[derive(Debug)]
pub struct ReverseText {
    data: Splits<String>,
    rubric: RubricGroup,
}

/// Extracts the first `<reversed_text>...</reversed_text>` block, stripped.
pub fn parse_answer(reply: &str) -> Option<&str> {
    let start = reply.find("<reversed_text>")? + "<reversed_text>".len();
    let end = reply[start..].find("</reversed_text>")? + start;
    Some(reply[start..end].trim())
}

/// The reply with its tagged block removed, trimmed (what the format penalty looks at).
fn outside_tags(reply: &str) -> String {
    match (reply.find("<reversed_text>"), reply.find("</reversed_text>")) {
        (Some(s), Some(e)) if e >= s => {
            format!("{}{}", &reply[..s], &reply[e + "</reversed_text>".len()..]).trim().to_owned()
        }
        _ => reply.trim().to_owned(),
    }
}

/// The reward: difflib ratio of the parsed answer to the reversed text; 0 without the tags.
pub fn lcs_reward(reply: &str, answer: &str) -> f64 {
    parse_answer(reply).map_or(0.0, |parsed| ratio(parsed, answer))
}

fn answer_of(task: &Task) -> std::result::Result<String, String> {
    task.data.get("answer").and_then(Value::as_str).map(str::to_owned).ok_or_else(|| String::from("task has no answer"))
}

impl ReverseText {
    /// Builds the env from its args: `num_examples`, `test_examples`, `min_len`, `max_len`, `seed`,
    /// `format_penalty`, `penalty_warmup_steps`.
    pub fn new(args: &Map<String, Value>) -> Result<Self> {
        let mut a = Args::new("reverse-text", args);
        let num = a.u64("num_examples", 1000)?;
        let test_num = a.u64("test_examples", 100)?;
        let min_len = a.u64("min_len", 5)?;
        let max_len = a.u64("max_len", 20)?;
        let seed = a.u64("seed", 0)?;
        let penalty = a.f64("format_penalty", 0.0)?;
        let warmup = a.u64("penalty_warmup_steps", 0)?;
        a.ordered("min_len", min_len, "max_len", max_len)?;
        if min_len == 0 {
            return Err(Error::bad_request("env.args.min_len", "must be at least 1"));
        }
        if penalty < 0.0 {
            return Err(Error::bad_request("env.args.format_penalty", "must be >= 0"));
        }
        a.finish()?;
        let gen_split = |stream: &str, n: u64| {
            let mut rng = Rng::new(seed, stream);
            (0..n).map(|_| text(&mut rng, min_len as usize, max_len as usize)).collect::<Vec<_>>()
        };
        let mut rubric = Rubric::new().reward(
            reward_fn("lcs", |ctx: &ScoringContext<'_>| Ok(lcs_reward(ctx.last_reply(), &answer_of(ctx.task)?))),
            1.0,
        );
        if penalty > 0.0 {
            let scale = move |step: u64| {
                if warmup == 0 { penalty } else { penalty * (step as f64 / warmup as f64).min(1.0) }
            };
            rubric = rubric
                .reward(
                    reward_fn("format_penalty", move |ctx: &ScoringContext<'_>| {
                        let violated = !outside_tags(ctx.last_reply()).is_empty();
                        Ok(if violated { -scale(ctx.step()) } else { 0.0 })
                    }),
                    1.0,
                )
                .metric(reward_fn("format_penalty_scale", move |ctx: &ScoringContext<'_>| Ok(scale(ctx.step()))));
        }
        Ok(ReverseText {
            data: Splits {
                train: gen_split("reverse-text/train", num),
                test: gen_split("reverse-text/test", test_num),
            },
            rubric: RubricGroup::new(vec![rubric]),
        })
    }

    /// Ideal conversations (system, user, assistant) for supervised warm-up on `split`.
    pub fn sft_conversations(&self, split: &str) -> Vec<Vec<Message>> {
        self.data
            .get(split)
            .iter()
            .map(|text| {
                let reversed: String = text.chars().rev().collect();
                vec![
                    Message::system(SYSTEM_PROMPT),
                    Message::user(text.as_str()),
                    Message::assistant(format!("<reversed_text>{reversed}</reversed_text>")),
                ]
            })
            .collect()
    }
}

/// A phrase of random words cut to a random length in `min..=max` characters.
fn text(rng: &mut Rng, min: usize, max: usize) -> String {
    let target = rng.range(min as u64, max as u64) as usize;
    let mut s = String::new();
    while s.chars().count() < target {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(rng.choose::<&str>(WORDS));
    }
    let cut: String = s.chars().take(target).collect();
    let trimmed = cut.trim_end();
    if trimmed.is_empty() { cut } else { trimmed.to_owned() }
}

fn task(key: String, text: &str) -> Task {
    Task { key, data: json!({"text": text, "answer": text.chars().rev().collect::<String>()}) }
}

#[async_trait]
impl Environment for ReverseText {
    fn id(&self) -> &str {
        "reverse-text"
    }

    fn splits(&self) -> Vec<(String, u64)> {
        self.data.sizes()
    }

    fn task(&self, split: &str, index: u64) -> Result<Task> {
        Ok(task(format!("{split}/{index}"), self.data.at(split, index)?))
    }

    fn inline_task(&self, data: Value) -> Result<Task> {
        let text = data.get("text").and_then(Value::as_str).ok_or_else(|| {
            Error::bad_request("example.inline_json.text", "reverse-text tasks are {\"text\": \"...\"}")
        })?;
        Ok(task(String::from("inline"), text))
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        let text = task.data.get("text").and_then(Value::as_str).unwrap_or_default();
        Ok(vec![Message::system(SYSTEM_PROMPT), Message::user(text)])
    }

    async fn env_response(&self, _task: &Task, _state: &mut State) -> Result<EnvReply> {
        Ok(EnvReply::Done)
    }

    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_first_tagged_block() {
        assert_eq!(parse_answer("x <reversed_text> olleh </reversed_text> y"), Some("olleh"));
        assert_eq!(parse_answer("no tags"), None);
        assert_eq!(lcs_reward("<reversed_text>olleh</reversed_text>", "olleh"), 1.0);
        assert_eq!(lcs_reward("olleh", "olleh"), 0.0, "a missing tag scores 0");
        assert_eq!(outside_tags(" <reversed_text>a</reversed_text> "), "");
        assert_eq!(outside_tags("so: <reversed_text>a</reversed_text>"), "so:");
    }

    #[test]
    fn datasets_are_deterministic_and_respect_lengths() {
        let args = json!({"num_examples": 50, "min_len": 4, "max_len": 9, "seed": 3});
        let a = ReverseText::new(args.as_object().unwrap()).unwrap();
        let b = ReverseText::new(args.as_object().unwrap()).unwrap();
        assert_eq!(a.data.train, b.data.train);
        assert_ne!(a.data.train, a.data.test[..].to_vec());
        for t in &a.data.train {
            let n = t.chars().count();
            assert!((1..=9).contains(&n) && !t.ends_with(' '), "{t:?}");
        }
    }

    #[test]
    fn unknown_args_are_rejected_by_name() {
        let err = ReverseText::new(json!({"min_lenght": 3}).as_object().unwrap()).unwrap_err();
        assert!(err.to_string().contains("env.args.min_lenght"), "{err}");
    }
}
