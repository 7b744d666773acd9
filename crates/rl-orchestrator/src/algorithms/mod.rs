//! Algorithms as an open set: each turns a scored group into per-branch channels (`values` +
//! `mask` for one trainer loss: rl advantages or ce weights), says which envs it accepts, and owns
//! its state across checkpoints. Channels of the same loss are summed by [`aggregate`]. Adding an
//! algorithm is one new file here (with its `mod` line) and its line in [`build`]; its config
//! variant is in `rl_configs::algorithms`.

mod aggregate;
mod best_of;
mod distill;
mod echo;
mod env_owned;
mod group_math;
mod hierarchical_grpo;
mod rae;
mod reward;
mod rft;
mod sft;
mod turns;

use std::collections::BTreeMap;

use async_trait::async_trait;
use rl_configs::{AlgorithmConfig, BuiltinAlgorithm};
use rl_serve::{EnvClient, pb};
use serde_json::Value;

pub use aggregate::{BranchTargets, aggregate};
pub use distill::{Opd, Opsd};
pub use echo::Echo;
pub use env_owned::EnvOwned;
pub use hierarchical_grpo::HierarchicalGrpo;
pub use rae::Rae;
pub use reward::{Grpo, MaxRl, Rl};
pub use rft::Rft;
pub use sft::Sft;

use crate::error::{Error, Result};
use crate::models::Models;
use crate::rollout::Rollout;

/// Which loss of the trainer a channel feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossChannel {
    /// Policy-gradient loss with advantages.
    Rl,
    /// Cross-entropy (supervised) loss with weights.
    Ce,
}

/// One algorithm's output for one branch of a rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    /// Which branch of the rollout.
    pub branch: usize,
    /// Which trainer loss it feeds.
    pub loss: LossChannel,
    /// Per-token values (advantages for rl, weights for ce).
    pub values: Vec<f32>,
    /// Per-token: where the values apply.
    pub mask: Vec<bool>,
}

/// What an env server says about itself that algorithms check against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvInfo {
    /// The env's name in the run.
    pub name: String,
    /// Member ids of a multi-agent env (empty for single-agent envs).
    pub members: Vec<String>,
    /// The member that only judges, if the env has one.
    pub judge: Option<String>,
    /// Algorithms the env server runs itself (`RunAlgorithms`).
    pub offered: Vec<String>,
}

impl EnvInfo {
    /// Whether the env has several members.
    pub fn is_multi_agent(&self) -> bool {
        !self.members.is_empty()
    }
}

/// What algorithms that need more than the rollouts use: the model endpoints, the env's server,
/// the runtimes env-side code samples with, and the policy's cache salt.
#[derive(Debug, Clone, Copy)]
pub struct Scoring<'a> {
    /// The model endpoints.
    pub models: &'a Models,
    /// The env's server.
    pub env: &'a EnvClient,
    /// Every model as a wire runtime, by key.
    pub runtimes: &'a BTreeMap<String, pb::ModelRuntime>,
    /// The policy version the server holds (the cache salt and model name of its requests).
    pub policy_version: u64,
    /// The training step the channels are for (1-based).
    pub step: u64,
    /// The group's greedy rollout, when an algorithm of its env asked for one
    /// ([`Algorithm::needs_greedy`]) and it came back; not trained.
    pub greedy: Option<&'a Rollout>,
}

impl Scoring<'_> {
    /// Logprobs of `ids` under model `key` (the policy's requests carry its cache salt).
    pub(crate) async fn score(&self, key: &str, ids: &[u32]) -> Result<Vec<f32>> {
        let policy = key == rl_configs::POLICY_KEY;
        let version = policy.then_some(self.policy_version);
        // The policy replica the group's runtimes name.
        let server = self.runtimes.get(key).filter(|_| policy).map(|r| r.base_url.as_str());
        self.models.score(key, ids, version, server).await
    }
}

/// An algorithm of the registry.
#[async_trait]
pub trait Algorithm: Send + Sync + std::fmt::Debug {
    /// Its id in configs and metrics.
    fn id(&self) -> &str;

    /// Checks that the algorithm can run on `env` (and keeps what it needs from it). Called once
    /// per env at start: an incompatible pairing fails the run before any rollout.
    fn attach(&mut self, env: &EnvInfo) -> Result<()>;

    /// Channels for each rollout of a group (`out[t]`: rollout `t`'s channels, each naming its branch).
    async fn channels(&mut self, group: &[Rollout], ctx: Scoring<'_>) -> Result<Vec<Vec<Channel>>>;

    /// Whether the algorithm needs a greedy (temperature 0) rollout of each group's task beside the
    /// group ([`Scoring::greedy`]).
    fn needs_greedy(&self) -> bool {
        false
    }

    /// Figures of the groups scored since the last call (`name -> value`), reported as
    /// `algorithm/<env>/<id>/<name>` in the step's metrics row.
    fn take_metrics(&mut self) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }

    /// State to checkpoint, if the algorithm keeps any between groups.
    fn state(&self) -> Option<Value> {
        None
    }

    /// Restores checkpointed state (called for algorithms whose `state` is `Some`).
    fn restore(&mut self, _state: Value) -> Result<()> {
        Ok(())
    }
}

/// The algorithm for a config entry.
pub fn build(cfg: &AlgorithmConfig) -> Result<Box<dyn Algorithm>> {
    Ok(match cfg {
        AlgorithmConfig::Builtin(b) => match b {
            BuiltinAlgorithm::Grpo(c) => Box::new(
                Grpo::new(c.scale_rewards, c.credit, c.turn_discount, c.best_of)
                    .best_of_until(c.best_of_steps)
                    .with_baseline(c.baseline),
            ),
            BuiltinAlgorithm::MaxRl(_) => Box::new(MaxRl),
            BuiltinAlgorithm::Rl(_) => Box::new(Rl),
            BuiltinAlgorithm::Sft(_) => Box::new(Sft),
            BuiltinAlgorithm::Rft(c) => Box::new(Rft::new(c.top, c.min_reward, c.weight)),
            BuiltinAlgorithm::Echo(c) => Box::new(Echo::new(c.alpha, &c.roles)),
            BuiltinAlgorithm::Opd(c) => Box::new(Opd::new(&c.model, c.max_concurrent)),
            BuiltinAlgorithm::Opsd(c) => Box::new(Opsd::new(&c.model, &c.demo_key, &c.template, c.max_concurrent)),
            BuiltinAlgorithm::Rae(c) => Box::new(Rae::new(c.momentum, c.drop_judge)),
            BuiltinAlgorithm::HierarchicalGrpo(c) => Box::new(HierarchicalGrpo::new(&c.episode_agents)),
        },
        AlgorithmConfig::EnvOwned { id, fields } => Box::new(EnvOwned::new(id, fields)),
    })
}

/// Rejects multi-agent envs for algorithms that compare the rollouts of one agent.
pub(crate) fn single_agent(id: &str, env: &EnvInfo) -> Result<()> {
    if env.is_multi_agent() {
        return Err(Error::Config(format!(
            "env `{}` is multi-agent (members {}): `{id}` compares rollouts of one agent and is rejected there; use `rae`",
            env.name,
            env.members.join(", "),
        )));
    }
    Ok(())
}

/// `value` on every sampled token of every branch, for one loss.
pub(crate) fn on_sampled(rollout: &Rollout, value: f32, loss: LossChannel) -> Vec<Channel> {
    rollout
        .branches
        .iter()
        .enumerate()
        .map(|(i, b)| Channel {
            branch: i,
            loss,
            values: b.mask.iter().map(|m| if *m { value } else { 0.0 }).collect(),
            mask: b.mask.clone(),
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn node(parent: i32, role: &str, tokens: usize, sampled: bool) -> pb::MessageNode {
        pb::MessageNode {
            parent,
            role: role.to_owned(),
            sampled,
            token_ids: vec![7; tokens],
            mask: vec![sampled; tokens],
            logprobs: if sampled { vec![-0.5; tokens] } else { vec![] },
            ..Default::default()
        }
    }

    /// A prompt of 2 tokens and a sampled reply of `tokens`.
    pub(crate) fn rollout(reward: f64, tokens: usize, error: bool) -> Rollout {
        Rollout::new(pb::Trace {
            reward,
            nodes: vec![node(-1, "user", 2, false), node(0, "assistant", tokens, true)],
            errors: if error {
                vec![pb::TraceError { message: String::from("boom"), ..Default::default() }]
            } else {
                vec![]
            },
            ..Default::default()
        })
    }

    /// Channels of an algorithm that needs no model or env server.
    pub(crate) fn local(a: &mut dyn Algorithm, group: &[Rollout]) -> Vec<Vec<Channel>> {
        local_at(a, group, 1)
    }

    /// `local` at training step `step`.
    pub(crate) fn local_at(a: &mut dyn Algorithm, group: &[Rollout], step: u64) -> Vec<Vec<Channel>> {
        local_with(a, group, step, None)
    }

    /// `local_at` with the group's greedy rollout.
    pub(crate) fn local_with(
        a: &mut dyn Algorithm,
        group: &[Rollout],
        step: u64,
        greedy: Option<&Rollout>,
    ) -> Vec<Vec<Channel>> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _in_runtime = runtime.enter();
        let models = Models::new(&rl_configs::OrchestratorConfig::default()).unwrap();
        let env = EnvClient::new("http://127.0.0.1:9", rl_serve::ClientOptions::default()).unwrap();
        let runtimes = BTreeMap::new();
        let ctx = Scoring { models: &models, env: &env, runtimes: &runtimes, policy_version: 0, step, greedy };
        runtime.block_on(a.channels(group, ctx)).unwrap()
    }

    #[test]
    fn configs_build_their_algorithms_and_unknown_ids_are_env_owned() {
        for id in BuiltinAlgorithm::IDS {
            let cfg = AlgorithmConfig::from_id(id);
            // Only an algorithm with required fields has no default config.
            let builtin = matches!(cfg, AlgorithmConfig::Builtin(_));
            assert!(builtin || *id == "hierarchical_grpo", "{id}");
            assert_eq!(build(&cfg).unwrap().id(), *id);
        }
        assert_eq!(build(&AlgorithmConfig::from_id("rloo")).unwrap().id(), "rloo");
    }

    #[test]
    fn single_agent_algorithms_refuse_multi_agent_envs_and_rae_needs_one() {
        let single = EnvInfo { name: String::from("rt"), ..EnvInfo::default() };
        let multi = EnvInfo {
            name: String::from("debate"),
            members: vec![String::from("a"), String::from("b")],
            ..single.clone()
        };
        for id in ["grpo", "max_rl", "rl", "sft", "rft", "echo", "opd", "opsd"] {
            let mut a = build(&AlgorithmConfig::from_id(id)).unwrap();
            assert!(a.attach(&single).is_ok(), "{id}");
            let err = a.attach(&multi).unwrap_err().to_string();
            assert!(err.contains("multi-agent") && err.contains(id), "{id}: {err}");
        }
        let mut rae = build(&AlgorithmConfig::from_id("rae")).unwrap();
        assert!(rae.attach(&multi).is_ok());
        assert!(rae.attach(&single).unwrap_err().to_string().contains("multi-agent env"));
    }
}
