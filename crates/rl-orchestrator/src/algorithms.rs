//! The algorithm registry: each algorithm turns a group of traces into per-branch channels
//! (`values` + `mask` for one loss: rl advantages or ce weights). Channels of the same loss are
//! summed; dimensions are checked against each branch's tokens. Trace-level algorithms live here;
//! model-scored (`opd`, `opsd`) and env-owned ones in `scoring`.

use rl_configs::{AlgorithmConfig, BuiltinAlgorithm, EchoRole, LossChannel};
use rl_serve::{branches, pb};

use crate::error::{Error, Result};

/// One algorithm's output for one branch of a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    /// Which branch of the trace (index into `branches(trace)`).
    pub branch: usize,
    /// Which trainer loss it feeds.
    pub loss: LossChannel,
    /// Per-token values (advantages for rl, weights for ce).
    pub values: Vec<f32>,
    /// Per-token: where the values apply.
    pub mask: Vec<bool>,
}

/// A configured algorithm. The trace-level ones (`grpo`, `max_rl`, `rl`, `sft`, `echo`) are computed
/// here; `opd`, `opsd` and env-owned ones need a model or an env server (see `scoring`).
#[derive(Debug, Clone, PartialEq)]
pub enum Algorithm {
    /// A = r - mean(r) over the group's clean traces.
    Grpo,
    /// A = (r - m) / m with m the clean mean, 0 when m <= 0.
    MaxRl,
    /// A = r.
    Rl,
    /// ce weight 1 on the (frozen) actor's sampled tokens.
    Sft,
    /// grpo plus ce weight `alpha` on observation tokens of `roles` after the first sampled turn.
    Echo {
        /// ce weight.
        alpha: f32,
        /// Roles whose (non-sampled) messages are trained: `tool`, `user`.
        roles: Vec<String>,
    },
    /// Per-token advantage: reference logprob (model `model`) minus inference logprob.
    Opd {
        /// Scoring model key.
        model: String,
        /// Most scoring requests in flight.
        max_concurrent: usize,
    },
    /// Like opd, but the scorer sees a demonstration hint before the branch.
    Opsd {
        /// Scoring model key (`policy`: the trained model).
        model: String,
        /// Task field holding the demonstration.
        demo_key: String,
        /// Hint template with `{demonstration}`.
        template: String,
        /// Most scoring requests in flight.
        max_concurrent: usize,
    },
    /// Multi-agent EMA baseline per (env, example, member), updated then subtracted; its state
    /// lives in the orchestrator (see [`rae_channels`]).
    Rae {
        /// EMA momentum.
        momentum: f64,
        /// Drop the judge member's trajectories from training.
        drop_judge: bool,
    },
    /// Unknown to the orchestrator: run by the env server through `RunAlgorithms`.
    EnvOwned {
        /// The id the env server knows.
        id: String,
        /// Its fields as JSON.
        fields_json: String,
    },
}

impl Algorithm {
    /// The algorithm for a config entry; unbuilt ones are refused loudly, not skipped.
    pub fn from_config(cfg: &AlgorithmConfig) -> Result<Self> {
        Ok(match cfg {
            AlgorithmConfig::Builtin(b) => match b {
                BuiltinAlgorithm::Grpo {} => Algorithm::Grpo,
                BuiltinAlgorithm::MaxRl {} => Algorithm::MaxRl,
                BuiltinAlgorithm::Rl {} => Algorithm::Rl,
                BuiltinAlgorithm::Sft {} => Algorithm::Sft,
                BuiltinAlgorithm::Echo { alpha, roles } => Algorithm::Echo {
                    alpha: *alpha as f32,
                    roles: roles
                        .iter()
                        .map(|r| match r {
                            EchoRole::Tool => String::from("tool"),
                            EchoRole::User => String::from("user"),
                        })
                        .collect(),
                },
                BuiltinAlgorithm::Opd { model, max_concurrent } => {
                    Algorithm::Opd { model: model.clone(), max_concurrent: *max_concurrent as usize }
                }
                BuiltinAlgorithm::Opsd { model, demo_key, template, max_concurrent } => Algorithm::Opsd {
                    model: model.clone(),
                    demo_key: demo_key.clone(),
                    template: template.clone(),
                    max_concurrent: *max_concurrent as usize,
                },
                BuiltinAlgorithm::Rae { momentum, drop_judge } => {
                    Algorithm::Rae { momentum: *momentum, drop_judge: *drop_judge }
                }
            },
            AlgorithmConfig::EnvOwned { id, fields } => Algorithm::EnvOwned {
                id: id.clone(),
                fields_json: serde_json::Value::Object(fields.clone().into_iter().collect()).to_string(),
            },
        })
    }

    /// The id.
    pub fn id(&self) -> &str {
        match self {
            Algorithm::Grpo => "grpo",
            Algorithm::MaxRl => "max_rl",
            Algorithm::Rl => "rl",
            Algorithm::Sft => "sft",
            Algorithm::Echo { .. } => "echo",
            Algorithm::Opd { .. } => "opd",
            Algorithm::Opsd { .. } => "opsd",
            Algorithm::Rae { .. } => "rae",
            Algorithm::EnvOwned { id, .. } => id,
        }
    }

    /// Trace-level advantage of each trace (`None` for traces with errors, and for algorithms
    /// without a trace-level advantage).
    pub fn advantages(&self, traces: &[pb::Trace]) -> Vec<Option<f64>> {
        let clean: Vec<f64> = traces.iter().filter(|t| t.errors.is_empty()).map(|t| t.reward).collect();
        let mean = if clean.is_empty() { 0.0 } else { clean.iter().sum::<f64>() / clean.len() as f64 };
        traces
            .iter()
            .map(|t| {
                if !t.errors.is_empty() {
                    return None;
                }
                match self {
                    Algorithm::Grpo | Algorithm::Echo { .. } => Some(t.reward - mean),
                    Algorithm::MaxRl if mean > 0.0 => Some((t.reward - mean) / mean),
                    Algorithm::MaxRl => Some(0.0),
                    Algorithm::Rl => Some(t.reward),
                    _ => None,
                }
            })
            .collect()
    }

    /// Channels per trace of the trace-level algorithms; `None` for those that need a model or an
    /// env server.
    pub fn local_channels(&self, traces: &[pb::Trace]) -> Option<Vec<Vec<Channel>>> {
        match self {
            Algorithm::Grpo | Algorithm::MaxRl | Algorithm::Rl => Some(
                traces
                    .iter()
                    .zip(self.advantages(traces))
                    .map(|(t, a)| a.map_or_else(Vec::new, |a| sampled(t, a as f32, LossChannel::Rl)))
                    .collect(),
            ),
            Algorithm::Sft => Some(
                traces
                    .iter()
                    .map(|t| if t.errors.is_empty() { sampled(t, 1.0, LossChannel::Ce) } else { Vec::new() })
                    .collect(),
            ),
            Algorithm::Echo { alpha, roles } => Some(
                traces
                    .iter()
                    .zip(self.advantages(traces))
                    .map(|(t, a)| match a {
                        None => Vec::new(),
                        Some(a) => {
                            let mut chans = sampled(t, a as f32, LossChannel::Rl);
                            chans.extend(observations(t, *alpha, roles));
                            chans
                        }
                    })
                    .collect(),
            ),
            Algorithm::Opd { .. } | Algorithm::Opsd { .. } | Algorithm::Rae { .. } | Algorithm::EnvOwned { .. } => None,
        }
    }
}

/// RAE (SPIRAL Algorithm 1): for each clean trace in order, the baseline of its (example, member)
/// is first updated, `b = momentum * b + (1 - momentum) * r`, then subtracted, `A = r - b`.
/// `baselines` holds one env's state keyed `task_key|member_id` (cold start: 0). The judge's
/// traces get no channel when `judge` is given (dropped from training).
pub fn rae_channels(
    baselines: &mut std::collections::BTreeMap<String, f64>,
    traces: &[pb::Trace],
    momentum: f64,
    judge: Option<&str>,
) -> Vec<Vec<Channel>> {
    traces
        .iter()
        .map(|t| {
            if !t.errors.is_empty() || judge.is_some_and(|j| j == t.member_id) {
                return Vec::new();
            }
            let b = baselines.entry(format!("{}|{}", t.task_key, t.member_id)).or_insert(0.0);
            *b = momentum * *b + (1.0 - momentum) * t.reward;
            sampled(t, (t.reward - *b) as f32, LossChannel::Rl)
        })
        .collect()
}

/// `value` on every sampled token of every branch, for one loss.
fn sampled(trace: &pb::Trace, value: f32, loss: LossChannel) -> Vec<Channel> {
    branches(trace)
        .into_iter()
        .enumerate()
        .map(|(i, b)| Channel {
            branch: i,
            loss,
            values: b.mask.iter().map(|m| if *m { value } else { 0.0 }).collect(),
            mask: b.mask,
        })
        .collect()
}

/// echo's ce channel: `alpha` on the tokens of non-sampled messages of `roles` that come after the
/// branch's first sampled message (the prompt itself is never trained).
fn observations(trace: &pb::Trace, alpha: f32, roles: &[String]) -> Vec<Channel> {
    branches(trace)
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let mut mask = Vec::with_capacity(b.token_ids.len());
            let mut seen_sampled = false;
            for &n in &b.nodes {
                let node = &trace.nodes[n];
                let trained = seen_sampled && !node.sampled && roles.contains(&node.role);
                seen_sampled |= node.sampled;
                mask.extend(std::iter::repeat_n(trained, node.token_ids.len()));
            }
            Channel {
                branch: i,
                loss: LossChannel::Ce,
                values: mask.iter().map(|m| if *m { alpha } else { 0.0 }).collect(),
                mask,
            }
        })
        .collect()
}

/// Summed channels of one branch: rl advantages and ce weights (zero where no channel applies).
#[derive(Debug, Clone, PartialEq)]
pub struct BranchTargets {
    /// rl advantages per token.
    pub advantages: Vec<f32>,
    /// Tokens some rl channel applies to.
    pub rl_mask: Vec<bool>,
    /// ce weights per token.
    pub ce_weights: Vec<f32>,
}

/// Checks every channel against its branch and sums channels of the same loss. Tokens of messages
/// flagged `parse_error` (quarantined markup) are masked out of every loss.
/// `outputs[a][t]` is algorithm `a`'s channels for trace `t` (each naming its branch).
pub fn aggregate(ids: &[&str], traces: &[pb::Trace], outputs: &[Vec<Vec<Channel>>]) -> Result<Vec<Vec<BranchTargets>>> {
    let all_branches: Vec<Vec<_>> = traces.iter().map(branches).collect();
    let mut out: Vec<Vec<BranchTargets>> = all_branches
        .iter()
        .map(|bs| {
            bs.iter()
                .map(|b| {
                    let n = b.token_ids.len();
                    BranchTargets { advantages: vec![0.0; n], rl_mask: vec![false; n], ce_weights: vec![0.0; n] }
                })
                .collect()
        })
        .collect();
    for (a, per_trace) in outputs.iter().enumerate() {
        let algorithm = || ids.get(a).copied().unwrap_or("?").to_owned();
        for (t, channels) in per_trace.iter().enumerate() {
            for ch in channels {
                let dims = |tokens: usize| Error::Dimensions {
                    algorithm: algorithm(),
                    trace: t,
                    branch: ch.branch,
                    tokens,
                    values: ch.values.len(),
                    mask: ch.mask.len(),
                };
                let target = out.get_mut(t).and_then(|bs| bs.get_mut(ch.branch)).ok_or_else(|| dims(0))?;
                let n = target.advantages.len();
                if ch.values.len() != n || ch.mask.len() != n {
                    return Err(dims(n));
                }
                if ch.values.iter().any(|v| !v.is_finite()) {
                    return Err(Error::NonFinite { algorithm: algorithm(), trace: t, branch: ch.branch });
                }
                for i in (0..n).filter(|&i| ch.mask[i]) {
                    match ch.loss {
                        LossChannel::Rl => {
                            target.advantages[i] += ch.values[i];
                            target.rl_mask[i] = true;
                        }
                        LossChannel::Ce => target.ce_weights[i] += ch.values[i],
                    }
                }
            }
        }
    }
    for ((trace, bs), targets) in traces.iter().zip(&all_branches).zip(&mut out) {
        for (b, target) in bs.iter().zip(targets) {
            let mut at = 0;
            for &n in &b.nodes {
                let len = trace.nodes[n].token_ids.len();
                if trace.nodes[n].parse_error {
                    for i in at..at + len {
                        target.rl_mask[i] = false;
                        target.advantages[i] = 0.0;
                        target.ce_weights[i] = 0.0;
                    }
                }
                at += len;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(task: &str, member: &str, reward: f64) -> pb::Trace {
        pb::Trace { task_key: task.to_owned(), member_id: member.to_owned(), ..trace(reward, 1, false) }
    }

    #[test]
    fn rae_updates_the_baseline_then_subtracts_it() {
        let mut b = std::collections::BTreeMap::new();
        let adv = |ch: &Vec<Vec<Channel>>, i: usize| ch[i].first().map(|c| c.values[2]);
        // Cold start: b = 0.9 * 0 + 0.1 * 1 = 0.1, A = 0.9.
        let ch = rae_channels(&mut b, &[member("t/0", "a", 1.0)], 0.9, None);
        assert!((adv(&ch, 0).unwrap() - 0.9).abs() < 1e-6);
        // Same (example, member) again with reward 1: b = 0.9 * 0.1 + 0.1 = 0.19, A = 0.81. Another
        // member and another example each start cold.
        let group =
            [member("t/0", "a", 1.0), member("t/0", "b", -1.0), member("t/1", "a", 0.5), member("t/0", "judge", 0.0)];
        let ch = rae_channels(&mut b, &group, 0.9, Some("judge"));
        assert!((adv(&ch, 0).unwrap() - 0.81).abs() < 1e-6);
        assert!((adv(&ch, 1).unwrap() - -0.9).abs() < 1e-6);
        assert!((adv(&ch, 2).unwrap() - 0.45).abs() < 1e-6);
        assert!(ch[3].is_empty(), "the judge is dropped");
        assert!((b["t/0|a"] - 0.19).abs() < 1e-12);
        assert!(!b.contains_key("t/0|judge"));
        // Momentum 0: the baseline is the last reward, so a repeated reward has advantage 0.
        let mut z = std::collections::BTreeMap::new();
        let ch = rae_channels(&mut z, &[member("x", "a", 2.0)], 0.0, None);
        assert_eq!(adv(&ch, 0), Some(0.0));
    }

    fn node(parent: i32, role: &str, tokens: usize, sampled: bool) -> pb::MessageNode {
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

    fn trace(reward: f64, tokens: usize, error: bool) -> pb::Trace {
        pb::Trace {
            reward,
            nodes: vec![node(-1, "user", 2, false), node(0, "assistant", tokens, true)],
            errors: if error {
                vec![pb::TraceError { message: String::from("boom"), ..Default::default() }]
            } else {
                vec![]
            },
            ..Default::default()
        }
    }

    fn local(a: &Algorithm, traces: &[pb::Trace]) -> Vec<Vec<Channel>> {
        a.local_channels(traces).expect("a trace-level algorithm")
    }

    #[test]
    fn builtin_advantages_by_hand() {
        let group = [trace(1.0, 2, false), trace(0.0, 2, false), trace(0.5, 2, false), trace(9.0, 2, true)];
        // Clean rewards 1, 0, 0.5: mean 0.5. The errored trace gets nothing and is not in the mean.
        assert_eq!(Algorithm::Grpo.advantages(&group), vec![Some(0.5), Some(-0.5), Some(0.0), None]);
        assert_eq!(Algorithm::MaxRl.advantages(&group), vec![Some(1.0), Some(-1.0), Some(0.0), None]);
        assert_eq!(Algorithm::Rl.advantages(&group), vec![Some(1.0), Some(0.0), Some(0.5), None]);
        let zero = [trace(0.0, 1, false), trace(0.0, 1, false)];
        assert_eq!(Algorithm::MaxRl.advantages(&zero), vec![Some(0.0), Some(0.0)], "m <= 0 gives 0");
    }

    #[test]
    fn channels_put_the_advantage_on_sampled_tokens_only() {
        let group = [trace(1.0, 3, false), trace(0.0, 3, false)];
        let ch = local(&Algorithm::Grpo, &group);
        assert_eq!(ch[0][0].values, vec![0.0, 0.0, 0.5, 0.5, 0.5]);
        assert_eq!(ch[0][0].mask, vec![false, false, true, true, true]);
        assert_eq!(ch[1][0].values, vec![0.0, 0.0, -0.5, -0.5, -0.5]);
    }

    #[test]
    fn sft_puts_ce_weight_one_on_the_actor_tokens() {
        let group = [trace(0.0, 2, false), trace(1.0, 2, true)];
        let ch = local(&Algorithm::Sft, &group);
        assert_eq!(ch[0][0].loss, LossChannel::Ce);
        assert_eq!(ch[0][0].values, vec![0.0, 0.0, 1.0, 1.0]);
        assert!(ch[1].is_empty(), "a failed rollout is not imitated");
    }

    #[test]
    fn echo_trains_tool_and_user_observations_after_the_first_sampled_turn() {
        // system(1) user(2) assistant(3, sampled) tool(2) user(1) assistant(2, sampled)
        let t = pb::Trace {
            reward: 1.0,
            nodes: vec![
                node(-1, "system", 1, false),
                node(0, "user", 2, false),
                node(1, "assistant", 3, true),
                node(2, "tool", 2, false),
                node(3, "user", 1, false),
                node(4, "assistant", 2, true),
            ],
            ..Default::default()
        };
        let group = [t, trace(0.0, 1, false)];
        let echo = Algorithm::Echo { alpha: 0.1, roles: vec![String::from("tool"), String::from("user")] };
        let ch = local(&echo, &group);
        assert_eq!(ch[0].len(), 2, "one rl and one ce channel for the single branch");
        let (rl, ce) = (&ch[0][0], &ch[0][1]);
        assert_eq!((rl.loss, ce.loss), (LossChannel::Rl, LossChannel::Ce));
        assert_eq!(rl.values, vec![0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.5, 0.5], "grpo: 1 - 0.5");
        // The first user turn is the prompt (before any sampled turn): not trained. The tool result
        // and the later user feedback are.
        assert_eq!(ce.values, vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.1, 0.0, 0.0]);
        let tool_only = Algorithm::Echo { alpha: 0.1, roles: vec![String::from("tool")] };
        let ce = &local(&tool_only, &group)[0][1];
        assert_eq!(ce.values, vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.1, 0.1, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn same_loss_channels_sum_and_bad_dimensions_are_errors() {
        let group = [trace(1.0, 2, false), trace(0.0, 2, false)];
        let grpo = local(&Algorithm::Grpo, &group);
        let rl = local(&Algorithm::Rl, &group);
        let ce = vec![
            vec![Channel {
                branch: 0,
                loss: LossChannel::Ce,
                values: vec![0.3; 4],
                mask: vec![true, true, false, false],
            }],
            vec![],
        ];
        let agg = aggregate(&["grpo", "rl", "echo"], &group, &[grpo.clone(), rl, ce]).unwrap();
        assert_eq!(agg[0][0].advantages, vec![0.0, 0.0, 1.5, 1.5], "grpo 0.5 + rl 1.0");
        assert_eq!(agg[0][0].ce_weights, vec![0.3, 0.3, 0.0, 0.0]);
        assert_eq!(agg[1][0].advantages, vec![0.0, 0.0, -0.5, -0.5]);
        let bad =
            vec![vec![Channel { branch: 0, loss: LossChannel::Rl, values: vec![1.0; 3], mask: vec![true; 3] }], vec![]];
        let err = aggregate(&["grpo", "broken"], &group, &[grpo.clone(), bad]).unwrap_err();
        assert!(err.to_string().contains("`broken`") && err.to_string().contains("4 tokens"), "{err}");
        let no_branch =
            vec![vec![Channel { branch: 3, loss: LossChannel::Rl, values: vec![1.0; 4], mask: vec![true; 4] }], vec![]];
        assert!(aggregate(&["grpo", "broken"], &group, &[grpo.clone(), no_branch]).is_err());
        let nan = vec![
            vec![Channel { branch: 0, loss: LossChannel::Rl, values: vec![f32::NAN; 4], mask: vec![true; 4] }],
            vec![],
        ];
        assert!(aggregate(&["grpo", "nan"], &group, &[grpo, nan]).unwrap_err().to_string().contains("non-finite"));
    }

    #[test]
    fn parse_error_messages_are_masked_out_of_every_loss() {
        let mut t = trace(1.0, 2, false);
        t.nodes.push(pb::MessageNode { parse_error: true, ..node(1, "assistant", 2, true) });
        let group = [t, trace(0.0, 4, false)];
        let agg = aggregate(&["grpo"], &group, &[local(&Algorithm::Grpo, &group)]).unwrap();
        assert_eq!(agg[0][0].rl_mask, vec![false, false, true, true, false, false]);
    }

    #[test]
    fn unknown_ids_are_env_owned() {
        assert_eq!(Algorithm::from_config(&AlgorithmConfig::from_id("grpo")).unwrap(), Algorithm::Grpo);
        let owned = Algorithm::from_config(&AlgorithmConfig::from_id("rloo")).unwrap();
        assert_eq!(owned, Algorithm::EnvOwned { id: String::from("rloo"), fields_json: String::from("{}") });
        assert!(Algorithm::Opd { model: String::from("ref"), max_concurrent: 32 }.local_channels(&[]).is_none());
    }
}
