//! On-policy distillation: per-token advantage `teacher logprob - inference logprob` on sampled
//! tokens, the teacher scoring each branch (`prompt_logprobs`, at most `max_concurrent` requests in
//! flight). `opd` scores the branch as is; `opsd` lets the teacher (possibly the policy itself) see
//! a demonstration hint first — the hint's positions are dropped.

use std::collections::HashMap;

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};

use super::{Algorithm, Channel, EnvInfo, LossChannel, Scoring, single_agent};
use crate::error::{Error, Result};
use crate::rollout::Rollout;

/// Per-token reference-minus-inference logprob advantage from model `model`.
#[derive(Debug, Clone, PartialEq)]
pub struct Opd {
    model: String,
    max_concurrent: usize,
}

impl Opd {
    /// opd scored by model key `model`.
    pub fn new(model: &str, max_concurrent: u32) -> Self {
        Opd { model: model.to_owned(), max_concurrent: max_concurrent as usize }
    }
}

/// Like opd, but the scorer sees a demonstration hint before the branch.
#[derive(Debug, Clone, PartialEq)]
pub struct Opsd {
    model: String,
    demo_key: String,
    template: String,
    max_concurrent: usize,
}

impl Opsd {
    /// opsd scored by `model`, the hint made from task field `demo_key` through `template`.
    pub fn new(model: &str, demo_key: &str, template: &str, max_concurrent: u32) -> Self {
        Opsd {
            model: model.to_owned(),
            demo_key: demo_key.to_owned(),
            template: template.to_owned(),
            max_concurrent: max_concurrent as usize,
        }
    }

    /// The demonstration of a rollout's task (`task[demo_key]`, a string or any JSON value).
    fn demonstration(&self, rollout: &Rollout) -> Result<String> {
        let task: Value = serde_json::from_str(&rollout.trace.task_json).unwrap_or(Value::Null);
        match task.get(&self.demo_key) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) if !v.is_null() => Ok(v.to_string()),
            _ => Err(Error::Config(format!(
                "opsd: the task has no `{}` field to use as the demonstration (set `demo_key`; task fields: {})",
                self.demo_key,
                task.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>().join(", ")).unwrap_or_default()
            ))),
        }
    }
}

#[async_trait]
impl Algorithm for Opd {
    fn id(&self) -> &str {
        "opd"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        single_agent(self.id(), env)
    }

    async fn channels(&mut self, group: &[Rollout], ctx: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        distill(group, ctx, &self.model, self.max_concurrent, |_| Ok(Vec::new())).await
    }
}

#[async_trait]
impl Algorithm for Opsd {
    fn id(&self) -> &str {
        "opsd"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        single_agent(self.id(), env)
    }

    async fn channels(&mut self, group: &[Rollout], ctx: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        // One hint per distinct demonstration (a group shares its task).
        let mut hints: HashMap<String, Vec<u32>> = HashMap::new();
        for r in group.iter().filter(|r| r.is_clean()) {
            let demo = self.demonstration(r)?;
            if let std::collections::hash_map::Entry::Vacant(slot) = hints.entry(demo) {
                let hint = self.template.replace("{demonstration}", slot.key());
                let ids = ctx.models.tokenize(&self.model, json!([{"role": "system", "content": hint}])).await?;
                slot.insert(ids);
            }
        }
        distill(group, ctx, &self.model, self.max_concurrent, |r| {
            Ok(hints.get(&self.demonstration(r)?).cloned().unwrap_or_default())
        })
        .await
    }
}

/// `teacher - inference` logprob on sampled tokens, the teacher scoring `prefix(rollout) + branch`.
async fn distill(
    group: &[Rollout],
    ctx: Scoring<'_>,
    model: &str,
    max_concurrent: usize,
    prefix: impl Fn(&Rollout) -> Result<Vec<u32>>,
) -> Result<Vec<Vec<Channel>>> {
    let mut jobs = Vec::new();
    for (t, rollout) in group.iter().enumerate().filter(|(_, r)| r.is_clean()) {
        let pre = prefix(rollout)?;
        for (b, branch) in rollout.branches.iter().enumerate() {
            // Owned, so the scoring futures borrow nothing (they must be Send for any lifetime).
            jobs.push((t, b, pre.clone(), branch.clone()));
        }
    }
    let scored: Vec<Result<(usize, Channel)>> = futures::stream::iter(jobs)
        .map(|(t, b, pre, branch)| async move {
            let ids: Vec<u32> = pre.iter().chain(&branch.token_ids).copied().collect();
            let teacher = ctx.score(model, &ids).await?;
            let teacher = &teacher[pre.len()..];
            let values = branch
                .mask
                .iter()
                .zip(teacher.iter().zip(&branch.logprobs))
                .map(|(m, (tl, l))| if *m { tl - l } else { 0.0 })
                .collect();
            Ok((t, Channel { branch: b, loss: LossChannel::Rl, values, mask: branch.mask }))
        })
        .buffered(max_concurrent.max(1))
        .collect()
        .await;
    let mut out = vec![Vec::new(); group.len()];
    for r in scored {
        let (t, ch) = r?;
        out[t].push(ch);
    }
    Ok(out)
}
