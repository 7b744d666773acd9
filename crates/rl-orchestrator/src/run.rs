//! The dispatch loop. For each step n: wait until the loaded policy version v is at least
//! n - 1 - max_async_level (loading new broadcasts into the inference server as they appear), run
//! the step's groups on the env servers with `training_context {step: n, policy_version: v}` and
//! `cache_salt = v`, drop groups older than `max_off_policy_steps`, compute advantages, pack, and
//! write `rollouts/step_n/rank_0.bin`. Generation of step n+1 therefore overlaps training of step n
//! whenever the async level allows it. Checkpoints, resume and online evaluation hang off the loop.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;
use rl_configs::{OrchestratorConfig, POLICY_KEY, SamplingConfig, TrainEnvConfig};
use rl_proto::train::v1::TrainBatch;
use rl_serve::{ClientOptions, EnvClient, ModelRuntime, Sampling, pb};
use serde_json::{Map, Value, json};

use crate::algorithms::{Algorithm, aggregate};
use crate::checkpoint::{self, OrchestratorState};
use crate::error::{Error, Result};
use crate::eval::eval_metrics;
use crate::scoring::{Endpoint, ScoringContext, remote_channels, root_url};
use crate::sink::{TrainingSample, pack, samples};

/// Attempts of a group whose rollouts failed with retryable errors.
const GROUP_ATTEMPTS: u32 = 3;

struct Env {
    index: u32,
    name: String,
    client: EnvClient,
    train_size: u64,
    group_size: u32,
    sampling: SamplingConfig,
    algorithms: Vec<Algorithm>,
    ratio: f64,
    /// Member ids of a multi-agent env (empty for single-agent envs).
    members: Vec<String>,
    /// The member that only judges, if the env has one.
    judge: Option<String>,
}

impl Env {
    /// RAE's (momentum, member whose traces are dropped), when the env runs it.
    fn rae(&self) -> Option<(f64, Option<&str>)> {
        self.algorithms.iter().find_map(|a| match a {
            Algorithm::Rae { momentum, drop_judge } => Some((*momentum, self.judge.as_deref().filter(|_| *drop_judge))),
            _ => None,
        })
    }
}

struct EvalEnv {
    name: String,
    client: EnvClient,
    split: String,
    examples: u64,
    k: u32,
    sampling: SamplingConfig,
}

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSummary {
    /// The step.
    pub step: u64,
    /// Its metrics line.
    pub metrics: Value,
}

/// The orchestrator of one run.
pub struct Orchestrator {
    cfg: OrchestratorConfig,
    envs: Vec<Env>,
    eval_envs: Vec<EvalEnv>,
    http: reqwest::Client,
    endpoints: BTreeMap<String, Endpoint>,
    version: u64,
    rng: u64,
    /// The checkpoint step this run resumed from.
    resumed: Option<u64>,
    /// RAE baselines per env name, keyed `task_key|member_id`.
    rae: BTreeMap<String, BTreeMap<String, f64>>,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("envs", &self.envs.iter().map(|e| &e.name).collect::<Vec<_>>())
            .field("version", &self.version)
            .finish()
    }
}

fn client(address: Option<&String>, name: &str, cfg: &OrchestratorConfig) -> Result<EnvClient> {
    let address = address.ok_or_else(|| {
        Error::Config(format!(
            "env `{name}` has no address: start its server (rl env-server) and set `address`, or run under `rl rl`"
        ))
    })?;
    let options = ClientOptions { timeout: Duration::from_secs_f64(cfg.rollout_timeout_s), ..ClientOptions::default() };
    Ok(EnvClient::new(address, options)?)
}

fn split_size(info: &pb::InfoResponse, split: &str) -> u64 {
    info.splits.iter().find(|s| s.name == split).map_or(0, |s| s.size)
}

impl Orchestrator {
    /// Connects to every env server (waiting for health) and the model endpoints, and loads the
    /// checkpoint to resume from when `resume` is set.
    pub async fn connect(cfg: &OrchestratorConfig) -> Result<Self> {
        Self::open(cfg, true).await
    }

    /// Connects only to the eval envs and the model endpoints, for a standalone evaluation
    /// (`rl eval`); training envs are ignored.
    pub async fn connect_for_eval(cfg: &OrchestratorConfig) -> Result<Self> {
        if cfg.eval.as_ref().is_none_or(|e| e.env.is_empty()) {
            return Err(Error::Config(String::from(
                "nothing to evaluate: add [[orchestrator.eval.env]] entries (with `address`)",
            )));
        }
        Self::open(cfg, false).await
    }

    /// Evaluates every eval env once with the policy as the server holds it now.
    pub async fn evaluate_now(&self) -> Result<Map<String, Value>> {
        self.evaluate(0).await
    }

    async fn open(cfg: &OrchestratorConfig, train: bool) -> Result<Self> {
        let wait = Duration::from_secs_f64(cfg.wait_for_ready_s);
        let mut envs = Vec::new();
        for (i, e) in cfg.train.env.iter().enumerate().filter(|_| train) {
            envs.push(Self::connect_env(cfg, e, i as u32, wait).await?);
        }
        if train && envs.is_empty() {
            return Err(Error::Config(String::from("no training envs: add [[orchestrator.train.env]]")));
        }
        let mut eval_envs = Vec::new();
        if let Some(eval) = &cfg.eval {
            for e in &eval.env {
                let client = client(e.address.as_ref(), e.display_name(), cfg)?;
                client.wait_for_health(wait).await?;
                let size = split_size(&client.info().await?, &e.split);
                if size == 0 {
                    return Err(Error::Config(format!("eval env `{}` has no `{}` split", e.display_name(), e.split)));
                }
                let wanted = e.num_examples.or(eval.num_examples).map_or(size, u64::from);
                eval_envs.push(EvalEnv {
                    name: e.display_name().to_owned(),
                    client,
                    split: e.split.clone(),
                    examples: wanted.min(size),
                    k: e.k.unwrap_or(eval.k),
                    sampling: cfg.train.sampling.merged(&eval.sampling).merged(&e.sampling),
                });
            }
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs_f64(cfg.model.timeout_s))
            .build()
            .map_err(|e| Error::Config(e.to_string()))?;
        let mut endpoints = BTreeMap::new();
        endpoints.insert(
            POLICY_KEY.to_owned(),
            Endpoint {
                base_url: cfg.model.base_url.clone(),
                model: rl_configs::ModelConfig { path: cfg.model.path.clone(), name: cfg.model.name.clone() }
                    .served_name(),
                tokens: true,
                timeout: Duration::from_secs_f64(cfg.model.timeout_s),
            },
        );
        for (key, m) in &cfg.models {
            endpoints.insert(
                key.clone(),
                Endpoint {
                    base_url: m.base_url.clone(),
                    model: m.name.clone(),
                    tokens: m.tokens,
                    timeout: Duration::from_secs_f64(m.timeout_s),
                },
            );
        }
        for key in [POLICY_KEY, cfg.actor.as_str()] {
            wait_healthy(&http, &endpoints[key], wait).await?;
        }
        let mut orch = Orchestrator {
            cfg: cfg.clone(),
            envs,
            eval_envs,
            http,
            endpoints,
            version: 0,
            rng: cfg.seed ^ 0x6a09_e667_f3bc_c909,
            resumed: None,
            rae: BTreeMap::new(),
        };
        if let Some(r) = &cfg.resume {
            let state = checkpoint::load(&cfg.output_dir, r.step)?;
            orch.rng = state.sampler;
            orch.resumed = Some(state.step);
            for env in orch.envs.iter().filter(|e| e.rae().is_some()) {
                let key = format!("{}/rae", env.name);
                let saved = state.algorithms.get(&key).ok_or_else(|| Error::Checkpoint {
                    path: checkpoint::state_path(&cfg.output_dir, state.step).display().to_string(),
                    message: format!("env `{}` runs rae but the checkpoint has no `{key}` state to resume", env.name),
                })?;
                let baselines: BTreeMap<String, f64> =
                    serde_json::from_value(saved.clone()).map_err(|e| Error::Checkpoint {
                        path: checkpoint::state_path(&cfg.output_dir, state.step).display().to_string(),
                        message: format!("`{key}` is not a map of baselines: {e}"),
                    })?;
                orch.rae.insert(env.name.clone(), baselines);
            }
            tracing::info!(step = state.step, "resuming from the orchestrator checkpoint");
        }
        Ok(orch)
    }

    async fn connect_env(cfg: &OrchestratorConfig, e: &TrainEnvConfig, index: u32, wait: Duration) -> Result<Env> {
        let client = client(e.address.as_ref(), e.display_name(), cfg)?;
        client.wait_for_health(wait).await?;
        let info = client.info().await?;
        let train_size = split_size(&info, "train");
        if train_size == 0 {
            return Err(Error::Config(format!("env `{}` has no `train` split", e.display_name())));
        }
        let algorithms = cfg.env_algorithms(e).iter().map(Algorithm::from_config).collect::<Result<Vec<_>>>()?;
        let multi_agent = !info.member_ids.is_empty();
        for a in &algorithms {
            let single_agent_only = matches!(
                a,
                Algorithm::Grpo | Algorithm::MaxRl | Algorithm::Rl | Algorithm::Echo { .. } | Algorithm::Sft
            );
            if multi_agent && single_agent_only {
                return Err(Error::Config(format!(
                    "env `{}` is multi-agent (members {}): `{}` compares rollouts of one agent and is rejected there; use `rae`",
                    e.display_name(),
                    info.member_ids.join(", "),
                    a.id()
                )));
            }
            if !multi_agent && matches!(a, Algorithm::Rae { .. }) {
                return Err(Error::Config(format!(
                    "`rae` keeps a baseline per member and needs a multi-agent env; `{}` has no members",
                    e.display_name()
                )));
            }
            if let Algorithm::EnvOwned { id, .. } = a
                && !info.algorithms.iter().any(|x| x == id)
            {
                return Err(Error::Config(format!(
                    "algorithm `{id}` is neither built in nor offered by env `{}` (it offers: {})",
                    e.display_name(),
                    if info.algorithms.is_empty() { String::from("none") } else { info.algorithms.join(", ") }
                )));
            }
        }
        Ok(Env {
            index,
            name: e.display_name().to_owned(),
            client,
            train_size,
            group_size: cfg.env_group_size(e),
            sampling: cfg.env_sampling(e),
            algorithms,
            ratio: e.ratio,
            members: info.member_ids.clone(),
            judge: info.metadata.get("judge_member").cloned(),
        })
    }

    /// The policy version currently loaded in the inference server.
    pub fn policy_version(&self) -> u64 {
        self.version
    }

    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Picks an env by ratio.
    fn pick_env(&mut self) -> usize {
        let total: f64 = self.envs.iter().map(|e| e.ratio).sum();
        let mut u = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64 * total;
        for (i, e) in self.envs.iter().enumerate() {
            u -= e.ratio;
            if u <= 0.0 {
                return i;
            }
        }
        self.envs.len() - 1
    }

    /// Loads every broadcast newer than the current version (in order) into the inference server.
    async fn load_new_weights(&mut self) -> Result<()> {
        loop {
            let dir = self.cfg.output_dir.join("broadcasts").join(format!("step_{}", self.version + 1));
            if !dir.join("STABLE").exists() {
                return Ok(());
            }
            let url = format!("{}/update_weights", root_url(&self.cfg.model.base_url));
            let dir = std::path::absolute(&dir).unwrap_or(dir);
            let resp = self.http.post(&url).json(&json!({"weight_dir": dir})).send().await;
            match resp {
                Ok(r) if r.status().is_success() => {
                    self.version += 1;
                    tracing::info!(version = self.version, "policy weights updated");
                }
                Ok(r) => {
                    let status = r.status();
                    let body = r.text().await.unwrap_or_default();
                    return Err(Error::Policy { url, message: format!("update_weights answered {status}: {body}") });
                }
                Err(e) => return Err(Error::Policy { url, message: e.to_string() }),
            }
        }
    }

    /// Loads broadcasts until the policy version is at least `version`, waiting at most `limit`.
    async fn wait_for_version(&mut self, version: u64, limit: Option<Duration>) -> Result<()> {
        let start = Instant::now();
        loop {
            self.load_new_weights().await?;
            if self.version >= version {
                return Ok(());
            }
            if limit.is_some_and(|l| start.elapsed() > l) {
                return Err(Error::Checkpoint {
                    path: self.cfg.output_dir.join(format!("broadcasts/step_{version}")).display().to_string(),
                    message: format!("the trainer did not broadcast these weights within {limit:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The runtime env servers sample `actor` with, for one env's sampling.
    fn runtime(&self, key: &str, s: &SamplingConfig) -> ModelRuntime {
        let ep = &self.endpoints[key];
        let policy = key == POLICY_KEY;
        ModelRuntime {
            base_url: ep.base_url.clone(),
            model: ep.model.clone(),
            sampling: Sampling {
                temperature: Some(s.temperature),
                top_p: Some(s.top_p),
                top_k: s.top_k,
                max_completion_tokens: s.max_completion_tokens,
                stop: s.stop.clone(),
                seed: s.seed.map(|x| x ^ self.version),
                extra: s.extra.clone().into_iter().collect(),
            },
            tokens: ep.tokens,
            cache_salt: policy.then(|| self.version.to_string()),
            timeout: ep.timeout,
        }
    }

    /// Every configured model as a runtime, for env-side judges and env-owned algorithms.
    fn model_runtimes(&self, s: &SamplingConfig) -> BTreeMap<String, pb::ModelRuntime> {
        self.endpoints.keys().map(|k| (k.clone(), self.runtime(k, s).to_wire())).collect()
    }

    fn context(&self, step: u64) -> pb::TrainingContext {
        let ckpt_step = self.resumed.unwrap_or(0);
        pb::TrainingContext { step, ckpt_step, policy_version: self.version, extra: Default::default() }
    }

    /// Runs one group, rerunning it when its rollouts failed with retryable errors. Returns the
    /// traces and the retryable errors seen on the way (by kind).
    async fn group(
        &self,
        client: &EnvClient,
        name: &str,
        example: (&str, u64),
        group_size: u32,
        sampling: &SamplingConfig,
        step: u64,
    ) -> Result<(Vec<pb::Trace>, Vec<String>)> {
        let mut seen = Vec::new();
        for attempt in 0..GROUP_ATTEMPTS {
            let req = pb::RunGroupRequest {
                example: Some(pb::ExampleRef {
                    source: Some(pb::example_ref::Source::Dataset(pb::DatasetIndex {
                        split: example.0.to_owned(),
                        index: example.1,
                    })),
                }),
                group_size,
                actor: Some(self.runtime(&self.cfg.actor, sampling).to_wire()),
                training_context: Some(self.context(step)),
                models: self.model_runtimes(sampling).into_iter().collect(),
            };
            let resp = client.run_group(req).await?;
            let mut traces = Vec::new();
            let mut errors: Vec<pb::TraceError> = Vec::new();
            for ep in resp.episodes {
                errors.extend(ep.errors);
                for t in ep.traces {
                    errors.extend(t.errors.iter().cloned());
                    traces.push(t);
                }
            }
            match errors.first() {
                None => return Ok((traces, seen)),
                Some(e) if !e.retryable => {
                    return Err(Error::Rollout { env: name.to_owned(), message: e.message.clone() });
                }
                Some(_) => {
                    for e in &errors {
                        seen.push(kind_name(e.kind));
                    }
                    let message = &errors[0].message;
                    tracing::warn!(env = %name, attempt, error = %message, "retryable rollout failure; rerunning the group");
                }
            }
        }
        Err(Error::Rollout {
            env: name.to_owned(),
            message: format!(
                "still failing after {GROUP_ATTEMPTS} attempts: {}",
                seen.last().cloned().unwrap_or_default()
            ),
        })
    }

    /// Evaluates every eval env with the current policy.
    async fn evaluate(&self, step: u64) -> Result<Map<String, Value>> {
        let mut out = Map::new();
        for e in &self.eval_envs {
            let t0 = Instant::now();
            let groups = futures::future::join_all(
                (0..e.examples).map(|i| self.group(&e.client, &e.name, (&e.split, i), e.k, &e.sampling, step)),
            )
            .await;
            let mut per_example = Vec::new();
            let mut errors = 0;
            for g in groups {
                let (traces, seen) = g?;
                errors += seen.len();
                per_example.push(traces.iter().map(|t| t.reward).collect::<Vec<_>>());
            }
            out.extend(eval_metrics(&e.name, &per_example, errors));
            out.insert(format!("eval/{}/policy_version", e.name), json!(self.version));
            out.insert(format!("eval/{}/time_s", e.name), json!(t0.elapsed().as_secs_f64()));
        }
        Ok(out)
    }

    /// Channels of every algorithm of `env` on one group, aggregated per branch (`rae`: the
    /// channels already computed with the orchestrator's baselines).
    async fn targets(
        &self,
        env: &Env,
        traces: &[pb::Trace],
        mut rae: Option<Vec<Vec<crate::algorithms::Channel>>>,
    ) -> Result<Vec<Vec<crate::algorithms::BranchTargets>>> {
        let runtimes = self.model_runtimes(&env.sampling);
        let ctx =
            ScoringContext { http: &self.http, endpoints: &self.endpoints, env: &env.client, runtimes: &runtimes };
        let mut outputs = Vec::new();
        for a in &env.algorithms {
            outputs.push(match (a, a.local_channels(traces)) {
                (_, Some(ch)) => ch,
                (Algorithm::Rae { .. }, None) => rae.take().unwrap_or_default(),
                (_, None) => remote_channels(a, traces, ctx).await?,
            });
        }
        let ids: Vec<&str> = env.algorithms.iter().map(Algorithm::id).collect();
        aggregate(&ids, traces, &outputs)
    }

    /// Runs steps until `max_steps`, calling `on_step` after each batch is written. A fresh run
    /// starts at step 1; a resumed one after its checkpoint step, with that step's weights loaded.
    pub async fn run(&mut self, mut on_step: impl FnMut(&StepSummary)) -> Result<()> {
        let run_dir = self.cfg.output_dir.clone();
        let mut step = match self.resumed {
            Some(s) => {
                checkpoint::clean_after(&run_dir, s)?;
                // The trainer broadcasts its checkpoint's weights first; the policy must serve them.
                self.version = s - 1;
                self.wait_for_version(s, Some(Duration::from_secs_f64(self.cfg.wait_for_ready_s))).await?;
                s + 1
            }
            None => {
                checkpoint::clean_after(&run_dir, 0)?;
                if self.cfg.eval.as_ref().is_some_and(|e| e.eval_on_start) && !self.eval_envs.is_empty() {
                    let mut row = self.evaluate(0).await?;
                    row.insert(String::from("step"), json!(0));
                    append_jsonl(&run_dir.join("metrics.jsonl"), &Value::Object(row))?;
                }
                1
            }
        };
        while self.cfg.max_steps.is_none_or(|max| step <= max) {
            let metrics = self.step(step).await?;
            append_jsonl(&run_dir.join("metrics.jsonl"), &metrics)?;
            on_step(&StepSummary { step, metrics });
            step += 1;
        }
        Ok(())
    }

    async fn step(&mut self, step: u64) -> Result<Value> {
        let run_dir = self.cfg.output_dir.clone();
        let t0 = Instant::now();
        self.wait_for_version(step.saturating_sub(1 + u64::from(self.cfg.max_async_level)), None).await?;
        let wait_s = t0.elapsed().as_secs_f64();
        let mut row = Map::new();
        if let Some(eval) = &self.cfg.eval
            && step.is_multiple_of(eval.interval)
            && !self.eval_envs.is_empty()
        {
            row.extend(self.evaluate(step).await?);
        }
        let t1 = Instant::now();
        let mut plan = Vec::new();
        let mut planned = 0u32;
        while planned < self.cfg.batch_size {
            let e = self.pick_env();
            let index = self.next_random() % self.envs[e].train_size;
            planned += self.envs[e].group_size;
            plan.push((e, index));
        }
        let mut done: Vec<(usize, Vec<pb::Trace>)> = Vec::new();
        let mut error_kinds: BTreeMap<String, usize> = BTreeMap::new();
        let mut stale = 0usize;
        let max_off = u64::from(self.cfg.max_off_policy_steps);
        while !plan.is_empty() {
            let version = self.version;
            let groups = futures::future::join_all(plan.iter().map(|&(e, index)| {
                let env = &self.envs[e];
                self.group(&env.client, &env.name, ("train", index), env.group_size, &env.sampling, step)
            }))
            .await;
            let mut redo = Vec::new();
            for (&(e, index), g) in plan.iter().zip(groups) {
                let (traces, seen) = g?;
                for k in seen {
                    *error_kinds.entry(k).or_default() += 1;
                }
                // Too old for this step: dropped, counted, and sampled again with newer weights.
                if step - 1 - version.min(step - 1) > max_off {
                    stale += 1;
                    redo.push((e, index));
                } else {
                    done.push((e, traces));
                }
            }
            if !redo.is_empty() {
                self.wait_for_version(step.saturating_sub(1 + max_off), None).await?;
            }
            plan = redo;
        }
        let gen_s = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let mut all_samples: Vec<TrainingSample> = Vec::new();
        let (mut rewards, mut advantages, mut completion_lens) = (Vec::new(), Vec::new(), Vec::new());
        let (mut truncated, mut prompt_tokens) = (0usize, 0usize);
        let mut member_rewards: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for (e, traces) in &done {
            let env = &self.envs[*e];
            let rae = env.rae().map(|(momentum, judge)| {
                crate::algorithms::rae_channels(self.rae.entry(env.name.clone()).or_default(), traces, momentum, judge)
            });
            let targets = self.targets(env, traces, rae).await?;
            for (t, tg) in traces.iter().zip(&targets) {
                rewards.push(t.reward);
                if !env.members.is_empty() {
                    member_rewards.entry(format!("{}/{}", env.name, t.member_id)).or_default().push(t.reward);
                }
                truncated += usize::from(t.is_truncated);
                let sampled: usize = t.nodes.iter().filter(|n| n.sampled).flat_map(|n| &n.mask).filter(|m| **m).count();
                let total: usize = t.nodes.iter().map(|n| n.token_ids.len()).sum();
                completion_lens.push(sampled as f64);
                prompt_tokens += total - sampled;
                for b in tg {
                    advantages
                        .extend(b.advantages.iter().zip(&b.rl_mask).filter(|(_, m)| **m).map(|(a, _)| f64::from(*a)));
                }
                all_samples.extend(samples(
                    t,
                    tg,
                    env.sampling.temperature as f32,
                    env.index,
                    self.cfg.filter_zero_advantages,
                ));
            }
        }
        let algo_s = t2.elapsed().as_secs_f64();
        let seq_len = self.cfg.seq_len as usize;
        // Samples longer than seq_len are cut; say so, since their tail is not trained.
        let overlong = all_samples.iter().filter(|s| s.ids.len() > seq_len).count();
        if overlong > 0 {
            tracing::warn!(step, overlong, seq_len, "samples longer than seq_len were truncated; raise seq_len");
        }
        let rows = pack(&all_samples, seq_len);
        let batch = TrainBatch {
            step,
            micro_batches: rows,
            env_names: self.envs.iter().map(|e| e.name.clone()).collect(),
            min_policy_version: self.version,
        };
        write_batch(&run_dir, &batch)?;
        write_traces(&run_dir, step, &done, &self.envs)?;
        if let Some(ckpt) = &self.cfg.ckpt
            && step.is_multiple_of(ckpt.interval)
        {
            let algorithms = self
                .envs
                .iter()
                .filter(|e| e.rae().is_some())
                .map(|e| (format!("{}/rae", e.name), json!(self.rae.get(&e.name).cloned().unwrap_or_default())))
                .collect();
            let state = OrchestratorState::new(step, self.rng, algorithms);
            checkpoint::save(&run_dir, &state, ckpt.keep_last)?;
        }
        let rollouts = rewards.len();
        let r = stats(&rewards);
        let a = stats(&advantages);
        let c = stats(&completion_lens);
        row.extend(
            json!({
                "step": step,
                "reward/mean": r.mean, "reward/std": r.std, "reward/min": r.min, "reward/max": r.max,
                "reward/p10": r.p10, "reward/p90": r.p90,
                "advantage/mean": a.mean, "advantage/std": a.std, "advantage/abs_mean": stats(&advantages.iter().map(|x| x.abs()).collect::<Vec<_>>()).mean,
                "rollouts": rollouts,
                "samples": all_samples.len(),
                "samples/truncated": overlong,
                "rows": batch.micro_batches.len(),
                "completion_tokens": completion_lens.iter().sum::<f64>(),
                "completion_len/mean": c.mean, "completion_len/max": c.max,
                "prompt_tokens": prompt_tokens,
                "truncated": truncated as f64 / rollouts.max(1) as f64,
                "policy_version": self.version,
                "off_policy_steps": step - 1 - self.version.min(step - 1),
                "stale_dropped": stale,
                "errors/retried": error_kinds.values().sum::<usize>(),
                "time/wait_for_policy_s": wait_s,
                "time/generate_s": gen_s,
                "time/algorithms_s": algo_s,
                "time/step_s": t0.elapsed().as_secs_f64(),
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        );
        for (k, n) in error_kinds {
            row.insert(format!("errors/{k}"), json!(n));
        }
        for (k, v) in member_rewards {
            row.insert(format!("reward/member/{k}"), json!(stats(&v).mean));
        }
        Ok(Value::Object(row))
    }
}

fn kind_name(kind: i32) -> String {
    pb::ErrorKind::try_from(kind)
        .map(|k| k.as_str_name().trim_start_matches("ERROR_KIND_").to_lowercase())
        .unwrap_or_else(|_| String::from("unknown"))
}

async fn wait_healthy(http: &reqwest::Client, ep: &Endpoint, wait: Duration) -> Result<()> {
    let health = format!("{}/health", ep.root());
    let start = Instant::now();
    loop {
        match http.get(&health).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            other => {
                if start.elapsed() > wait {
                    let why = other.map_or_else(|e| e.to_string(), |r| r.status().to_string());
                    return Err(Error::Policy { url: health, message: format!("not healthy after {wait:?}: {why}") });
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

struct Stats {
    mean: f64,
    std: f64,
    min: f64,
    max: f64,
    p10: f64,
    p90: f64,
}

fn stats(v: &[f64]) -> Stats {
    if v.is_empty() {
        return Stats { mean: 0.0, std: 0.0, min: 0.0, max: 0.0, p10: 0.0, p90: 0.0 };
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    let q = |p: f64| sorted[((p * (sorted.len() - 1) as f64).round() as usize).min(sorted.len() - 1)];
    Stats { mean, std, min: sorted[0], max: sorted[sorted.len() - 1], p10: q(0.1), p90: q(0.9) }
}

/// Writes `rollouts/step_N/traces.jsonl` atomically: one line per trace (env, task, member,
/// reward, reward components, the messages as text, errors), for reading what the policy did.
fn write_traces(run_dir: &Path, step: u64, done: &[(usize, Vec<pb::Trace>)], envs: &[Env]) -> Result<()> {
    let io = |p: &Path, e: std::io::Error| Error::Io { path: p.display().to_string(), message: e.to_string() };
    let mut out = String::new();
    for (e, traces) in done {
        for t in traces {
            let messages: Vec<Value> = t
                .nodes
                .iter()
                .map(|n| {
                    let mut m = json!({"role": n.role, "content": n.content});
                    if !n.tool_calls.is_empty() {
                        m["tool_calls"] =
                            n.tool_calls.iter().map(|c| json!({"name": c.name, "arguments": c.arguments})).collect();
                    }
                    m
                })
                .collect();
            let rewards: Map<String, Value> = t.rewards.iter().map(|(k, r)| (k.clone(), json!(r.score))).collect();
            let line = json!({
                "env": envs[*e].name, "task": t.task_key, "member": t.member_id, "reward": t.reward,
                "rewards": rewards, "stop": t.stop_condition, "truncated": t.is_truncated,
                "errors": t.errors.iter().map(|x| x.message.clone()).collect::<Vec<_>>(), "messages": messages,
            });
            out.push_str(&line.to_string());
            out.push('\n');
        }
    }
    let dir = run_dir.join("rollouts").join(format!("step_{step}"));
    let path = dir.join("traces.jsonl");
    let tmp = dir.join(format!("traces.jsonl.tmp.{}", std::process::id()));
    std::fs::write(&tmp, out).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))
}

/// Writes `rollouts/step_N/rank_0.bin` atomically (temp file, then rename).
pub fn write_batch(run_dir: &Path, batch: &TrainBatch) -> Result<PathBuf> {
    let io = |p: &Path, e: std::io::Error| Error::Io { path: p.display().to_string(), message: e.to_string() };
    let dir = run_dir.join("rollouts").join(format!("step_{}", batch.step));
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    let path = dir.join("rank_0.bin");
    let tmp = dir.join(format!("rank_0.bin.tmp.{}", std::process::id()));
    std::fs::write(&tmp, batch.encode_to_vec()).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
    Ok(path)
}

fn append_jsonl(path: &Path, value: &Value) -> Result<()> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::Io { path: path.display().to_string(), message: e.to_string() };
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
    f.write_all(format!("{value}\n").as_bytes()).map_err(io)
}
