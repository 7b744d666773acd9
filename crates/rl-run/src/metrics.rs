//! The rows of the run's metrics files, as the one definition their producers write and their
//! readers (the launcher's progress line, the curves, users' scripts) parse. Key names are part of
//! the contract: they are what users see in `metrics.jsonl`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One line of `<run>/metrics.jsonl` in an RL run: a step's rollout metrics, evaluation results
/// (`eval/<env>/...`), error counts by kind (`errors/<kind>`) and per-member rewards
/// (`reward/member/<env>/<member>`). The evaluation before the first step is a row of step 0
/// without rollout metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    /// The step (0: before training).
    pub step: u64,
    /// The step's rollouts; absent in the step-0 evaluation row.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub rollouts: Option<RolloutMetrics>,
    /// Keyed metrics whose names depend on the run (`eval/<env>/...`: `avg@k`, `pass@j`,
    /// `reward/mean`, per reward function `reward/<function>` and per metric `metric/<name>`;
    /// `errors/<kind>`, `reward/member/...`;
    /// per env, means over the step's rollouts: `env/<env>/reward`, `env/<env>/reward/<function>`,
    /// `env/<env>/metric/<name>`, `env/<env>/reward_errors`; per env, means over the step's groups:
    /// `env/<env>/reward_group_best`, `env/<env>/groups_uniform`).
    #[serde(flatten)]
    pub keyed: BTreeMap<String, Value>,
}

/// What one step's rollouts were like.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RolloutMetrics {
    #[serde(rename = "reward/mean")]
    pub reward_mean: f64,
    #[serde(rename = "reward/std")]
    pub reward_std: f64,
    #[serde(rename = "reward/min")]
    pub reward_min: f64,
    #[serde(rename = "reward/max")]
    pub reward_max: f64,
    #[serde(rename = "reward/p10")]
    pub reward_p10: f64,
    #[serde(rename = "reward/p90")]
    pub reward_p90: f64,
    /// Mean over the step's groups of the group's best reward: what sampling can reach, next to
    /// what it reaches on average (`reward/mean`). When the two meet, the policy has sharpened onto
    /// its own mean and the groups hold nothing better to learn from. Absent (as is
    /// `groups/uniform`) in rows written before the two existed.
    #[serde(rename = "reward/group_best", default, skip_serializing_if = "Option::is_none")]
    pub reward_group_best: Option<f64>,
    /// Fraction of the step's groups whose rollouts all scored the same (no reward spread, so no
    /// group-relative advantage).
    #[serde(rename = "groups/uniform", default, skip_serializing_if = "Option::is_none")]
    pub groups_uniform: Option<f64>,
    #[serde(rename = "advantage/mean")]
    pub advantage_mean: f64,
    #[serde(rename = "advantage/std")]
    pub advantage_std: f64,
    #[serde(rename = "advantage/abs_mean")]
    pub advantage_abs_mean: f64,
    /// Traces scored this step.
    pub rollouts: u64,
    /// Training samples (branches with something to train).
    pub samples: u64,
    /// Samples longer than `seq_len` (their tail is not trained).
    #[serde(rename = "samples/truncated")]
    pub samples_truncated: u64,
    /// Packed rows of the batch.
    pub rows: u64,
    /// Sampled tokens.
    pub completion_tokens: f64,
    #[serde(rename = "completion_len/mean")]
    pub completion_len_mean: f64,
    #[serde(rename = "completion_len/max")]
    pub completion_len_max: f64,
    /// Tokens of the traces that were not sampled (prompts, env turns).
    pub prompt_tokens: u64,
    /// Fraction of traces cut by a length limit.
    pub truncated: f64,
    /// Policy version the step's rollouts were sampled with.
    pub policy_version: u64,
    /// How many steps behind the step the policy was.
    pub off_policy_steps: u64,
    /// Groups dropped as too stale and sampled again.
    pub stale_dropped: u64,
    /// Rollouts that failed with a retryable error and were replaced.
    #[serde(rename = "errors/retried")]
    pub errors_retried: u64,
    #[serde(rename = "time/wait_for_policy_s")]
    pub wait_for_policy_s: f64,
    #[serde(rename = "time/generate_s")]
    pub generate_s: f64,
    #[serde(rename = "time/algorithms_s")]
    pub algorithms_s: f64,
    #[serde(rename = "time/step_s")]
    pub step_s: f64,
}

/// One line of `<run>/trainer/metrics.jsonl`: one RL trainer step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerRow {
    /// The step.
    pub step: u64,
    /// rl + ce loss.
    pub loss: f64,
    /// The rl component.
    #[serde(rename = "loss/rl")]
    pub loss_rl: f64,
    /// The ce component.
    #[serde(rename = "loss/ce")]
    pub loss_ce: f64,
    /// Mean per-token KL between the inference and trainer distributions of sampled tokens.
    pub mismatch_kl: f64,
    /// Mean per-token entropy over loss-mask tokens.
    pub entropy: f64,
    /// Fraction of rl tokens masked by `mask_low`.
    pub masked_low: f64,
    /// Fraction of rl tokens masked by `mask_high`.
    pub masked_high: f64,
    /// Tokens in the rl loss.
    pub rl_tokens: u64,
    /// Tokens run through the model.
    pub tokens: u64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Training throughput.
    pub tokens_per_s: f64,
    /// Seconds spent training the step.
    pub step_time_s: f64,
    /// Seconds of the step's forward passes and losses, summed over its rows (rows side by side
    /// each count; off the CPU measured to a device synchronisation).
    #[serde(rename = "time/forward_s", default)]
    pub forward_s: f64,
    /// The same of its backward passes.
    #[serde(rename = "time/backward_s", default)]
    pub backward_s: f64,
    /// Seconds of the gradient norm, clipping and the optimizer's update.
    #[serde(rename = "time/optimizer_s", default)]
    pub optimizer_s: f64,
    /// Seconds spent waiting for the step's batch.
    pub wait_s: f64,
    /// The batch trained no token, so the optimizer step was skipped (weights unchanged).
    #[serde(default)]
    pub optimizer_skipped: bool,
}

/// One line of `<run>/metrics.jsonl` in an SFT run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SftRow {
    /// The step.
    pub step: u64,
    /// Mean cross-entropy of the step's batch.
    pub loss: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Tokens run through the model.
    pub tokens: u64,
    /// Examples in the step's batch (absent in metrics written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Training throughput.
    pub tokens_per_s: f64,
    /// Seconds of the step's forward passes and losses, summed over its rows (rows side by side
    /// each count; off the CPU measured to a device synchronisation).
    #[serde(rename = "time/forward_s", default)]
    pub forward_s: f64,
    /// The same of its backward passes.
    #[serde(rename = "time/backward_s", default)]
    pub backward_s: f64,
    /// Seconds of the gradient norm, clipping and the optimizer's update.
    #[serde(rename = "time/optimizer_s", default)]
    pub optimizer_s: f64,
    /// Validation loss, on validation steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// With groups of data (`data.groups`): each group's share of the step's examples
    /// (`group/<name>/share`, every step) and, on the steps that re-weighed them, its held-out
    /// loss (`group/<name>/val_loss`) and, balanced by greedy exact match, the share of its
    /// held-out replies decoded exactly (`group/<name>/exact`); see [`group_share_key`].
    #[serde(flatten)]
    pub groups: BTreeMap<String, f64>,
}

/// The key of a data group's share in an [`SftRow`].
pub fn group_share_key(group: &str) -> String {
    format!("group/{group}/share")
}

/// The key of a data group's held-out loss in an [`SftRow`].
pub fn group_val_loss_key(group: &str) -> String {
    format!("group/{group}/val_loss")
}

/// The key of a data group's greedy exact-match rate on its held-out replies in an [`SftRow`].
pub fn group_exact_key(group: &str) -> String {
    format!("group/{group}/exact")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn step_rows_keep_their_keyed_metrics_and_eval_rows_have_no_rollouts() {
        let mut keyed = BTreeMap::new();
        keyed.insert(String::from("eval/rt/reward/mean"), json!(0.5));
        keyed.insert(String::from("errors/timeout"), json!(2));
        let row = MetricsRow {
            step: 3,
            rollouts: Some(RolloutMetrics { reward_mean: 0.25, rollouts: 8, ..RolloutMetrics::default() }),
            keyed: keyed.clone(),
        };
        let v = serde_json::to_value(&row).unwrap();
        assert_eq!(v["reward/mean"], json!(0.25));
        assert_eq!(v["eval/rt/reward/mean"], json!(0.5));
        assert_eq!(serde_json::from_value::<MetricsRow>(v).unwrap(), row);

        let eval_only = MetricsRow { step: 0, rollouts: None, keyed };
        let v = serde_json::to_value(&eval_only).unwrap();
        assert!(v.get("reward/mean").is_none());
        assert_eq!(serde_json::from_value::<MetricsRow>(v).unwrap(), eval_only);
    }

    #[test]
    fn rows_without_the_group_figures_still_read_as_step_rows() {
        let with = MetricsRow {
            step: 2,
            rollouts: Some(RolloutMetrics {
                reward_group_best: Some(0.75),
                groups_uniform: Some(0.5),
                ..RolloutMetrics::default()
            }),
            keyed: BTreeMap::new(),
        };
        let mut v = serde_json::to_value(&with).unwrap();
        assert_eq!((v["reward/group_best"].clone(), v["groups/uniform"].clone()), (json!(0.75), json!(0.5)));
        assert_eq!(serde_json::from_value::<MetricsRow>(v.clone()).unwrap(), with);
        // A row written before the two existed.
        let obj = v.as_object_mut().unwrap();
        obj.remove("reward/group_best");
        obj.remove("groups/uniform");
        let old = serde_json::from_value::<MetricsRow>(v).unwrap();
        let rollouts = old.rollouts.expect("still a step row");
        assert_eq!((rollouts.reward_group_best, rollouts.groups_uniform), (None, None));
        assert!(old.keyed.is_empty());
    }

    #[test]
    fn sft_rows_write_val_loss_only_when_measured() {
        let row = SftRow { step: 1, loss: 2.0, ..SftRow::default() };
        assert!(serde_json::to_value(&row).unwrap().get("val_loss").is_none());
        let with = SftRow { val_loss: Some(1.5), ..row };
        assert_eq!(serde_json::from_value::<SftRow>(serde_json::to_value(&with).unwrap()).unwrap(), with);
    }
}
