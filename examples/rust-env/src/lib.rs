//! `word-count`: count the words of a sentence; the reply's last number must equal the count.
//! An example of an environment written in Rust outside the rl workspace.

use async_trait::async_trait;
use rl_serve::{
    EnvReply, Environment, Error, Message, Result, Rubric, RubricGroup, ScoringContext, State, Task, check_index,
    reward_fn,
};
use std::collections::BTreeMap;

use serde_json::{Value, json};

const WORDS: &[&str] = &["red", "fox", "runs", "over", "the", "hill", "and", "far", "away", "today"];

/// The environment: a train and a test split of generated sentences.
pub struct WordCount {
    train: Vec<String>,
    test: Vec<String>,
    rubric: RubricGroup,
}

/// The last run of digits in a reply.
pub fn last_number(reply: &str) -> Option<u64> {
    reply.split(|c: char| !c.is_ascii_digit()).rfind(|s| !s.is_empty())?.parse().ok()
}

impl WordCount {
    /// Args: `num_examples` (default 200), `seed` (default 0); anything else is an error.
    pub fn new(args: &BTreeMap<String, Value>) -> Result<Self> {
        let mut num = 200;
        let mut seed = 0;
        for (key, value) in args {
            let n =
                value.as_u64().ok_or_else(|| Error::bad_request(format!("env.args.{key}"), "expects an integer"))?;
            match key.as_str() {
                "num_examples" => num = n,
                "seed" => seed = n,
                _ => return Err(Error::bad_request(format!("env.args.{key}"), "word-count takes num_examples, seed")),
            }
        }
        // A small linear congruential generator keeps the example free of dependencies.
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = move |n: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let mut sentences = |count: u64| -> Vec<String> {
            (0..count)
                .map(|_| {
                    (0..1 + next(6)).map(|_| WORDS[next(WORDS.len() as u64) as usize]).collect::<Vec<_>>().join(" ")
                })
                .collect()
        };
        let (train, test) = (sentences(num), sentences(num / 10 + 1));
        let correct = reward_fn("correct", |ctx: &ScoringContext<'_>| {
            let words = ctx.task.data["sentence"].as_str().ok_or("task without a sentence")?.split_whitespace().count();
            Ok(f64::from(u8::from(last_number(ctx.last_reply()) == Some(words as u64))))
        });
        let brevity = reward_fn("reply_chars", |ctx: &ScoringContext<'_>| Ok(ctx.last_reply().chars().count() as f64));
        let rubric = RubricGroup::new(vec![Rubric::new().reward(correct, 1.0).metric(brevity)]);
        Ok(WordCount { train, test, rubric })
    }
}

#[async_trait]
impl Environment for WordCount {
    fn id(&self) -> &str {
        "word-count"
    }

    fn splits(&self) -> Vec<(String, u64)> {
        vec![(String::from("train"), self.train.len() as u64), (String::from("test"), self.test.len() as u64)]
    }

    fn task(&self, split: &str, index: u64) -> Result<Task> {
        let data = if split == "test" { &self.test } else { &self.train };
        check_index(split, &["train", "test"], index, data.len() as u64)?;
        Ok(Task { key: format!("{split}/{index}"), data: json!({"sentence": data[index as usize]}) })
    }

    fn inline_task(&self, data: Value) -> Result<Task> {
        if !data["sentence"].is_string() {
            return Err(Error::bad_request("example.inline_json", "must be {\"sentence\": \"...\"}"));
        }
        Ok(Task { key: String::from("inline"), data })
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        let sentence = task.data["sentence"].as_str().unwrap_or_default();
        Ok(vec![Message::system("Count the words. Answer with the number only."), Message::user(sentence)])
    }

    async fn env_response(&self, _task: &Task, _state: &mut State) -> Result<EnvReply> {
        Ok(EnvReply::Done)
    }

    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }
}
