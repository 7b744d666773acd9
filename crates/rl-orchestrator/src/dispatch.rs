//! Running groups on env servers. All groups of a step (or of an evaluation) run concurrently,
//! in rounds: a group whose rollouts failed with a retryable error (on a trace, or the env-server
//! call itself), or that came back too stale for the step, is run again in the next round — at
//! most [`GROUP_ATTEMPTS`] runs per group in all. A group still failing then is dropped and counted
//! by error kind; the caller proceeds with the rest (within its budget). A non-retryable error
//! fails the call when `fatal_errors` is set (training), and only drops its group otherwise (eval).

use std::collections::BTreeMap;

use rl_configs::{POLICY_KEY, SamplingConfig};
use rl_serve::{EnvClient, ModelRuntime, Sampling, pb};

use crate::error::{Error, Result};
use crate::models::Models;
use crate::policy::PolicyVersion;

/// Most runs of one group (retryable failures and staleness together).
pub const GROUP_ATTEMPTS: u32 = 3;

/// Pause before a round that runs failed groups again (a briefly overloaded endpoint recovers).
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// One group to run.
#[derive(Debug, Clone)]
pub(crate) struct GroupJob<'a> {
    /// The env's name (for errors).
    pub env_name: &'a str,
    /// The env's server.
    pub client: &'a EnvClient,
    /// Split and example index.
    pub split: &'a str,
    /// Example index in the split.
    pub index: u64,
    /// Rollouts in the group.
    pub group_size: u32,
    /// How the actor samples.
    pub sampling: &'a SamplingConfig,
}

/// What the requests of one call share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dispatch<'a> {
    /// The model endpoints.
    pub models: &'a Models,
    /// The model key rollouts sample from.
    pub actor: &'a str,
    /// The step in `training_context`.
    pub step: u64,
    /// The latest checkpoint step in `training_context`.
    pub ckpt_step: u64,
    /// Groups sampled with a policy older than this are run again (`None`: never stale).
    pub oldest_version: Option<u64>,
    /// Longest wait for the trainer's weights before running stale groups again.
    pub trainer_timeout: std::time::Duration,
    /// Longest wait for a policy server that stopped answering (`wait_for_ready_s`).
    pub ready_timeout: std::time::Duration,
    /// A non-retryable rollout error fails the whole call (training) instead of dropping its group
    /// (evaluation).
    pub fatal_errors: bool,
    /// `tasks_per_minute`: each group run waits for its start.
    pub rate: Option<&'a crate::task_rate::TaskRate>,
}

/// The traces of each job (in job order), the policy version each was sampled with, and the
/// retryable errors met on the way, counted by kind.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    /// Traces (with the index of the episode each belongs to) and policy version per job.
    pub groups: Vec<(Vec<(usize, pb::Trace)>, u64)>,
    /// Retryable error kinds seen (`timeout`, `model_error`, ...) and how often.
    pub retried: BTreeMap<String, usize>,
    /// Groups run again because they were too stale.
    pub stale: usize,
    /// Groups given up (their traces left empty), by the kind of their last error.
    pub dropped: BTreeMap<String, usize>,
    /// The last error of a dropped group, for the message when too many are dropped.
    pub last_drop: Option<String>,
}

/// The runtime env servers sample model `key` with; the policy's requests go to `policy_url`
/// (the replica picked for the group).
pub(crate) fn runtime(
    models: &Models,
    key: &str,
    s: &SamplingConfig,
    version: u64,
    policy_url: &str,
) -> Result<ModelRuntime> {
    let ep = models.endpoint(key)?;
    Ok(ModelRuntime {
        base_url: if key == POLICY_KEY { policy_url } else { &ep.base_url }.to_owned(),
        model: if key == POLICY_KEY { ep.model_at(version) } else { &ep.model }.to_owned(),
        sampling: Sampling {
            temperature: Some(s.temperature),
            top_p: Some(s.top_p),
            top_k: s.top_k,
            max_completion_tokens: s.max_completion_tokens,
            stop: s.stop.clone(),
            seed: s.seed.map(|x| x ^ version),
            extra: s.extra.clone().into_iter().collect(),
        },
        tokens: ep.tokens,
        cache_salt: (key == POLICY_KEY).then(|| version.to_string()),
        timeout: ep.timeout,
        api_key: ep.api_key.clone(),
        headers: ep.headers.clone(),
    })
}

/// Every configured model as a wire runtime, for env-side judges and env-owned algorithms.
pub(crate) fn runtimes(
    models: &Models,
    s: &SamplingConfig,
    version: u64,
    policy_url: &str,
) -> Result<BTreeMap<String, pb::ModelRuntime>> {
    models.endpoints().keys().map(|k| Ok((k.clone(), runtime(models, k, s, version, policy_url)?.to_wire()))).collect()
}

/// How one run of a group ended.
enum Attempt {
    Done(Vec<(usize, pb::Trace)>),
    /// Retryable: the error kinds seen and a message.
    Retry(Vec<String>, String),
    /// Not retryable (and not fatal): the kind and a message.
    Failed(String, String),
}

impl Dispatch<'_> {
    fn request(&self, job: &GroupJob<'_>, version: u64, policy_url: &str) -> Result<pb::RunGroupRequest> {
        Ok(pb::RunGroupRequest {
            example: Some(pb::ExampleRef {
                source: Some(pb::example_ref::Source::Dataset(pb::DatasetIndex {
                    split: job.split.to_owned(),
                    index: job.index,
                })),
            }),
            group_size: job.group_size,
            actor: Some(runtime(self.models, self.actor, job.sampling, version, policy_url)?.to_wire()),
            training_context: Some(pb::TrainingContext {
                step: self.step,
                ckpt_step: self.ckpt_step,
                policy_version: version,
                extra: Default::default(),
            }),
            models: runtimes(self.models, job.sampling, version, policy_url)?.into_iter().collect(),
        })
    }

    async fn attempt(&self, job: &GroupJob<'_>, version: u64, policy_url: &str) -> Result<Attempt> {
        if let Some(rate) = self.rate {
            rate.acquire().await;
        }
        let resp = match job.client.run_group(self.request(job, version, policy_url)?).await {
            Ok(resp) => resp,
            // The env server itself failed (down, overloaded, timed out) after the client's own retries.
            Err(e) if e.retryable() => return Ok(Attempt::Retry(vec![kind_name(e.kind() as i32)], e.to_string())),
            Err(e) if !self.fatal_errors => return Ok(Attempt::Failed(kind_name(e.kind() as i32), e.to_string())),
            Err(e) => return Err(e.into()),
        };
        let mut traces = Vec::new();
        let mut errors: Vec<pb::TraceError> = Vec::new();
        for (episode, ep) in resp.episodes.into_iter().enumerate() {
            errors.extend(ep.errors);
            for t in ep.traces {
                errors.extend(t.errors.iter().cloned());
                traces.push((episode, t));
            }
        }
        match errors.iter().find(|e| !e.retryable).or(errors.first()) {
            None => Ok(Attempt::Done(traces)),
            Some(e) if !e.retryable && self.fatal_errors => {
                Err(Error::Rollout { env: job.env_name.to_owned(), message: e.message.clone() })
            }
            Some(e) if !e.retryable => Ok(Attempt::Failed(kind_name(e.kind), e.message.clone())),
            Some(e) => Ok(Attempt::Retry(errors.iter().map(|e| kind_name(e.kind)).collect(), e.message.clone())),
        }
    }

    /// Runs every job to completion (see the module docs), loading newer policy weights between
    /// rounds when a group came back too stale.
    pub(crate) async fn run(&self, jobs: &[GroupJob<'_>], policy: &mut PolicyVersion) -> Result<Collected> {
        let mut out = Collected { groups: vec![(Vec::new(), 0); jobs.len()], ..Collected::default() };
        let mut pending: Vec<usize> = (0..jobs.len()).collect();
        let mut runs = vec![0u32; jobs.len()];
        while !pending.is_empty() {
            if out.retried.values().sum::<usize>() > 0 {
                // Before running failed groups again: replicas that stopped answering leave
                // service; when none is left, one is waited for (restarting) without spending the
                // groups' runs, then given its weights back.
                policy.check_replicas_now(self.models).await?;
                if !policy.serving() {
                    tracing::warn!("no policy inference server answers; waiting for one");
                    policy.wait_serving(self.models, self.ready_timeout).await?;
                }
                // Likewise an env server that is down (the launcher restarts it, after a backoff
                // that can outlast the groups' runs): wait for it before running them again.
                let mut seen = std::collections::BTreeSet::new();
                for &j in &pending {
                    let client = jobs[j].client;
                    if seen.insert(client.address().to_owned()) {
                        client.wait_for_health(self.ready_timeout).await?;
                    }
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            if !policy.serving() {
                policy.wait_serving(self.models, self.ready_timeout).await?;
            }
            let version = policy.get();
            let stale = self.oldest_version.is_some_and(|oldest| version < oldest);
            // Each group goes to the least loaded replica (its multi-turn requests stay there).
            let mut leases = Vec::with_capacity(pending.len());
            for _ in &pending {
                let lease = policy.lease().ok_or_else(|| Error::Policy {
                    url: String::from("policy"),
                    message: String::from("no inference server is in service"),
                })?;
                leases.push((lease, policy.base_url(lease).to_owned()));
            }
            let attempts = futures::future::join_all(
                pending.iter().zip(&leases).map(|(&j, (_, url))| self.attempt(&jobs[j], version, url)),
            )
            .await;
            for (lease, _) in leases {
                policy.release(lease);
            }
            let mut again = Vec::new();
            for (&j, attempt) in pending.iter().zip(attempts) {
                runs[j] += 1;
                let (kind, why) = match attempt? {
                    Attempt::Done(_) if stale => {
                        out.stale += 1;
                        (String::from("stale"), format!("sampled with policy v{version}, older than this step allows"))
                    }
                    Attempt::Done(traces) => {
                        out.groups[j] = (traces, version);
                        continue;
                    }
                    Attempt::Retry(kinds, message) => {
                        for k in &kinds {
                            *out.retried.entry(k.clone()).or_default() += 1;
                        }
                        (kinds.into_iter().next().unwrap_or_default(), message)
                    }
                    Attempt::Failed(kind, message) => {
                        out.drop(jobs[j].env_name, kind, &message);
                        continue;
                    }
                };
                if runs[j] >= GROUP_ATTEMPTS {
                    out.drop(jobs[j].env_name, kind, &format!("still failing after {GROUP_ATTEMPTS} runs: {why}"));
                    continue;
                }
                tracing::warn!(env = %jobs[j].env_name, run = runs[j], reason = %why, "running the group again");
                again.push(j);
            }
            if stale && let Some(oldest) = self.oldest_version {
                policy.wait_for(self.models, oldest, self.trainer_timeout).await?;
            }
            pending = again;
        }
        Ok(out)
    }
}

impl Collected {
    /// Gives up on a group: its traces stay empty; counted by `kind`.
    fn drop(&mut self, env: &str, kind: String, message: &str) {
        tracing::warn!(env, kind = %kind, reason = %message, "dropping the group");
        *self.dropped.entry(kind).or_default() += 1;
        self.last_drop = Some(format!("env `{env}`: {message}"));
    }

    /// Groups dropped in all.
    pub(crate) fn dropped_total(&self) -> usize {
        self.dropped.values().sum()
    }

    /// Adds another round's counts (its traces were taken already).
    pub(crate) fn absorb(&mut self, other: Collected) {
        for (k, n) in other.retried {
            *self.retried.entry(k).or_default() += n;
        }
        for (k, n) in other.dropped {
            *self.dropped.entry(k).or_default() += n;
        }
        self.stale += other.stale;
        self.last_drop = other.last_drop.or(self.last_drop.take());
    }
}

/// The error kind's name as metrics spell it (`ERROR_KIND_TIMEOUT` -> `timeout`).
fn kind_name(kind: i32) -> String {
    pb::ErrorKind::try_from(kind)
        .map(|k| k.as_str_name().trim_start_matches("ERROR_KIND_").to_lowercase())
        .unwrap_or_else(|_| String::from("unknown"))
}
