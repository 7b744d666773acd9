//! `verifiers`: a verifiers v1 environment (`pip install verifiers`: a taskset of tasks with
//! `@vf.reward`/`@vf.metric`/`@vf.stop` methods, run by a harness in a runtime), hosted unchanged.
//! `python -m rl_env.verifiers_host` loads it with verifiers' own loader and runs each episode
//! through verifiers' machinery with its train client pointed at the policy's
//! `/inference/v1/generate`; this side lists its tasks, serves gRPC and turns each finished
//! verifiers trace into a wire trace (`EpisodeRunner`: the episode loop is verifiers', not ours).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rl_serve::{
    EnvReply, Environment, EpisodeRunner, Error, Message, ModelRuntime, Result, RolloutRequest, RubricGroup, State,
    Task, check_index, check_trace, pb,
};
use serde_json::{Map, Value, json};

use crate::args::Args;
use crate::python::sampling_json;
use crate::python::worker::{Launch, Worker};

/// The split names a verifiers env offers (the orchestrator's defaults: `train`, and `test` for evals).
const SPLITS: [&str; 2] = ["train", "test"];

/// A verifiers v1 environment run by a Python host process.
#[derive(Debug)]
pub struct VerifiersEnv {
    id: String,
    splits: Vec<(String, Vec<Value>)>,
    prompts: BTreeMap<String, Vec<Vec<Message>>>,
    metadata: BTreeMap<String, String>,
    rubric: RubricGroup,
    worker: Arc<Worker>,
}

impl VerifiersEnv {
    /// Starts the host from the env's args: `env` (verifiers' `[env]` table: `taskset.id` and its
    /// options, `agent.harness`, `agent.runtime`, `agent.max_turns`, ...), `splits` (`train` and
    /// `test`, each verifiers' task selection: `include`, `exclude`, `shuffle`, `seed`, `skip`,
    /// `limit`; a split of an infinite taskset with none takes its first `infinite_tasks`, default
    /// 4096), `tokenizer` (the policy's model directory; `rl rl` fills it from `[model].path`),
    /// `renderer` (a `renderers` config; default: resolved from the tokenizer), `python` (default
    /// `python3`), `sys_path`, `call_timeout_s` (an episode, default 600), `start_timeout_s`
    /// (default 600).
    pub async fn start(args: &Map<String, Value>) -> Result<Self> {
        let mut a = Args::new("verifiers", args);
        let env = a.raw("env").cloned().unwrap_or_else(|| json!({}));
        let splits = a.raw("splits").cloned().unwrap_or_else(|| json!({}));
        let renderer = a.raw("renderer").cloned();
        let tokenizer = a.string("tokenizer")?;
        let python = a.string("python")?.unwrap_or_else(|| String::from("python3"));
        let sys_path = a.strings("sys_path")?;
        let infinite_tasks = a.u64("infinite_tasks", 4096)?;
        let call_timeout = a.f64("call_timeout_s", 600.0)?;
        let start_timeout = a.f64("start_timeout_s", 600.0)?;
        a.finish()?;
        let taskset = env.get("taskset").and_then(|t| t.get("id")).and_then(Value::as_str).unwrap_or_default();
        if !env.is_object() || taskset.is_empty() {
            return Err(Error::bad_request(
                "env.args.env.taskset.id",
                "a verifiers env needs `env = { taskset = { id = \"<installed taskset>\" } }` (verifiers' [env] table)",
            ));
        }
        let Some(splits_map) = splits.as_object() else {
            return Err(Error::bad_request("env.args.splits", "must be a table of `train` / `test` task selections"));
        };
        if let Some(bad) = splits_map.keys().find(|k| !SPLITS.contains(&k.as_str())) {
            return Err(Error::bad_request(
                format!("env.args.splits.{bad}"),
                format!("unknown split; a verifiers env has {}", SPLITS.join(", ")),
            ));
        }
        let tokenizer = tokenizer.map(PathBuf::from).ok_or_else(|| {
            Error::bad_request("env.args.tokenizer", "the policy's model directory (its tokenizer renders prompts)")
        })?;
        if !tokenizer.join("tokenizer.json").is_file() && !tokenizer.join("tokenizer_config.json").is_file() {
            return Err(Error::bad_request(
                "env.args.tokenizer",
                format!("{} holds no tokenizer (tokenizer.json / tokenizer_config.json)", tokenizer.display()),
            ));
        }
        if infinite_tasks == 0 {
            return Err(Error::bad_request("env.args.infinite_tasks", "must be >= 1"));
        }
        for (key, value) in [("call_timeout_s", call_timeout), ("start_timeout_s", start_timeout)] {
            if !(value > 0.0 && value <= rl_configs::MAX_SECONDS) {
                return Err(Error::bad_request(
                    format!("env.args.{key}"),
                    format!("must be a number of seconds in (0, {}], got {value}", rl_configs::MAX_SECONDS),
                ));
            }
        }
        let selections: Map<String, Value> = SPLITS
            .iter()
            .map(|s| (String::from(*s), splits_map.get(*s).cloned().unwrap_or_else(|| json!({}))))
            .collect();
        let config = json!({
            "env": env, "splits": selections, "tokenizer": tokenizer, "renderer": renderer,
            "infinite_tasks": infinite_tasks,
        });
        let launch = Launch {
            python,
            entry: "rl_env.verifiers_host",
            argv: vec!["--config".into(), config.to_string().into()],
            sys_path: sys_path.into_iter().map(PathBuf::from).collect(),
            start_timeout: Duration::from_secs_f64(start_timeout),
        };
        let (worker, description) = Worker::start(launch, Duration::from_secs_f64(call_timeout)).await?;
        Self::from_description(Arc::new(worker), &description)
    }

    fn from_description(worker: Arc<Worker>, d: &Value) -> Result<Self> {
        let bad = |what: &str| Error::Env(format!("the verifiers host's description has a bad `{what}`"));
        let id = d.get("id").and_then(Value::as_str).ok_or_else(|| bad("id"))?.to_owned();
        let all_prompts = d.get("prompts").and_then(Value::as_object).ok_or_else(|| bad("prompts"))?;
        let (mut splits, mut prompts) = (Vec::new(), BTreeMap::new());
        for name in SPLITS {
            let rows =
                d.get("splits").and_then(|s| s.get(name)).and_then(Value::as_array).ok_or_else(|| bad("splits"))?;
            let formatted = all_prompts.get(name).and_then(Value::as_array).ok_or_else(|| bad("prompts"))?;
            if formatted.len() != rows.len() {
                return Err(bad("prompts"));
            }
            let formatted = formatted
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let items = p.as_array().ok_or_else(|| bad("prompts"))?;
                    items
                        .iter()
                        .map(|m| {
                            Message::from_json(m, &format!("{name} task {i}")).map_err(|e| Error::Env(e.to_string()))
                        })
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            splits.push((String::from(name), rows.clone()));
            prompts.insert(String::from(name), formatted);
        }
        let metadata = d
            .get("metadata")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned())).collect())
            .unwrap_or_default();
        Ok(VerifiersEnv { id, splits, prompts, metadata, rubric: RubricGroup::new(Vec::new()), worker })
    }

    fn rows(&self, split: &str) -> &[Value] {
        self.splits.iter().find(|(name, _)| name == split).map_or(&[], |(_, rows)| rows.as_slice())
    }

    /// The policy as the host's train client takes it: endpoint, key, headers and sampling.
    fn actor_json(actor: &ModelRuntime, index: u32) -> Value {
        let mut sampling = sampling_json(&actor.sampling);
        // verifiers names the completion budget `max_tokens`, as `/inference/v1/generate` does.
        if let Some(n) = sampling.remove("max_completion_tokens") {
            sampling.insert(String::from("max_tokens"), n);
        }
        if let Some(seed) = actor.sampling.seed {
            sampling.insert(String::from("seed"), json!(seed.wrapping_add(u64::from(index))));
        }
        if let Some(salt) = &actor.cache_salt {
            sampling.insert(String::from("cache_salt"), json!(salt));
        }
        rl_serve::Sampling::state_neutral_fields(&mut sampling);
        json!({
            "base_url": actor.base_url,
            "model": actor.model,
            "api_key": actor.api_key.as_ref().map(|k| k.0.clone()),
            "headers": actor.headers,
            "timeout_s": actor.timeout.as_secs_f64(),
            "sampling": sampling,
        })
    }
}

#[async_trait]
impl Environment for VerifiersEnv {
    fn id(&self) -> &str {
        &self.id
    }

    fn splits(&self) -> Vec<(String, u64)> {
        self.splits.iter().map(|(name, rows)| (name.clone(), rows.len() as u64)).collect()
    }

    fn task(&self, split: &str, index: u64) -> Result<Task> {
        check_index(split, &SPLITS, index, self.rows(split).len() as u64)?;
        Ok(Task { key: format!("{split}/{index}"), data: self.rows(split)[index as usize].clone() })
    }

    fn inline_task(&self, _data: Value) -> Result<Task> {
        Err(Error::bad_request(
            "example.inline_json",
            "a verifiers env takes tasks from its taskset by split and index (example.dataset)",
        ))
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        let (split, index) = split_index(task)?;
        Ok(self.prompts.get(split).and_then(|p| p.get(index)).cloned().unwrap_or_default())
    }

    async fn env_response(&self, _task: &Task, _state: &mut State) -> Result<EnvReply> {
        Err(Error::Env(String::from(
            "a verifiers env runs its episodes in verifiers (EpisodeRunner), not turn by turn",
        )))
    }

    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }

    fn metadata(&self) -> BTreeMap<String, String> {
        self.metadata.clone()
    }

    fn episode_runner(&self) -> Option<&dyn EpisodeRunner> {
        Some(self)
    }
}

#[async_trait]
impl EpisodeRunner for VerifiersEnv {
    async fn run_episode(&self, req: RolloutRequest<'_>) -> Vec<pb::Trace> {
        let traces = async {
            let (split, index) = split_index(req.task)?;
            let params = json!({"split": split, "index": index, "actor": Self::actor_json(req.actor, req.index)});
            let answer = self.worker.call("run", params).await?;
            let items = answer
                .get("traces")
                .and_then(Value::as_array)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| Error::Env(String::from("the verifiers host answered a run without traces")))?;
            Ok::<_, Error>(items.iter().enumerate().map(|(i, t)| wire_trace(t, i)).collect::<Vec<_>>())
        }
        .await;
        traces.unwrap_or_else(|e| vec![error_trace(&e)])
    }
}

/// The split and index of a task listed by this env (`<split>/<index>`).
fn split_index(task: &Task) -> Result<(&str, usize)> {
    task.key
        .split_once('/')
        .and_then(|(split, index)| Some((split, index.parse().ok()?)))
        .ok_or_else(|| Error::bad_request("example", "a verifiers env runs only the tasks it lists"))
}

/// A trace that only records why the episode produced none.
fn error_trace(e: &Error) -> pb::Trace {
    pb::Trace {
        id: format!("verifiers-error-{:x}", std::process::id()),
        stop_condition: String::from("error"),
        errors: vec![e.to_trace_error()],
        ..Default::default()
    }
}

/// One trace from the host; anything malformed becomes the trace's env error.
fn wire_trace(v: &Value, position: usize) -> pb::Trace {
    match parse_trace(v) {
        Ok(trace) => match check_trace(&trace, &format!("verifiers trace {position}")) {
            Ok(()) => trace,
            Err(e) => error_trace(&Error::Env(format!("the verifiers trace does not hold together: {e}"))),
        },
        Err(e) => error_trace(&e),
    }
}

fn parse_trace(v: &Value) -> Result<pb::Trace> {
    let bad = |what: &str| Error::Env(format!("the verifiers host sent a trace with a bad `{what}`"));
    let str_of = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let nodes =
        v.get("nodes")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("nodes"))?
            .iter()
            .map(|n| {
                let ids = |k: &str| -> Result<Vec<u32>> {
                    n.get(k).and_then(Value::as_array).map_or(Ok(Vec::new()), |a| {
                        a.iter().map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| bad(k))).collect()
                    })
                };
                Ok(pb::MessageNode {
                    parent: n
                        .get("parent")
                        .and_then(Value::as_i64)
                        .and_then(|p| i32::try_from(p).ok())
                        .ok_or_else(|| bad("parent"))?,
                    role: str_of(n, "role"),
                    content: str_of(n, "content"),
                    tool_calls: n
                        .get("tool_calls")
                        .and_then(Value::as_array)
                        .map(|calls| {
                            calls
                                .iter()
                                .map(|c| pb::ToolCall {
                                    id: str_of(c, "id"),
                                    name: str_of(c, "name"),
                                    arguments: str_of(c, "arguments"),
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    tool_call_id: str_of(n, "tool_call_id"),
                    sampled: n.get("sampled").and_then(Value::as_bool).unwrap_or(false),
                    token_ids: ids("token_ids")?,
                    mask: n.get("mask").and_then(Value::as_array).map_or(Ok(Vec::new()), |a| {
                        a.iter().map(|x| x.as_bool().ok_or_else(|| bad("mask"))).collect()
                    })?,
                    logprobs: n.get("logprobs").and_then(Value::as_array).map_or(Ok(Vec::new()), |a| {
                        a.iter().map(|x| x.as_f64().map(|x| x as f32).ok_or_else(|| bad("logprobs"))).collect()
                    })?,
                    finish_reason: str_of(n, "finish_reason"),
                    parse_error: false,
                })
            })
            .collect::<Result<Vec<_>>>()?;
    let rewards = v
        .get("rewards")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, r)| {
                    let num = |f: &str| r.get(f).and_then(Value::as_f64).ok_or_else(|| bad("rewards"));
                    Ok((k.clone(), pb::RewardValue { score: num("score")?, weight: num("weight")? }))
                })
                .collect::<Result<_>>()
        })
        .transpose()?
        .unwrap_or_default();
    let metrics = v
        .get("metrics")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, x)| Some((k.clone(), x.as_f64()?))).collect())
        .unwrap_or_default();
    let errors = v
        .get("errors")
        .and_then(Value::as_array)
        .map(|errors| errors.iter().map(|e| trace_error(&str_of(e, "kind"), &str_of(e, "message"))).collect())
        .unwrap_or_default();
    let tools = v
        .get("tools")
        .and_then(Value::as_array)
        .map(|tools| {
            tools
                .iter()
                .map(|t| pb::ToolSpec {
                    name: str_of(t, "name"),
                    description: str_of(t, "description"),
                    parameters_json: t.get("parameters").map(Value::to_string).unwrap_or_else(|| String::from("{}")),
                })
                .collect()
        })
        .unwrap_or_default();
    let timing = v.get("timing").map(|t| {
        let num = |f: &str| t.get(f).and_then(Value::as_f64).unwrap_or(0.0);
        pb::Timing { total_s: num("total_s"), model_s: num("model_s"), scoring_s: num("scoring_s") }
    });
    Ok(pb::Trace {
        id: str_of(v, "id"),
        member_id: str_of(v, "member_id"),
        nodes,
        tools,
        rewards,
        reward: v.get("reward").and_then(Value::as_f64).unwrap_or(0.0),
        metrics,
        stop_condition: str_of(v, "stop_condition"),
        is_truncated: v.get("is_truncated").and_then(Value::as_bool).unwrap_or(false),
        errors,
        reward_errors: Vec::new(),
        timing,
        num_turns: v.get("num_turns").and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok()).unwrap_or(0),
        scored_with: None,
        task_json: String::new(),
        task_key: String::new(),
        sampling_temperature: v.get("sampling_temperature").and_then(Value::as_f64),
        turn_rewards: Vec::new(),
    })
}

/// A verifiers error as the server's taxonomy records it (which decides what is retried).
fn trace_error(kind: &str, message: &str) -> pb::TraceError {
    let message = format!("verifiers: {message}");
    match kind {
        "infrastructure" => Error::Infrastructure(message),
        "timeout" => Error::Timeout(message),
        "overlong_prompt" => Error::OverlongPrompt(message),
        "bad_request" => Error::bad_request("model request", message),
        _ => Error::Env(message),
    }
    .to_trace_error()
}
