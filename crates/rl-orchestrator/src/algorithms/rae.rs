//! `rae` (SPIRAL Algorithm 1) for multi-agent envs: an EMA reward baseline per (example, member),
//! first updated, `b = momentum * b + (1 - momentum) * r`, then subtracted, `A = r - b`. The
//! baselines are the algorithm's state and travel with checkpoints. The judge's rollouts can be
//! dropped from training. Its metrics: per member, the mean baseline and advantage of the
//! rollouts scored since the last report.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::Value;

use super::{Algorithm, Channel, EnvInfo, LossChannel, Scoring, on_sampled};
use crate::error::{Error, Result};
use crate::rollout::Rollout;

/// Role-conditioned advantage estimation with an EMA baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Rae {
    momentum: f64,
    drop_judge: bool,
    /// The env's judge member, when it has one and `drop_judge` is set.
    judge: Option<String>,
    /// Baselines keyed `task_key|member_id` (cold start: 0).
    baselines: BTreeMap<String, f64>,
    /// Per member since the last report: (sum of baselines, sum of advantages, rollouts).
    reported: BTreeMap<String, (f64, f64, usize)>,
}

impl Rae {
    /// RAE with EMA `momentum`; `drop_judge` drops the judge member's rollouts from training.
    pub fn new(momentum: f64, drop_judge: bool) -> Self {
        Rae { momentum, drop_judge, judge: None, baselines: BTreeMap::new(), reported: BTreeMap::new() }
    }

    fn advantage(&mut self, rollout: &Rollout) -> Option<f64> {
        let t = &rollout.trace;
        if !rollout.is_clean() || self.judge.as_deref() == Some(t.member_id.as_str()) {
            return None;
        }
        let b = self.baselines.entry(format!("{}|{}", t.task_key, t.member_id)).or_insert(0.0);
        *b = self.momentum * *b + (1.0 - self.momentum) * t.reward;
        let (baseline, advantage) = (*b, t.reward - *b);
        let r = self.reported.entry(t.member_id.clone()).or_default();
        *r = (r.0 + baseline, r.1 + advantage, r.2 + 1);
        Some(advantage)
    }
}

#[async_trait]
impl Algorithm for Rae {
    fn id(&self) -> &str {
        "rae"
    }

    fn attach(&mut self, env: &EnvInfo) -> Result<()> {
        if !env.is_multi_agent() {
            return Err(Error::Config(format!(
                "`rae` keeps a baseline per member and needs a multi-agent env; `{}` has no members",
                env.name
            )));
        }
        self.judge = env.judge.clone().filter(|_| self.drop_judge);
        Ok(())
    }

    async fn channels(&mut self, group: &[Rollout], _: Scoring<'_>) -> Result<Vec<Vec<Channel>>> {
        Ok(group
            .iter()
            .map(|r| self.advantage(r).map_or_else(Vec::new, |a| on_sampled(r, a as f32, LossChannel::Rl)))
            .collect())
    }

    fn take_metrics(&mut self) -> BTreeMap<String, f64> {
        std::mem::take(&mut self.reported)
            .into_iter()
            .flat_map(|(m, (b, a, n))| {
                [(format!("baseline/{m}"), b / n as f64), (format!("advantage/{m}"), a / n as f64)]
            })
            .collect()
    }

    fn state(&self) -> Option<Value> {
        Some(serde_json::json!(self.baselines))
    }

    fn restore(&mut self, state: Value) -> Result<()> {
        self.baselines = serde_json::from_value(state)
            .map_err(|e| Error::Config(format!("rae state is not a map of baselines: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{local, rollout};
    use super::*;

    fn member(task: &str, member: &str, reward: f64) -> Rollout {
        let mut r = rollout(reward, 1, false);
        r.trace.task_key = task.to_owned();
        r.trace.member_id = member.to_owned();
        r
    }

    #[test]
    fn rae_updates_the_baseline_then_subtracts_it_and_its_state_round_trips() {
        let env = EnvInfo {
            name: String::from("debate"),
            members: vec![String::from("a"), String::from("b"), String::from("judge")],
            judge: Some(String::from("judge")),
            ..EnvInfo::default()
        };
        let mut rae = Rae::new(0.9, true);
        rae.attach(&env).unwrap();
        let adv = |ch: &Vec<Vec<Channel>>, i: usize| ch[i].first().map(|c| c.values[2]);
        // Cold start: b = 0.9 * 0 + 0.1 * 1 = 0.1, A = 0.9.
        let ch = local(&mut rae, &[member("t/0", "a", 1.0)]);
        assert!((adv(&ch, 0).unwrap() - 0.9).abs() < 1e-6);
        // Same (example, member) again with reward 1: b = 0.9 * 0.1 + 0.1 = 0.19, A = 0.81. Another
        // member and another example each start cold.
        let group =
            [member("t/0", "a", 1.0), member("t/0", "b", -1.0), member("t/1", "a", 0.5), member("t/0", "judge", 0.0)];
        let saved = rae.state().unwrap();
        assert!((rae.take_metrics()["baseline/a"] - 0.1).abs() < 1e-12, "the cold-start baseline");
        let ch = local(&mut rae, &group);
        assert!((adv(&ch, 0).unwrap() - 0.81).abs() < 1e-6);
        assert!((adv(&ch, 1).unwrap() - -0.9).abs() < 1e-6);
        assert!((adv(&ch, 2).unwrap() - 0.45).abs() < 1e-6);
        assert!(ch[3].is_empty(), "the judge is dropped");
        assert!((rae.baselines["t/0|a"] - 0.19).abs() < 1e-12);
        // Reported per member: member a's baselines 0.19 and 0.05 (mean 0.12), advantages 0.81 and 0.45.
        let m = rae.take_metrics();
        assert!((m["baseline/a"] - 0.12).abs() < 1e-12 && (m["advantage/a"] - 0.63).abs() < 1e-12, "{m:?}");
        assert!((m["baseline/b"] - -0.1).abs() < 1e-12 && !m.contains_key("baseline/judge"), "{m:?}");
        assert!(rae.take_metrics().is_empty(), "each report covers the rollouts since the last");
        assert!(!rae.baselines.contains_key("t/0|judge"));
        // A restored copy continues exactly as the original did.
        let mut restored = Rae::new(0.9, true);
        restored.attach(&env).unwrap();
        restored.restore(saved).unwrap();
        assert_eq!(local(&mut restored, &group), ch);
        // Momentum 0: the baseline is the last reward, so a repeated reward has advantage 0.
        let mut z = Rae::new(0.0, false);
        z.attach(&env).unwrap();
        assert_eq!(adv(&local(&mut z, &[member("x", "a", 2.0)]), 0), Some(0.0));
    }
}
