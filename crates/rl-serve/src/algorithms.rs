//! Env-owned advantage algorithms, run by `RunAlgorithms`: each writes per-token values and a mask
//! for every branch of every trace, checked against the branch's token count.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use rl_proto::env::v1 as pb;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::trace::branches;
use crate::types::ModelRuntime;

/// One algorithm's output for one branch.
#[derive(Debug, Clone, PartialEq)]
pub struct BranchOutput {
    /// Branch index within the trace.
    pub branch_index: u32,
    /// Per-token values.
    pub advantages: Vec<f32>,
    /// Per-token mask.
    pub mask: Vec<bool>,
}

/// An algorithm an env server runs on request.
#[async_trait]
pub trait EnvAlgorithm: Send + Sync {
    /// Id clients select it by.
    fn id(&self) -> &str;
    /// The loss channel it feeds.
    fn loss(&self) -> pb::LossChannel;
    /// Outputs per trace (same order as `traces`), per branch.
    async fn run(
        &self,
        traces: &[pb::Trace],
        fields: &serde_json::Map<String, Value>,
        models: &BTreeMap<String, ModelRuntime>,
    ) -> Result<Vec<Vec<BranchOutput>>>;
}

/// Leave-one-out baseline (RLOO): A_i = r_i - mean of the other clean traces' rewards, on every
/// sampled token. Traces with errors get no output and do not enter the baseline.
#[derive(Debug, Default)]
pub struct Rloo;

#[async_trait]
impl EnvAlgorithm for Rloo {
    fn id(&self) -> &str {
        "rloo"
    }

    fn loss(&self) -> pb::LossChannel {
        pb::LossChannel::Rl
    }

    async fn run(
        &self,
        traces: &[pb::Trace],
        fields: &serde_json::Map<String, Value>,
        _models: &BTreeMap<String, ModelRuntime>,
    ) -> Result<Vec<Vec<BranchOutput>>> {
        if let Some(k) = fields.keys().next() {
            return Err(Error::bad_request(format!("algorithms.rloo.{k}"), "rloo takes no fields"));
        }
        let clean: Vec<f64> = traces.iter().filter(|t| t.errors.is_empty()).map(|t| t.reward).collect();
        let n = clean.len() as f64;
        let sum: f64 = clean.iter().sum();
        Ok(traces
            .iter()
            .map(|t| {
                if !t.errors.is_empty() {
                    return Vec::new();
                }
                let adv = if n > 1.0 { t.reward - (sum - t.reward) / (n - 1.0) } else { 0.0 };
                on_sampled_tokens(t, adv as f32)
            })
            .collect())
    }
}

/// One value on every sampled token of every branch of `trace` (what most trace-level algorithms
/// write: RLOO, or an env's own baseline given as one number per trace).
pub fn on_sampled_tokens(trace: &pb::Trace, value: f32) -> Vec<BranchOutput> {
    branches(trace)
        .into_iter()
        .enumerate()
        .map(|(i, b)| BranchOutput {
            branch_index: i as u32,
            advantages: b.mask.iter().map(|m| if *m { value } else { 0.0 }).collect(),
            mask: b.mask,
        })
        .collect()
}

/// The algorithms every env server offers.
pub fn default_algorithms() -> BTreeMap<String, Arc<dyn EnvAlgorithm>> {
    let mut m: BTreeMap<String, Arc<dyn EnvAlgorithm>> = BTreeMap::new();
    m.insert(String::from("rloo"), Arc::new(Rloo));
    m
}

/// Checks an algorithm's outputs against the traces' branches; a mismatch is an env bug.
pub(crate) fn check_outputs(algorithm: &str, traces: &[pb::Trace], outputs: &[Vec<BranchOutput>]) -> Result<()> {
    if outputs.len() != traces.len() {
        return Err(Error::Env(format!(
            "algorithm `{algorithm}` returned outputs for {} traces, expected {}",
            outputs.len(),
            traces.len()
        )));
    }
    for (t, (trace, outs)) in traces.iter().zip(outputs).enumerate() {
        let bs = branches(trace);
        for o in outs {
            let Some(b) = bs.get(o.branch_index as usize) else {
                return Err(Error::Env(format!(
                    "algorithm `{algorithm}`: trace {t} has {} branches, got output for branch {}",
                    bs.len(),
                    o.branch_index
                )));
            };
            if o.advantages.len() != b.token_ids.len() || o.mask.len() != b.token_ids.len() {
                return Err(Error::Env(format!(
                    "algorithm `{algorithm}`: trace {t} branch {} has {} tokens, got {} advantages and {} mask entries",
                    o.branch_index,
                    b.token_ids.len(),
                    o.advantages.len(),
                    o.mask.len()
                )));
            }
        }
    }
    Ok(())
}
