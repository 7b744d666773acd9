//! `python`: an environment written in Python with the `rl_env` package (`python/rl-env`), hosted
//! by this server. The Python side owns the dataset, prompts, `env_response`, tools and reward
//! functions; this side runs the episodes, builds the token-level traces and serves gRPC, exactly
//! as for the built-in envs (so traces cannot differ between the two). See ARCHITECTURE.md for why.

pub(crate) mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rl_serve::{
    BatchFunction, BatchRewardFn, BranchOutput, EnvAlgorithm, EnvReply, Environment, Error, Message, ModelRuntime,
    Result, Rubric, RubricGroup, Scored, ScoringContext, State, Task, ToolSpec, check_index, on_sampled_tokens, pb,
};
use serde_json::{Map, Value, json};
use worker::{Launch, Worker};

use crate::args::Args;

/// An environment whose logic runs in a Python worker process.
#[derive(Debug)]
pub struct PythonEnv {
    id: String,
    splits: Vec<(String, Vec<Value>)>,
    /// Each dataset row's prompt, formatted once by the Python side at load.
    prompts: BTreeMap<String, Vec<Vec<Message>>>,
    tools: Vec<ToolSpec>,
    max_turns: u32,
    single_turn: bool,
    rubric: RubricGroup,
    metadata: BTreeMap<String, String>,
    /// Names of the env's own advantage algorithms.
    algorithms: Vec<String>,
    worker: Arc<Worker>,
}

impl PythonEnv {
    /// Starts the worker from the env's args: `file` (a `.py` file) or `module`, `args` (keyword
    /// arguments of its `load_environment`), `python` (default `python3`), `sys_path` (import
    /// directories), `call_timeout_s` (default 300), `start_timeout_s` (default 300).
    pub async fn start(args: &Map<String, Value>) -> Result<Self> {
        let mut a = Args::new("python", args);
        let file = a.string("file")?;
        let module = a.string("module")?;
        let env_args = a.raw("args").cloned().unwrap_or_else(|| json!({}));
        let python = a.string("python")?.unwrap_or_else(|| String::from("python3"));
        let sys_path = a.strings("sys_path")?;
        let call_timeout = a.f64("call_timeout_s", 300.0)?;
        let start_timeout = a.f64("start_timeout_s", 300.0)?;
        a.finish()?;
        let mut argv: Vec<std::ffi::OsString> = match (file, module) {
            (Some(f), None) => vec!["--file".into(), f.into()],
            (None, Some(m)) => vec!["--module".into(), m.into()],
            _ => {
                return Err(Error::bad_request(
                    "env.args.file",
                    "a python env needs exactly one of `file` (a .py file) or `module` (an importable module)",
                ));
            }
        };
        if argv[0] == "--file" && !PathBuf::from(&argv[1]).is_file() {
            return Err(Error::bad_request("env.args.file", format!("{} is not a file", argv[1].to_string_lossy())));
        }
        if !env_args.is_object() {
            return Err(Error::bad_request("env.args.args", "must be a table (keyword arguments of load_environment)"));
        }
        for (key, value) in [("call_timeout_s", call_timeout), ("start_timeout_s", start_timeout)] {
            if !(value > 0.0 && value <= rl_configs::MAX_SECONDS) {
                return Err(Error::bad_request(
                    format!("env.args.{key}"),
                    format!("must be a number of seconds in (0, {}], got {value}", rl_configs::MAX_SECONDS),
                ));
            }
        }
        argv.extend(["--args".into(), env_args.to_string().into()]);
        let launch = Launch {
            python,
            entry: "rl_env.worker",
            argv,
            sys_path: sys_path.into_iter().map(PathBuf::from).collect(),
            start_timeout: Duration::from_secs_f64(start_timeout),
        };
        let (worker, description) = Worker::start(launch, Duration::from_secs_f64(call_timeout)).await?;
        Self::from_description(Arc::new(worker), &description)
    }

    fn from_description(worker: Arc<Worker>, d: &Value) -> Result<Self> {
        let bad = |what: &str| Error::Env(format!("the python environment's description has a bad `{what}`"));
        let id = d.get("id").and_then(Value::as_str).ok_or_else(|| bad("id"))?.to_owned();
        let mut splits = Vec::new();
        let mut prompts = BTreeMap::new();
        let all_prompts = d.get("prompts").and_then(Value::as_object).ok_or_else(|| bad("prompts"))?;
        for (name, rows) in d.get("splits").and_then(Value::as_object).ok_or_else(|| bad("splits"))? {
            let rows = rows.as_array().ok_or_else(|| bad("splits"))?;
            let formatted = all_prompts.get(name).and_then(Value::as_array).ok_or_else(|| bad("prompts"))?;
            if formatted.len() != rows.len() {
                return Err(bad("prompts"));
            }
            let formatted = formatted
                .iter()
                .enumerate()
                .map(|(i, p)| messages_from(Some(p), &format!("the prompt of {name} row {i}")))
                .collect::<Result<Vec<_>>>()?;
            splits.push((name.clone(), rows.clone()));
            prompts.insert(name.clone(), formatted);
        }
        let tools = d
            .get("tools")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("tools"))?
            .iter()
            .map(|t| {
                Ok(ToolSpec {
                    name: t.get("name").and_then(Value::as_str).ok_or_else(|| bad("tools.name"))?.to_owned(),
                    description: t.get("description").and_then(Value::as_str).unwrap_or("").to_owned(),
                    parameters: t.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"})),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let max_turns = d
            .get("max_turns")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n >= 1)
            .ok_or_else(|| bad("max_turns"))?;
        let single_turn = d.get("single_turn").and_then(Value::as_bool).unwrap_or(false);
        let mut functions = Vec::new();
        for f in d.get("rubric").and_then(Value::as_array).ok_or_else(|| bad("rubric"))? {
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| bad("rubric.name"))?;
            let weight = f.get("weight").and_then(Value::as_f64).ok_or_else(|| bad("rubric.weight"))?;
            let per_turn = f.get("per_turn").and_then(Value::as_bool).unwrap_or(false);
            functions.push(BatchFunction { name: name.to_owned(), weight, per_turn });
        }
        let rubric = Rubric::new().batch(Arc::new(PythonRubric { functions, worker: worker.clone() }));
        let algorithms = d
            .get("algorithms")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("algorithms"))?
            .iter()
            .map(|name| name.as_str().map(str::to_owned).ok_or_else(|| bad("algorithms")))
            .collect::<Result<Vec<_>>>()?;
        let metadata = d
            .get("metadata")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect())
            .unwrap_or_default();
        Ok(PythonEnv {
            id,
            splits,
            prompts,
            tools,
            max_turns,
            single_turn,
            rubric: RubricGroup::new(vec![rubric]),
            metadata,
            algorithms,
            worker,
        })
    }
}

/// Messages from the Python side; a malformed one is the environment's error.
fn messages_from(value: Option<&Value>, what: &str) -> Result<Vec<Message>> {
    let items =
        value.and_then(Value::as_array).ok_or_else(|| Error::Env(format!("{what} is not a list of messages")))?;
    items
        .iter()
        .enumerate()
        .map(|(i, m)| Message::from_json(m, &format!("{what}[{i}]")).map_err(|e| Error::Env(e.to_string())))
        .collect()
}

/// A request model as the SDK's `rl_env.Model` takes it: where it is and its OpenAI sampling fields.
fn model_json(key: &str, m: &ModelRuntime) -> Value {
    let sampling = sampling_json(&m.sampling);
    json!({"key": key, "base_url": m.base_url, "model": m.model, "sampling": sampling, "timeout_s": m.timeout.as_secs_f64()})
}

/// A runtime's sampling as OpenAI request fields (its extra fields included).
pub(crate) fn sampling_json(s: &rl_serve::Sampling) -> Map<String, Value> {
    let mut sampling = s.extra.clone();
    let fields = [
        ("temperature", s.temperature.map(|t| Value::from(t.value()))),
        ("top_p", s.top_p.map(Value::from)),
        ("top_k", s.top_k.map(Value::from)),
        ("max_completion_tokens", s.max_completion_tokens.map(Value::from)),
        ("seed", s.seed.map(Value::from)),
        ("stop", (!s.stop.is_empty()).then(|| Value::from(s.stop.clone()))),
    ];
    for (name, value) in fields {
        if let Some(v) = value {
            sampling.insert(name.to_owned(), v);
        }
    }
    sampling
}

fn messages_json(messages: &[Message]) -> Value {
    Value::Array(messages.iter().map(Message::to_json).collect())
}

#[async_trait]
impl Environment for PythonEnv {
    fn id(&self) -> &str {
        &self.id
    }

    fn splits(&self) -> Vec<(String, u64)> {
        self.splits.iter().map(|(name, rows)| (name.clone(), rows.len() as u64)).collect()
    }

    fn task(&self, split: &str, index: u64) -> Result<Task> {
        let names: Vec<&str> = self.splits.iter().map(|(n, _)| n.as_str()).collect();
        let rows = self.splits.iter().find(|(n, _)| n == split).map_or(&[][..], |(_, r)| r.as_slice());
        check_index(split, &names, index, rows.len() as u64)?;
        Ok(Task { key: format!("{split}/{index}"), data: rows[index as usize].clone() })
    }

    fn inline_task(&self, data: Value) -> Result<Task> {
        if !data.is_object() {
            return Err(Error::bad_request(
                "example.inline_json",
                "a python env's task is a JSON object (a dataset row)",
            ));
        }
        Ok(Task { key: String::from("inline"), data })
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        // Dataset tasks were formatted at load (keys are `split/index`, made by `task`); inline
        // tasks are formatted by the Python side now.
        let formatted = task
            .key
            .rsplit_once('/')
            .and_then(|(split, index)| self.prompts.get(split).and_then(|p| p.get(index.parse::<usize>().ok()?)));
        if let Some(messages) = formatted {
            return Ok(messages.clone());
        }
        let answer = self.worker.call("prompt", json!({"task": task.data})).await?;
        messages_from(answer.get("messages"), "format_prompt()")
    }

    fn tools(&self, _task: &Task) -> Vec<ToolSpec> {
        self.tools.clone()
    }

    fn max_turns(&self, _task: &Task) -> u32 {
        self.max_turns
    }

    async fn env_response(&self, task: &Task, state: &mut State) -> Result<EnvReply> {
        if self.single_turn {
            return Ok(EnvReply::Done);
        }
        let params = json!({
            "task": task.data,
            "messages": messages_json(&state.messages),
            "state": state.data,
            "turn": state.turns,
        });
        let answer = self.worker.call("env_response", params).await?;
        if let Some(data) = answer.get("state").and_then(Value::as_object) {
            state.data = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        if answer.get("done").and_then(Value::as_bool).unwrap_or(true) {
            return Ok(EnvReply::Done);
        }
        Ok(EnvReply::Continue(messages_from(answer.get("messages"), "env_response()")?))
    }

    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }

    fn algorithms(&self) -> Vec<Arc<dyn EnvAlgorithm>> {
        let algorithm = |name: &String| PythonAlgorithm { name: name.clone(), worker: self.worker.clone() };
        self.algorithms.iter().map(|name| Arc::new(algorithm(name)) as Arc<dyn EnvAlgorithm>).collect()
    }

    fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = self.metadata.clone();
        m.insert(String::from("runtime"), String::from("python"));
        m
    }
}

/// The Python rubric: every function scored in one call (concurrently on the Python side).
struct PythonRubric {
    functions: Vec<BatchFunction>,
    worker: Arc<Worker>,
}

#[async_trait]
impl BatchRewardFn for PythonRubric {
    fn functions(&self) -> &[BatchFunction] {
        &self.functions
    }

    async fn score_all(&self, ctx: &ScoringContext<'_>) -> Vec<std::result::Result<Scored, String>> {
        let training_context = ctx.training_context.map(
            |c| json!({"step": c.step, "ckpt_step": c.ckpt_step, "policy_version": c.policy_version, "extra": c.extra}),
        );
        let models: Vec<Value> = ctx.models.iter().map(|(key, m)| model_json(key, m)).collect();
        let params = json!({
            "task": ctx.task.data,
            "messages": messages_json(ctx.messages),
            "state": ctx.state.data,
            "turn": ctx.state.turns,
            "training_context": training_context,
            "models": models,
        });
        let failed = |message: String| vec![Err(message); self.functions.len()];
        let answer = match self.worker.call("score", params).await {
            Ok(answer) => answer,
            Err(Error::Env(message)) => return failed(message),
            Err(other) => return failed(other.to_string()),
        };
        let Some(results) = answer.get("results").and_then(Value::as_array).filter(|r| r.len() == self.functions.len())
        else {
            return failed(String::from("the python worker answered `score` without one result per function"));
        };
        results
            .iter()
            .map(|r| {
                let turns = r.get("turns").and_then(Value::as_array).map(|t| t.iter().map(Value::as_f64).collect());
                match (r.get("value").and_then(Value::as_f64), turns, r.get("error").and_then(Value::as_str)) {
                    (Some(v), _, _) => Ok(Scored::Value(v)),
                    (None, Some(Some(t)), _) => Ok(Scored::Turns(t)),
                    (None, Some(None), _) => Err(String::from("turn scores that are not all numbers")),
                    (None, None, Some(e)) => Err(e.to_owned()),
                    (None, None, None) => Err(String::from("neither a value, turn scores nor an error")),
                }
            })
            .collect()
    }
}

/// An advantage algorithm the Python env registered: one value per trace, on its sampled tokens.
struct PythonAlgorithm {
    name: String,
    worker: Arc<Worker>,
}

#[async_trait]
impl EnvAlgorithm for PythonAlgorithm {
    fn id(&self) -> &str {
        &self.name
    }

    fn loss(&self) -> pb::LossChannel {
        pb::LossChannel::Rl
    }

    async fn run(
        &self,
        traces: &[pb::Trace],
        fields: &Map<String, Value>,
        _models: &BTreeMap<String, ModelRuntime>,
    ) -> Result<Vec<Vec<BranchOutput>>> {
        let traces_json: Vec<Value> = traces
            .iter()
            .map(|t| {
                json!({
                    "reward": t.reward,
                    "rewards": t.rewards.iter().map(|(k, r)| (k.clone(), json!(r.score))).collect::<Map<String, Value>>(),
                    "metrics": t.metrics,
                    "failed": !t.errors.is_empty(),
                    "task": serde_json::from_str::<Value>(&t.task_json).unwrap_or(Value::Null),
                    "messages": t.nodes.iter().map(|n| json!({"role": n.role, "content": n.content})).collect::<Vec<_>>(),
                    "member_id": t.member_id,
                })
            })
            .collect();
        let params = json!({"name": self.name, "traces": traces_json, "fields": fields});
        let answer = self.worker.call("algorithm", params).await?;
        let values = answer
            .get("advantages")
            .and_then(Value::as_array)
            .filter(|v| v.len() == traces.len())
            .ok_or_else(|| Error::Env(format!("algorithm {} answered no advantage list", self.name)))?;
        Ok(traces
            .iter()
            .zip(values)
            .map(|(t, v)| v.as_f64().map_or_else(Vec::new, |a| on_sampled_tokens(t, a as f32)))
            .collect())
    }
}
