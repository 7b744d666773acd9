//! The orchestrator of one run. For each step n: wait until the loaded policy version is at least
//! n - 1 - max_async_level (loading new broadcasts into the inference server as they appear), run
//! the step's groups on the env servers (stale ones again), turn them into training samples with
//! each env's algorithms, pack, and write the batch. Generation of step n+1 therefore overlaps
//! training of step n whenever the async level allows it. Checkpoints, resume and online
//! evaluation hang off the loop.

mod rounds;

use std::time::{Duration, Instant};

use rl_configs::{OrchestratorConfig, POLICY_KEY, Temperature};
use rl_proto::train::v1::TrainBatch;
use rl_run::RunDir;
use rl_run::{MetricsRow, append_jsonl};
use serde_json::{Map, Value, json};

use crate::algorithms::{Channel, Scoring, aggregate};
use crate::checkpoint::{self, OrchestratorState};
use crate::dispatch::{Collected, Dispatch, GroupJob, runtimes};
use crate::envs::{EvalEnv, TrainEnv, connect_eval, connect_train};
use crate::error::{Error, Result};
use crate::eval::evaluate;
use crate::metrics::StepTally;
use crate::models::Models;
use crate::policy::PolicyVersion;
use crate::rollout::{Group, Rollout};
use crate::sampler::{EnvShape, Sampler};
use crate::seq_len::check_trainable_within;
use crate::sink::{TrainingSample, pack, samples};
use crate::task_rate::TaskRate;
use crate::writer::{write_batch, write_eval_traces, write_traces};

/// What one step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSummary {
    /// The step.
    pub step: u64,
    /// Its metrics row.
    pub metrics: MetricsRow,
}

/// The orchestrator of one run.
#[derive(Debug)]
pub struct Orchestrator {
    cfg: OrchestratorConfig,
    run: RunDir,
    envs: Vec<TrainEnv>,
    eval_envs: Vec<EvalEnv>,
    models: Models,
    policy: PolicyVersion,
    sampler: Sampler,
    /// The checkpoint step this run resumed from.
    resumed: Option<u64>,
    /// The latest checkpoint step (`training_context.ckpt_step`).
    ckpt_step: u64,
    /// `tasks_per_minute`: the rate group runs start at, training and eval alike.
    rate: Option<TaskRate>,
}

impl Orchestrator {
    /// Connects to every env server (waiting for health) and the model endpoints, and loads the
    /// checkpoint to resume from when `resume` is set.
    pub async fn connect(cfg: &OrchestratorConfig) -> Result<Self> {
        let mut orch = Self::open(cfg, true).await?;
        if let Some(r) = &cfg.resume {
            orch.restore(&checkpoint::load(&orch.run, r.step)?)?;
        }
        Ok(orch)
    }

    /// Connects only to the eval envs and the model endpoints, for a standalone evaluation
    /// (`rl eval`); training envs are ignored.
    pub async fn connect_for_eval(cfg: &OrchestratorConfig) -> Result<Self> {
        if cfg.eval.as_ref().is_none_or(|e| e.env.is_empty()) {
            return Err(Error::Config(String::from("nothing to evaluate: add [[eval.env]] entries")));
        }
        Self::open(cfg, false).await
    }

    async fn open(cfg: &OrchestratorConfig, train: bool) -> Result<Self> {
        let mut envs = Vec::new();
        for (i, e) in cfg.train.env.iter().enumerate().filter(|_| train) {
            envs.push(connect_train(cfg, e, i as u32).await?);
        }
        if train && envs.is_empty() {
            return Err(Error::Config(String::from("no training envs: add [[orchestrator.train.env]]")));
        }
        let mut eval_envs = Vec::new();
        if let Some(eval) = &cfg.eval {
            for e in &eval.env {
                eval_envs.push(connect_eval(cfg, eval, e).await?);
            }
        }
        let mut models = Models::new(cfg)?;
        let wait = Duration::from_secs_f64(cfg.wait_for_ready_s);
        for key in [POLICY_KEY, cfg.actor.as_str()] {
            models.wait_healthy(key, wait).await?;
        }
        models.settle_policy_name(cfg.model.name.is_some() || cfg.model.path.is_some()).await?;
        let run = RunDir::new(&cfg.output_dir);
        Ok(Orchestrator {
            cfg: cfg.clone(),
            policy: PolicyVersion::new(run.clone(), cfg.model.base_url.all(), 0),
            run,
            envs,
            eval_envs,
            models,
            sampler: Sampler::new(cfg.seed),
            resumed: None,
            ckpt_step: 0,
            rate: cfg.tasks_per_minute.map(TaskRate::new),
        })
    }

    fn restore(&mut self, state: &OrchestratorState) -> Result<()> {
        self.sampler = Sampler::restore(state.sampler);
        self.resumed = Some(state.step);
        self.ckpt_step = state.step;
        for env in &mut self.envs {
            for a in env.algorithms.iter_mut().filter(|a| a.state().is_some()) {
                let key = format!("{}/{}", env.info.name, a.id());
                let saved = state.algorithms.get(&key).cloned().ok_or_else(|| Error::Checkpoint {
                    path: self.run.orchestrator_state(state.step).display().to_string(),
                    message: format!("env `{}` runs {} but the checkpoint has no `{key}` state", env.info.name, a.id()),
                })?;
                a.restore(saved)?;
            }
            if env.curriculum.state().is_some() {
                let saved = state.curricula.get(&env.info.name).ok_or_else(|| Error::Checkpoint {
                    path: self.run.orchestrator_state(state.step).display().to_string(),
                    message: format!(
                        "env `{}` has a difficulty curriculum but the checkpoint has no state for it",
                        env.info.name
                    ),
                })?;
                env.curriculum.restore(saved)?;
            }
        }
        tracing::info!(step = state.step, "resuming from the orchestrator checkpoint");
        Ok(())
    }

    /// The policy version currently loaded in the inference server.
    pub fn policy_version(&self) -> u64 {
        self.policy.get()
    }

    /// Evaluates every eval env once with the policy as the server holds it now.
    pub async fn evaluate_now(&mut self) -> Result<Map<String, Value>> {
        self.evaluate(0, true).await
    }

    /// Runs steps until `max_steps`, calling `on_step` after each batch is written. A fresh run
    /// starts at step 1; a resumed one after its checkpoint step, with that step's weights loaded.
    pub async fn run(&mut self, mut on_step: impl FnMut(&StepSummary)) -> Result<()> {
        let mut step = match self.resumed {
            Some(s) => {
                // `rl rl` already did this before starting any process; repeated for an
                // orchestrator started on its own (a trainer beside it must start after this).
                checkpoint::clean_after(&self.run, s)?;
                // The trainer broadcasts its checkpoint's weights first; the policy must serve them.
                self.policy = PolicyVersion::new(self.run.clone(), self.cfg.model.base_url.all(), s.saturating_sub(1));
                let limit = Duration::from_secs_f64(self.cfg.wait_for_ready_s);
                self.policy.wait_for(&self.models, s, limit).await?;
                s + 1
            }
            None => {
                checkpoint::clean_after(&self.run, 0)?;
                if self.cfg.eval.as_ref().is_some_and(|e| e.eval_on_start) && !self.eval_envs.is_empty() {
                    let keyed = self.evaluate(0, true).await?.into_iter().collect();
                    append_jsonl(&self.run.metrics(), &MetricsRow { step: 0, rollouts: None, keyed })?;
                }
                1
            }
        };
        while self.cfg.max_steps.is_none_or(|max| step <= max) {
            let metrics = self.step(step).await?;
            append_jsonl(&self.run.metrics(), &metrics)?;
            on_step(&StepSummary { step, metrics });
            step += 1;
        }
        Ok(())
    }

    /// The longest wait for the trainer's next weights.
    fn trainer_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.cfg.trainer_timeout_s)
    }

    /// One step, as prime-rl describes it.
    async fn step(&mut self, step: u64) -> Result<MetricsRow> {
        let started = Instant::now();
        // The async gate: at most `max_async_level` steps ahead of the trainer.
        let gate = step.saturating_sub(1 + u64::from(self.cfg.max_async_level));
        self.policy.wait_for(&self.models, gate, self.trainer_timeout()).await?;
        let wait_s = started.elapsed().as_secs_f64();
        let mut keyed = self.evaluate(step, false).await?;
        let generating = Instant::now();
        let (groups, dispatched, refill) = self.rollouts(step).await?;
        self.check_reward_errors(&groups)?;
        let generate_s = generating.elapsed().as_secs_f64();
        let scoring = Instant::now();
        let (samples, tally) = self.training_samples(step, &groups).await?;
        check_trainable_within(&samples, self.cfg.seq_len as usize)?;
        let algorithms_s = scoring.elapsed().as_secs_f64();
        let batch = self.batch(step, &samples, &groups);
        write_batch(&self.run, &batch)?;
        write_traces(&self.run, step, &groups, &batch.env_names)?;
        self.checkpoint_if_due(step)?;
        let seq_len = self.cfg.seq_len as usize;
        let (rollouts, members) = tally.finish(|m| {
            m.samples = samples.len() as u64;
            m.samples_truncated = samples.iter().filter(|s| s.ids.len() > seq_len).count() as u64;
            m.rows = batch.micro_batches.len() as u64;
            m.policy_version = self.policy.get();
            m.off_policy_steps = step - 1 - batch.min_policy_version.min(step - 1);
            m.stale_dropped = dispatched.stale as u64;
            m.errors_retried = dispatched.retried.values().sum::<usize>() as u64;
            m.wait_for_policy_s = wait_s;
            m.generate_s = generate_s;
            m.algorithms_s = algorithms_s;
            m.step_s = started.elapsed().as_secs_f64();
        });
        keyed.extend(members);
        keyed.extend(self.policy.take_metrics());
        for e in &mut self.envs {
            keyed.extend(e.take_metrics());
        }
        keyed.extend(dispatched.retried.into_iter().map(|(k, n)| (format!("errors/{k}"), json!(n))));
        keyed.extend(dispatched.dropped.into_iter().map(|(k, n)| (format!("groups_dropped/{k}"), json!(n))));
        if let Some(tokens) = refill.tokens {
            keyed.insert(String::from("token_batch/tokens"), json!(tokens));
            keyed.insert(String::from("token_batch/rounds"), json!(refill.rounds + 1));
        }
        if self.cfg.max_refill_rounds > 0 {
            keyed.insert(String::from("refill/rounds"), json!(refill.rounds));
            keyed.insert(String::from("refill/groups_kept"), json!(refill.kept));
            keyed.insert(String::from("refill/groups_discarded"), json!(refill.discarded));
            if let Some(r) = refill.planned_reward {
                keyed.insert(String::from("refill/planned_reward"), json!(r));
            }
        }
        Ok(MetricsRow { step, rollouts: Some(rollouts), keyed: keyed.into_iter().collect() })
    }

    /// One round: tasks holding at least `rollouts` rollouts, run, their truncated rollouts zeroed
    /// when configured. Curricula observe every group, a discarded refill too: each says how hard
    /// its task is.
    pub(super) async fn round(&mut self, step: u64, rollouts: u32) -> Result<(Vec<Group>, Collected)> {
        let shapes: Vec<EnvShape<'_>> = self
            .envs
            .iter()
            .map(|e| EnvShape { ratio: e.ratio, group_size: e.group_size, curriculum: &e.curriculum })
            .collect();
        let plan = self.sampler.plan(&shapes, rollouts);
        let mut jobs: Vec<GroupJob<'_>> = plan
            .iter()
            .map(|p| {
                let env = &self.envs[p.env];
                GroupJob {
                    env_name: env.name(),
                    client: &env.client,
                    split: "train",
                    index: p.index,
                    group_size: env.group_size,
                    sampling: &env.sampling,
                }
            })
            .collect();
        // The greedy rollouts some algorithms compare with run in the same round, after the groups:
        // `greedy_of[i]` is the job of plan entry i's greedy rollout.
        let mut greedy_of = vec![None; plan.len()];
        for (i, p) in plan.iter().enumerate() {
            if let Some(sampling) = &self.envs[p.env].greedy_sampling {
                greedy_of[i] = Some(jobs.len());
                jobs.push(GroupJob { group_size: 1, sampling, ..jobs[i].clone() });
            }
        }
        // Off-policy aging applies to the policy only: another actor's version never moves.
        let max_off = u64::from(self.cfg.max_off_policy_steps);
        let oldest = (self.cfg.actor == POLICY_KEY).then(|| step.saturating_sub(1 + max_off));
        let dispatch = Dispatch {
            models: &self.models,
            actor: &self.cfg.actor,
            step,
            ckpt_step: self.ckpt_step,
            oldest_version: oldest,
            trainer_timeout: self.trainer_timeout(),
            ready_timeout: Duration::from_secs_f64(self.cfg.wait_for_ready_s),
            fatal_errors: true,
            rate: self.rate.as_ref(),
        };
        let mut collected = dispatch.run(&jobs, &mut self.policy).await?;
        // Dropped groups (retryable failures past their runs) leave the step smaller, within budget.
        let dropped = collected.dropped_total();
        if dropped as f64 > self.cfg.max_dropped_group_fraction * jobs.len() as f64 || dropped == jobs.len() {
            return Err(Error::Rollout {
                env: String::from("all"),
                message: format!(
                    "{dropped} of the step's {} groups failed (orchestrator.max_dropped_group_fraction = {}); last: {}",
                    jobs.len(),
                    self.cfg.max_dropped_group_fraction,
                    collected.last_drop.as_deref().unwrap_or("-")
                ),
            });
        }
        let mut traces = std::mem::take(&mut collected.groups);
        let greedy: Vec<Option<Rollout>> = greedy_of
            .iter()
            .map(|j| {
                let (mut traces, _) = std::mem::take(&mut traces[(*j)?]);
                traces.pop().map(|(_, t)| Rollout::new(t))
            })
            .collect();
        traces.truncate(plan.len());
        let mut groups: Vec<Group> = plan
            .iter()
            .zip(traces)
            .zip(greedy)
            .filter(|((_, (traces, _)), _)| !traces.is_empty())
            .map(|((p, (traces, version)), greedy)| Group { greedy, ..Group::new(p.env, p.index, version, traces) })
            .collect();
        // Before anything reads the rewards: baselines, curricula and metrics all see what trains.
        if self.cfg.zero_truncated_completions {
            groups.iter_mut().for_each(Group::zero_truncated);
        }
        for g in &groups {
            if let Some(mean) = g.clean_mean() {
                self.envs[g.env].curriculum.observe(g.task, mean);
            }
        }
        Ok((groups, collected))
    }

    /// Each env's algorithms on its groups, aggregated into training samples; and the tally.
    async fn training_samples(&mut self, step: u64, groups: &[Group]) -> Result<(Vec<TrainingSample>, StepTally)> {
        let mut out = Vec::new();
        let mut tally = StepTally::default();
        for g in groups {
            let env = &mut self.envs[g.env];
            let policy_url = self.policy.any_base_url();
            let runtimes = runtimes(&self.models, &env.sampling, self.policy.get(), &policy_url)?;
            let ctx = Scoring {
                models: &self.models,
                env: &env.client,
                runtimes: &runtimes,
                policy_version: self.policy.get(),
                step,
                greedy: g.greedy.as_ref(),
            };
            let mut outputs: Vec<Vec<Vec<Channel>>> = Vec::new();
            for a in &mut env.algorithms {
                outputs.push(a.channels(&g.rollouts, ctx).await?);
            }
            let ids: Vec<&str> = env.algorithms.iter().map(|a| a.id()).collect();
            let targets = aggregate(&ids, &g.rollouts, &outputs)?;
            tally.add_group(&env.info.name, &g.rollouts.iter().map(Rollout::reward).collect::<Vec<_>>());
            if let Some(greedy) = g.greedy.as_ref().filter(|r| r.is_clean()) {
                tally.add_greedy(&env.info.name, greedy.reward());
            }
            for (rollout, t) in g.rollouts.iter().zip(&targets) {
                tally.add(&env.info.name, env.info.is_multi_agent(), rollout, t);
                // The temperature the trace says it was sampled at; env servers that do not say
                // sampled with the env's configured one.
                let temperature = match rollout.trace.sampling_temperature.map(Temperature::new).transpose() {
                    Ok(t) => t.unwrap_or(env.sampling.temperature),
                    Err(m) => {
                        let message = format!("a trace's sampling_temperature {m}");
                        return Err(Error::Rollout { env: env.info.name.clone(), message });
                    }
                };
                if temperature.is_greedy() && rollout.sampled_tokens() > 0 {
                    return Err(Error::Rollout {
                        env: env.info.name.clone(),
                        message: format!("a trace sampled at temperature {temperature} cannot be trained"),
                    });
                }
                out.extend(samples(rollout, t, temperature, env.index, self.cfg.filter_zero_advantages));
            }
        }
        Ok((out, tally))
    }

    /// Stops the run when more than `max_reward_error_fraction` of the step's rollouts had a reward
    /// function fail, naming the first failure.
    fn check_reward_errors(&self, groups: &[Group]) -> Result<()> {
        let rollouts: Vec<(usize, &Rollout)> =
            groups.iter().flat_map(|g| g.rollouts.iter().map(|r| (g.env, r))).collect();
        let failed: Vec<&(usize, &Rollout)> =
            rollouts.iter().filter(|(_, r)| !r.trace.reward_errors.is_empty()).collect();
        let limit = self.cfg.max_reward_error_fraction;
        let Some((env, first)) = failed.first() else { return Ok(()) };
        if limit >= 1.0 || failed.len() as f64 <= limit * rollouts.len() as f64 {
            return Ok(());
        }
        let e = &first.trace.reward_errors[0];
        Err(Error::Rollout {
            env: self.envs[*env].name().to_owned(),
            message: format!(
                "{} of the step's {} rollouts had a reward function fail (orchestrator.max_reward_error_fraction = \
                 {limit}); first: `{}`: {}",
                failed.len(),
                rollouts.len(),
                e.name,
                e.message
            ),
        })
    }

    /// The step's training batch.
    fn batch(&self, step: u64, samples: &[TrainingSample], groups: &[Group]) -> TrainBatch {
        let seq_len = self.cfg.seq_len as usize;
        // Samples longer than seq_len are cut; say so, since their tail is not trained.
        let overlong = samples.iter().filter(|s| s.ids.len() > seq_len).count();
        if overlong > 0 {
            tracing::warn!(step, overlong, seq_len, "samples longer than seq_len were truncated; raise seq_len");
        }
        TrainBatch {
            step,
            micro_batches: pack(samples, seq_len),
            env_names: self.envs.iter().map(|e| e.name().to_owned()).collect(),
            min_policy_version: groups.iter().map(|g| g.policy_version).min().unwrap_or(self.policy.get()),
        }
    }

    /// Writes the orchestrator's checkpoint at checkpoint steps and at the last step.
    fn checkpoint_if_due(&mut self, step: u64) -> Result<()> {
        let Some(ckpt) = &self.cfg.ckpt else { return Ok(()) };
        if !(step.is_multiple_of(ckpt.interval) || self.cfg.max_steps == Some(step)) {
            return Ok(());
        }
        let algorithms = self
            .envs
            .iter()
            .flat_map(|e| e.algorithms.iter().filter_map(|a| Some((format!("{}/{}", e.name(), a.id()), a.state()?))))
            .collect();
        let mut state = OrchestratorState::new(step, self.sampler.state(), algorithms);
        state.curricula = self.envs.iter().filter_map(|e| Some((e.name().to_owned(), e.curriculum.state()?))).collect();
        checkpoint::save(&self.run, &state, ckpt.keep_last)?;
        self.ckpt_step = step;
        Ok(())
    }

    /// Evaluates with the current policy every eval env (`all`), or those whose interval falls on
    /// `step`: after the last step every one, on the interval or not (the final policy).
    async fn evaluate(&mut self, step: u64, all: bool) -> Result<Map<String, Value>> {
        let all = all || self.cfg.max_steps == Some(step);
        let envs: Vec<&EvalEnv> = self.eval_envs.iter().filter(|e| all || step.is_multiple_of(e.interval)).collect();
        if envs.is_empty() {
            return Ok(Map::new());
        }
        let dispatch = Dispatch {
            models: &self.models,
            actor: &self.cfg.actor,
            step,
            ckpt_step: self.ckpt_step,
            oldest_version: None,
            trainer_timeout: self.trainer_timeout(),
            ready_timeout: Duration::from_secs_f64(self.cfg.wait_for_ready_s),
            fatal_errors: false,
            rate: self.rate.as_ref(),
        };
        let done = evaluate(&envs, dispatch, &mut self.policy).await?;
        let traces = done.traces.iter().map(|(env, t)| (env.as_str(), t));
        write_eval_traces(&self.run, step, traces, done.policy_version)?;
        Ok(done.metrics)
    }
}
