//! `dataset`: a single-turn environment whose tasks come from data files (JSONL, JSON, Parquet, CSV, Arrow) or
//! a Hugging Face dataset's splits — a prompt field, an answer field, an optional system prompt and few-shot turns — scored by one of the built-in
//! matchers (`exact`, `normalized`, `difflib`, `regex`, `boxed`, `numeric`).

mod file;
mod reward;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use rl_serve::{
    EnvReply, Environment, Error, Message, Result, Rubric, RubricGroup, ScoringContext, State, Task, reward_fn,
};
use serde_json::{Map, Value};

use crate::args::Args;
use crate::rng::Rng;
use crate::splits::Splits;
use file::{Fields, Source, prompt_messages, read_rows, text_field};
use reward::Matcher;

/// The reward choices, as named in `reward`.
const REWARDS: &[&str] = &["exact", "normalized", "difflib", "regex", "boxed", "numeric"];

/// The file-backed single-turn environment.
#[derive(Debug)]
pub struct FileDataset {
    data: Splits<Value>,
    fields: Fields,
    system_prompt: Option<String>,
    few_shot: Vec<Message>,
    rubric: RubricGroup,
}

impl FileDataset {
    /// Builds the env from its args: `path` (a JSONL, JSON, Parquet, CSV or Arrow file) and `eval_path`, or
    /// `name` (a Hugging Face dataset: a hub id in the local hub cache, or a directory) with
    /// `subsets`, `split` (default `train`) and `eval_split`; else `eval_fraction` (with `seed`)
    /// holds tasks out; `prompt_field` (default `question`; a text, or a list of chat messages),
    /// `answer_field` (default `answer`),
    /// `system_prompt`, `few_shot` (a list of `{user, assistant}` tables), `reward` (one of
    /// exact, normalized, difflib, regex, boxed, numeric; default normalized), `pattern` (regex
    /// only) and `tolerance` (boxed and numeric; default 1e-6, relative to max(1, |answer|)).
    pub fn new(args: &Map<String, Value>) -> Result<Self> {
        let mut a = Args::new("dataset", args);
        let path = a.string("path")?;
        let eval_path = a.string("eval_path")?;
        let name = a.string("name")?;
        let subsets = a.strings("subsets")?;
        let split_name = a.string("split")?;
        let eval_split = a.string("eval_split")?;
        let eval_fraction = a.f64("eval_fraction", 0.0)?;
        let seed = a.u64("seed", 0)?;
        let fields = Fields {
            prompt: a.string("prompt_field")?.unwrap_or_else(|| String::from("question")),
            answer: a.string("answer_field")?.unwrap_or_else(|| String::from("answer")),
        };
        let system_prompt = a.string("system_prompt")?;
        let few_shot = few_shot(a.raw("few_shot"))?;
        let reward = a.choice("reward", "normalized", REWARDS)?;
        let pattern = a.string("pattern")?;
        let tolerance = a.raw("tolerance").map(|_| a.f64("tolerance", 1e-6)).transpose()?;
        a.finish()?;
        if !(0.0..1.0).contains(&eval_fraction) {
            return Err(Error::bad_request(
                "env.args.eval_fraction",
                format!("must be in [0, 1), got {eval_fraction}"),
            ));
        }
        let held_out = eval_path.as_ref().map(|_| "eval_path").or(eval_split.as_ref().map(|_| "eval_split"));
        if let Some(key) = held_out.filter(|_| eval_fraction > 0.0) {
            return Err(Error::bad_request(
                "env.args.eval_fraction",
                format!("give either `{key}` or `eval_fraction`, not both"),
            ));
        }
        let matcher = matcher(&reward, pattern, tolerance)?;

        let (train_source, eval_source) = match (&path, &name) {
            (Some(path), None) => {
                if let Some(key) = [
                    ("subsets", !subsets.is_empty()),
                    ("split", split_name.is_some()),
                    ("eval_split", eval_split.is_some()),
                ]
                .into_iter()
                .find_map(|(k, set)| set.then_some(k))
                {
                    return Err(Error::bad_request(
                        format!("env.args.{key}"),
                        "picks from a dataset `name`, not a `path`",
                    ));
                }
                (Source::File(Path::new(path)), eval_path.as_deref().map(|p| Source::File(Path::new(p))))
            }
            (None, Some(name)) => {
                if eval_path.is_some() {
                    return Err(Error::bad_request(
                        "env.args.eval_path",
                        "with a dataset `name`, hold tasks out with `eval_split`",
                    ));
                }
                let split = split_name.as_deref().unwrap_or("train");
                let at = |split| Source::Dataset { name, subsets: &subsets, split };
                (at(split), eval_split.as_deref().map(at))
            }
            (Some(_), Some(_)) => {
                return Err(Error::bad_request("env.args.name", "give either `path` or `name`, not both"));
            }
            (None, None) => {
                return Err(Error::bad_request(
                    "env.args.path",
                    "the dataset env needs `path` (a JSONL, JSON, Parquet, CSV or Arrow file of tasks) or `name` (a Hugging Face dataset)",
                ));
            }
        };
        let (train_key, eval_key) = if name.is_some() {
            ("env.args.name", "env.args.eval_split")
        } else {
            ("env.args.path", "env.args.eval_path")
        };
        let train = read_rows(&train_source, &fields, train_key)?;
        let (train, test) = match &eval_source {
            Some(source) => (train, read_rows(source, &fields, eval_key)?),
            None => split(train, eval_fraction, seed),
        };
        let extracts = matches!(matcher, Matcher::Regex(_) | Matcher::Boxed { .. } | Matcher::Numeric { .. });
        let matcher = Arc::new(matcher);
        let answer_field = fields.answer.clone();
        let m = Arc::clone(&matcher);
        let mut rubric = Rubric::new().reward(
            reward_fn("correct", move |ctx: &ScoringContext<'_>| {
                let answer = answer_of(ctx.task, &answer_field)?;
                Ok(m.score(ctx.last_reply(), &answer))
            }),
            1.0,
        );
        if extracts {
            rubric = rubric.metric(reward_fn("extracted", move |ctx: &ScoringContext<'_>| {
                Ok(f64::from(u8::from(matcher.extract(ctx.last_reply()).is_some())))
            }));
        }
        Ok(FileDataset {
            data: Splits {
                train: train.into_iter().map(|r| r.data).collect(),
                test: test.into_iter().map(|r| r.data).collect(),
            },
            fields,
            system_prompt,
            few_shot,
            rubric: RubricGroup::new(vec![rubric]),
        })
    }
}

fn answer_of(task: &Task, field: &str) -> std::result::Result<String, String> {
    match &task.data {
        Value::Object(obj) => text_field(obj, field),
        _ => Err(String::from("the task is not a JSON object")),
    }
}

fn matcher(reward: &str, pattern: Option<String>, tolerance: Option<f64>) -> Result<Matcher> {
    if pattern.is_some() && reward != "regex" {
        return Err(Error::bad_request(
            "env.args.pattern",
            format!("is used by reward = \"regex\" only, not {reward:?}"),
        ));
    }
    if tolerance.is_some() && !matches!(reward, "boxed" | "numeric") {
        return Err(Error::bad_request(
            "env.args.tolerance",
            format!("is used by reward = \"boxed\" or \"numeric\" only, not {reward:?}"),
        ));
    }
    let tolerance = tolerance.unwrap_or(1e-6);
    if tolerance < 0.0 {
        return Err(Error::bad_request("env.args.tolerance", "must be >= 0"));
    }
    Ok(match reward {
        "exact" => Matcher::Exact,
        "normalized" => Matcher::Normalized,
        "difflib" => Matcher::Difflib,
        "regex" => {
            let pattern = pattern
                .ok_or_else(|| Error::bad_request("env.args.pattern", "reward = \"regex\" needs a `pattern`"))?;
            Matcher::Regex(
                regex::Regex::new(&pattern).map_err(|e| Error::bad_request("env.args.pattern", e.to_string()))?,
            )
        }
        "boxed" => Matcher::Boxed { tolerance },
        _ => Matcher::Numeric { tolerance },
    })
}

/// `few_shot = [{user = "...", assistant = "..."}, ...]` as alternating messages.
fn few_shot(value: Option<&Value>) -> Result<Vec<Message>> {
    let Some(value) = value else { return Ok(Vec::new()) };
    let bad = |i: usize| {
        Error::bad_request(format!("env.args.few_shot[{i}]"), "must be a table with string `user` and `assistant`")
    };
    let items = value.as_array().ok_or_else(|| Error::bad_request("env.args.few_shot", "must be a list of tables"))?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let obj = item.as_object().filter(|o| o.len() == 2).ok_or_else(|| bad(i))?;
        let (Some(Value::String(user)), Some(Value::String(assistant))) = (obj.get("user"), obj.get("assistant"))
        else {
            return Err(bad(i));
        };
        out.push(Message::user(user.as_str()));
        out.push(Message::assistant(assistant.as_str()));
    }
    Ok(out)
}

/// Splits off `fraction` of the rows for evaluation, chosen by a seeded shuffle.
fn split(rows: Vec<file::Row>, fraction: f64, seed: u64) -> (Vec<file::Row>, Vec<file::Row>) {
    let n_eval = (rows.len() as f64 * fraction).round() as usize;
    if n_eval == 0 {
        return (rows, Vec::new());
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    Rng::new(seed, "dataset/split").shuffle(&mut order);
    let eval: std::collections::BTreeSet<usize> = order[..n_eval].iter().copied().collect();
    let (mut train, mut test) = (Vec::new(), Vec::new());
    for (i, row) in rows.into_iter().enumerate() {
        if eval.contains(&i) { test.push(row) } else { train.push(row) }
    }
    (train, test)
}

#[async_trait]
impl Environment for FileDataset {
    fn id(&self) -> &str {
        "dataset"
    }

    fn splits(&self) -> Vec<(String, u64)> {
        self.data.sizes()
    }

    fn task(&self, split: &str, index: u64) -> Result<Task> {
        self.data.task(split, index)
    }

    fn inline_task(&self, data: Value) -> Result<Task> {
        let Value::Object(obj) = &data else {
            return Err(Error::bad_request("example.inline_json", "must be a JSON object (a dataset row)"));
        };
        prompt_messages(obj, &self.fields.prompt).map_err(|m| Error::bad_request("example.inline_json", m))?;
        text_field(obj, &self.fields.answer).map_err(|m| Error::bad_request("example.inline_json", m))?;
        Ok(Task { key: String::from("inline"), data })
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        let Value::Object(obj) = &task.data else {
            return Err(Error::Env(String::from("the task is not a JSON object")));
        };
        let mut prompt = prompt_messages(obj, &self.fields.prompt).map_err(Error::Env)?;
        // The row's own system message comes first and wins over `system_prompt`; few-shot turns
        // follow the system message.
        let own_system = prompt.first().is_some_and(|m| m.role == rl_serve::Role::System);
        let mut messages = Vec::with_capacity(self.few_shot.len() + prompt.len() + 1);
        if own_system {
            messages.push(prompt.remove(0));
        } else if let Some(system) = &self.system_prompt {
            messages.push(Message::system(system.as_str()));
        }
        messages.extend(self.few_shot.iter().cloned());
        messages.extend(prompt);
        Ok(messages)
    }

    async fn env_response(&self, _task: &Task, _state: &mut State) -> Result<EnvReply> {
        Ok(EnvReply::Done)
    }

    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }
}
