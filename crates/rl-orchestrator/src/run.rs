//! The dispatch loop. For each step n: wait until the loaded policy version v is at least
//! n - 1 - max_async_level (loading new broadcasts into the inference server as they appear), run
//! the step's groups on the env servers with `training_context {step: n, policy_version: v}` and
//! `cache_salt = v`, compute advantages, pack, and write `rollouts/step_n/rank_0.bin`. Generation of
//! step n+1 therefore overlaps training of step n whenever the async level allows it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;
use rl_configs::{OrchestratorConfig, SamplingConfig, TrainEnvConfig};
use rl_proto::train::v1::TrainBatch;
use rl_serve::{ClientOptions, EnvClient, ModelRuntime, Sampling, pb};

use crate::algorithms::{Algorithm, aggregate};
use crate::error::{Error, Result};
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
}

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSummary {
    /// The step.
    pub step: u64,
    /// Its metrics line.
    pub metrics: serde_json::Value,
}

/// The orchestrator of one run.
pub struct Orchestrator {
    cfg: OrchestratorConfig,
    envs: Vec<Env>,
    http: reqwest::Client,
    version: u64,
    rng: u64,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator").field("envs", &self.envs.iter().map(|e| &e.name).collect::<Vec<_>>()).finish()
    }
}

fn root_url(base_url: &str) -> String {
    base_url.trim_end_matches('/').trim_end_matches("/v1").to_owned()
}

impl Orchestrator {
    /// Connects to every env server (waiting for health) and the policy endpoint.
    pub async fn connect(cfg: &OrchestratorConfig) -> Result<Self> {
        if cfg.actor != rl_configs::POLICY_KEY {
            return Err(Error::Config(String::from(
                "sampling rollouts from a non-policy actor is not implemented yet",
            )));
        }
        let wait = Duration::from_secs_f64(cfg.wait_for_ready_s);
        let mut envs = Vec::new();
        for (i, e) in cfg.train.env.iter().enumerate() {
            envs.push(Self::connect_env(cfg, e, i as u32, wait).await?);
        }
        if envs.is_empty() {
            return Err(Error::Config(String::from("no training envs: add [[orchestrator.train.env]]")));
        }
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs_f64(cfg.model.timeout_s))
            .build()
            .map_err(|e| Error::Config(e.to_string()))?;
        let health = format!("{}/health", root_url(&cfg.model.base_url));
        let start = Instant::now();
        loop {
            match http.get(&health).send().await {
                Ok(r) if r.status().is_success() => break,
                other => {
                    if start.elapsed() > wait {
                        let why = other.map_or_else(|e| e.to_string(), |r| r.status().to_string());
                        return Err(Error::Policy {
                            url: health,
                            message: format!("not healthy after {wait:?}: {why}"),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        Ok(Orchestrator { cfg: cfg.clone(), envs, http, version: 0, rng: cfg.seed ^ 0x6a09_e667_f3bc_c909 })
    }

    async fn connect_env(cfg: &OrchestratorConfig, e: &TrainEnvConfig, index: u32, wait: Duration) -> Result<Env> {
        let address = e.address.clone().ok_or_else(|| {
            Error::Config(format!(
                "env `{}` has no address: start its server (rl env-server) and set `address`, or run under `rl rl`",
                e.display_name()
            ))
        })?;
        let options =
            ClientOptions { timeout: Duration::from_secs_f64(cfg.rollout_timeout_s), ..ClientOptions::default() };
        let client = EnvClient::new(&address, options)?;
        client.wait_for_health(wait).await?;
        let info = client.info().await?;
        let train_size = info.splits.iter().find(|s| s.name == "train").map_or(0, |s| s.size);
        if train_size == 0 {
            return Err(Error::Config(format!("env `{}` at {address} has no `train` split", e.display_name())));
        }
        let algorithms = cfg.env_algorithms(e).iter().map(Algorithm::from_config).collect::<Result<Vec<_>>>()?;
        Ok(Env {
            index,
            name: e.display_name().to_owned(),
            client,
            train_size,
            group_size: cfg.env_group_size(e),
            sampling: cfg.env_sampling(e),
            algorithms,
            ratio: e.ratio,
        })
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
            let resp = self.http.post(&url).json(&serde_json::json!({"weight_dir": dir})).send().await;
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

    fn actor(&self, env: &Env) -> ModelRuntime {
        let s = &env.sampling;
        ModelRuntime {
            base_url: self.cfg.model.base_url.clone(),
            model: rl_configs::ModelConfig { path: self.cfg.model.path.clone(), name: self.cfg.model.name.clone() }
                .served_name(),
            sampling: Sampling {
                temperature: Some(s.temperature),
                top_p: Some(s.top_p),
                top_k: s.top_k,
                max_completion_tokens: s.max_completion_tokens,
                stop: s.stop.clone(),
                seed: s.seed.map(|x| x ^ self.version),
                extra: s.extra.clone().into_iter().collect(),
            },
            tokens: true,
            cache_salt: Some(self.version.to_string()),
            timeout: Duration::from_secs_f64(self.cfg.model.timeout_s),
        }
    }

    /// Runs one group, retrying it when its rollouts failed with retryable errors.
    async fn group(&self, env: &Env, index: u64, step: u64) -> Result<Vec<pb::Trace>> {
        let context =
            pb::TrainingContext { step, ckpt_step: 0, policy_version: self.version, extra: Default::default() };
        let mut last = String::new();
        for attempt in 0..GROUP_ATTEMPTS {
            let req = pb::RunGroupRequest {
                example: Some(pb::ExampleRef {
                    source: Some(pb::example_ref::Source::Dataset(pb::DatasetIndex {
                        split: String::from("train"),
                        index,
                    })),
                }),
                group_size: env.group_size,
                actor: Some(self.actor(env).to_wire()),
                training_context: Some(context.clone()),
                models: Default::default(),
            };
            let resp = env.client.run_group(req).await?;
            let traces: Vec<pb::Trace> = resp.episodes.into_iter().flat_map(|e| e.traces).collect();
            let errors: Vec<&pb::TraceError> = traces.iter().flat_map(|t| &t.errors).collect();
            match errors.first() {
                None => return Ok(traces),
                Some(e) if !e.retryable => {
                    return Err(Error::Rollout { env: env.name.clone(), message: e.message.clone() });
                }
                Some(e) => {
                    last = e.message.clone();
                    tracing::warn!(env = %env.name, attempt, error = %e.message, "retryable rollout failure; rerunning the group");
                }
            }
        }
        Err(Error::Rollout {
            env: env.name.clone(),
            message: format!("still failing after {GROUP_ATTEMPTS} attempts: {last}"),
        })
    }

    /// Runs steps `start..=max_steps`, calling `on_step` after each batch is written.
    pub async fn run(&mut self, start: u64, mut on_step: impl FnMut(&StepSummary)) -> Result<()> {
        let run_dir = self.cfg.output_dir.clone();
        if start == 1 {
            clean_stale(&run_dir)?;
        }
        let mut step = start;
        while self.cfg.max_steps.is_none_or(|max| step <= max) {
            let t0 = Instant::now();
            let needed = step.saturating_sub(1 + u64::from(self.cfg.max_async_level));
            loop {
                self.load_new_weights().await?;
                if self.version >= needed {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let wait_s = t0.elapsed().as_secs_f64();
            let t1 = Instant::now();
            let mut plan = Vec::new();
            let mut planned = 0u32;
            while planned < self.cfg.batch_size {
                let e = self.pick_env();
                let index = self.next_random() % self.envs[e].train_size;
                planned += self.envs[e].group_size;
                plan.push((e, index));
            }
            let groups =
                futures::future::join_all(plan.iter().map(|&(e, index)| self.group(&self.envs[e], index, step))).await;
            let gen_s = t1.elapsed().as_secs_f64();
            let mut all_samples: Vec<TrainingSample> = Vec::new();
            let mut rewards = Vec::new();
            let mut advantages = Vec::new();
            let (mut truncated, mut completion_tokens, mut rollouts) = (0usize, 0usize, 0usize);
            for (&(e, _), traces) in plan.iter().zip(groups) {
                let traces = traces?;
                let env = &self.envs[e];
                let channels: Vec<_> = env.algorithms.iter().map(|a| a.channels(&traces)).collect();
                let ids: Vec<&str> = env.algorithms.iter().map(Algorithm::id).collect();
                let targets = aggregate(&ids, &traces, &channels)?;
                for a in env.algorithms.first().map(|a| a.advantages(&traces)).unwrap_or_default().into_iter().flatten()
                {
                    advantages.push(a);
                }
                for (t, tg) in traces.iter().zip(&targets) {
                    rewards.push(t.reward);
                    rollouts += 1;
                    truncated += usize::from(t.is_truncated);
                    completion_tokens += t.nodes.iter().filter(|n| n.sampled).map(|n| n.token_ids.len()).sum::<usize>();
                    all_samples.extend(samples(t, tg, env.sampling.temperature as f32, env.index));
                }
            }
            let rows = pack(&all_samples, self.cfg.seq_len as usize);
            let batch = TrainBatch {
                step,
                micro_batches: rows,
                env_names: self.envs.iter().map(|e| e.name.clone()).collect(),
                min_policy_version: self.version,
            };
            write_batch(&run_dir, &batch)?;
            let stats = |v: &[f64]| {
                let n = v.len().max(1) as f64;
                let mean = v.iter().sum::<f64>() / n;
                let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
                (
                    mean,
                    std,
                    v.iter().copied().fold(f64::INFINITY, f64::min),
                    v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                )
            };
            let (rm, rs, rmin, rmax) = stats(&rewards);
            let (_, a_std, _, _) = stats(&advantages);
            let metrics = serde_json::json!({
                "step": step,
                "reward/mean": rm, "reward/std": rs, "reward/min": rmin, "reward/max": rmax,
                "advantage/std": a_std,
                "rollouts": rollouts,
                "samples": all_samples.len(),
                "rows": batch.micro_batches.len(),
                "completion_tokens": completion_tokens,
                "truncated": truncated as f64 / rollouts.max(1) as f64,
                "policy_version": self.version,
                "off_policy_steps": step - 1 - self.version.min(step - 1),
                "stale_dropped": 0,
                "time/wait_for_policy_s": wait_s,
                "time/generate_s": gen_s,
                "time/step_s": t0.elapsed().as_secs_f64(),
            });
            append_jsonl(&run_dir.join("metrics.jsonl"), &metrics)?;
            on_step(&StepSummary { step, metrics });
            step += 1;
        }
        Ok(())
    }
}

/// On a fresh run, removes rollouts and broadcasts (except the starting weights) of an earlier run.
fn clean_stale(run_dir: &Path) -> Result<()> {
    let io = |p: &Path, e: std::io::Error| Error::Io { path: p.display().to_string(), message: e.to_string() };
    let rollouts = run_dir.join("rollouts");
    if rollouts.exists() {
        std::fs::remove_dir_all(&rollouts).map_err(|e| io(&rollouts, e))?;
    }
    if let Ok(entries) = std::fs::read_dir(run_dir.join("broadcasts")) {
        for entry in entries.flatten() {
            let stale = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("step_"))
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| n > 0);
            if stale {
                std::fs::remove_dir_all(entry.path()).map_err(|e| io(&entry.path(), e))?;
            }
        }
    }
    Ok(())
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

fn append_jsonl(path: &Path, value: &serde_json::Value) -> Result<()> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::Io { path: path.display().to_string(), message: e.to_string() };
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
    f.write_all(format!("{value}\n").as_bytes()).map_err(io)
}
