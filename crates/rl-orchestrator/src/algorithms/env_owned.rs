//! Algorithms the orchestrator does not know: the env server runs them (`RunAlgorithms`) on the
//! group's traces and answers per-branch channels, which are checked like any other.

use async_trait::async_trait;
use rl_configs::Table;
use rl_serve::pb;

use super::{Algorithm, Channel, EnvInfo, LossChannel, Scoring};
use crate::error::{Error, Result};
use crate::rollout::Rollout;

/// An algorithm run by the env server.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvOwned {
    id: String,
    fields_json: String,
}

impl EnvOwned {
    /// The env-owned algorithm `id` with its config fields.
    pub fn new(id: &str, fields: &Table) -> Self {
        let fields_json = serde_json::Value::Object(fields.clone().into_iter().collect()).to_string();
        EnvOwned { id: id.to_owned(), fields_json }
    }

    fn loss(&self, wire: i32) -> Result<LossChannel> {
        match pb::LossChannel::try_from(wire) {
            Ok(pb::LossChannel::Rl) => Ok(LossChannel::Rl),
            Ok(pb::LossChannel::Ce) => Ok(LossChannel::Ce),
            _ => Err(Error::Config(format!(
                "env-owned algorithm `{}` returned a branch without a loss channel",
                self.id
            ))),
        }
    }
}

#[async_trait]
impl Algorithm for EnvOwned {
    fn id(&self) -> &str {
        &self.id
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        if !env.offered.iter().any(|x| x == &self.id) {
            return Err(Error::Config(format!(
                "algorithm `{}` is neither built in nor offered by env `{}` (it offers: {})",
                self.id,
                env.name,
                if env.offered.is_empty() { String::from("none") } else { env.offered.join(", ") }
            )));
        }
        // The env's algorithms see one group of rollouts; on a multi-agent env that group mixes
        // members, whose rewards must not share one baseline.
        if env.is_multi_agent() {
            return Err(Error::Config(format!(
                "env `{}` is multi-agent (members {}): env-owned `{}` would mix the members' rewards in one baseline; use `rae`",
                env.name,
                env.members.join(", "),
                self.id
            )));
        }
        Ok(())
    }

    async fn channels(&mut self, group: &[Rollout], ctx: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        let req = pb::RunAlgorithmsRequest {
            algorithms: vec![pb::AlgorithmSpec { id: self.id.clone(), fields_json: self.fields_json.clone() }],
            traces: group.iter().map(|r| r.trace.clone()).collect(),
            models: ctx.runtimes.clone().into_iter().collect(),
        };
        let resp = ctx.env.run_algorithms(req).await?;
        if resp.traces.len() != group.len() {
            return Err(Error::Config(format!(
                "env-owned algorithm `{}` answered for {} traces, sent {}",
                self.id,
                resp.traces.len(),
                group.len()
            )));
        }
        resp.traces
            .into_iter()
            .map(|t| {
                t.branches
                    .into_iter()
                    .map(|b| {
                        let loss = self.loss(b.loss)?;
                        Ok(Channel { branch: b.branch_index as usize, loss, values: b.advantages, mask: b.mask })
                    })
                    .collect()
            })
            .collect()
    }
}
