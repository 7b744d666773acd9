//! Online evaluation: every `eval.interval` steps (an env's own `interval` when set), each eval
//! env's held-out examples are sampled `k` times with the current policy; reported as mean reward, avg@k and unbiased pass@j for j = 1, 2,
//! 4, ... <= k (an example counts as solved by a sample whose reward is at least 1), and for
//! multi-turn envs with turn rewards the mean and solved fraction of each turn. A multi-agent env's
//! traces are its members' (no sample "solves" an example): its members' mean rewards instead of
//! avg@k and pass@k.

use std::time::Instant;

use serde_json::{Map, Value, json};

use crate::dispatch::{Dispatch, GroupJob};
use crate::envs::EvalEnv;
use crate::error::Result;
use crate::policy::PolicyVersion;

/// Reward at or above which a sample solves its example (for pass@k).
pub const SOLVED: f64 = 1.0 - 1e-9;

/// Unbiased pass@k of one example with `n` samples of which `c` are correct:
/// 1 - C(n - c, k) / C(n, k), computed as a product to stay exact for small numbers.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if k == 0 || k > n {
        return f64::NAN;
    }
    if n - c < k {
        return 1.0;
    }
    let mut fail = 1.0;
    for i in (n - c + 1)..=n {
        fail *= 1.0 - k as f64 / i as f64;
    }
    1.0 - fail
}

/// The metrics of one eval env from the rewards of each example's samples (avg@k and pass@k only
/// where each sample `solves`, i.e. is one attempt at the example).
pub fn eval_metrics(name: &str, per_example: &[Vec<f64>], errors: usize, solves: bool) -> Map<String, Value> {
    let mut m = Map::new();
    let all: Vec<f64> = per_example.iter().flatten().copied().collect();
    let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    let k = per_example.iter().map(Vec::len).min().unwrap_or(0);
    m.insert(format!("eval/{name}/reward/mean"), json!(mean(&all)));
    m.insert(format!("eval/{name}/examples"), json!(per_example.len()));
    m.insert(format!("eval/{name}/errors"), json!(errors));
    if k > 0 && solves {
        let avg: Vec<f64> = per_example.iter().map(|r| mean(&r[..k])).collect();
        m.insert(format!("eval/{name}/avg@{k}"), json!(mean(&avg)));
        let mut j = 1;
        while j <= k {
            let p: Vec<f64> =
                per_example.iter().map(|r| pass_at_k(r.len(), r.iter().filter(|x| **x >= SOLVED).count(), j)).collect();
            m.insert(format!("eval/{name}/pass@{j}"), json!(mean(&p)));
            j *= 2;
        }
    }
    m
}

/// Per model turn of multi-turn episodes whose env reports turn rewards (`Trace.turn_rewards`):
/// `eval/<env>/turn/<k>/reward` (mean reward of turn k, 1-based, over the episodes that reached
/// it), `.../solved` (the fraction of them scoring >= `SOLVED`) and `.../episodes`. Where the
/// reward of a multi-turn eval is won or lost; nothing where no episode has a second turn.
pub(crate) fn turn_metrics(name: &str, episodes: &[&[f64]]) -> Map<String, Value> {
    let mut m = Map::new();
    let turns = episodes.iter().map(|t| t.len()).max().unwrap_or(0);
    if turns < 2 {
        return m;
    }
    for k in 0..turns {
        let at_k: Vec<f64> = episodes.iter().filter_map(|t| t.get(k).copied()).collect();
        let n = at_k.len() as f64;
        let key = |what: &str| format!("eval/{name}/turn/{}/{what}", k + 1);
        m.insert(key("reward"), json!(at_k.iter().sum::<f64>() / n));
        m.insert(key("solved"), json!(at_k.iter().filter(|r| **r >= SOLVED).count() as f64 / n));
        m.insert(key("episodes"), json!(at_k.len()));
    }
    m
}

/// Means over the evaluated traces of each reward function's score (`eval/<env>/reward/<fn>`) and
/// each metric (`eval/<env>/metric/<name>`), as training rows carry them per env.
pub(crate) fn component_metrics(name: &str, traces: &[&rl_serve::pb::Trace]) -> Map<String, Value> {
    let mut sums: std::collections::BTreeMap<String, (f64, usize)> = std::collections::BTreeMap::new();
    for t in traces {
        let scores = t.rewards.iter().map(|(k, r)| (format!("eval/{name}/reward/{k}"), r.score));
        let metrics = t.metrics.iter().map(|(k, v)| (format!("eval/{name}/metric/{k}"), *v));
        for (key, value) in scores.chain(metrics).filter(|(_, v)| v.is_finite()) {
            let entry = sums.entry(key).or_default();
            entry.0 += value;
            entry.1 += 1;
        }
    }
    sums.into_iter().map(|(k, (sum, n))| (k, json!(sum / n as f64))).collect()
}

/// Each member's mean reward over the evaluated traces (`eval/<env>/reward/member/<member>`).
pub(crate) fn member_rewards(name: &str, traces: &[&rl_serve::pb::Trace]) -> Map<String, Value> {
    let mut sums: std::collections::BTreeMap<&str, (f64, usize)> = std::collections::BTreeMap::new();
    for t in traces {
        let entry = sums.entry(t.member_id.as_str()).or_default();
        entry.0 += t.reward;
        entry.1 += 1;
    }
    sums.into_iter().map(|(m, (sum, n))| (format!("eval/{name}/reward/member/{m}"), json!(sum / n as f64))).collect()
}

/// What an evaluation measured, and its rollouts for the traces file.
pub(crate) struct Evaluated {
    /// `eval/<env>/...` metrics.
    pub metrics: Map<String, Value>,
    /// Every rollout that came back, with its env's name, in example order.
    pub traces: Vec<(String, rl_serve::pb::Trace)>,
    /// The policy version they were sampled with.
    pub policy_version: u64,
}

/// Evaluates every eval env with the policy version loaded now: each of its first `examples`
/// tasks `k` times, as one dispatch.
pub(crate) async fn evaluate(
    envs: &[&EvalEnv],
    dispatch: Dispatch<'_>,
    policy: &mut PolicyVersion,
) -> Result<Evaluated> {
    let mut out = Map::new();
    let mut all_traces = Vec::new();
    for e in envs {
        let started = Instant::now();
        let jobs: Vec<GroupJob<'_>> = (0..e.examples)
            .map(|index| GroupJob {
                env_name: &e.name,
                client: &e.client,
                split: &e.split,
                index,
                group_size: e.k,
                sampling: &e.sampling,
            })
            .collect();
        let collected = dispatch.run(&jobs, policy).await?;
        // A failed example is reported (`errors`, `dropped`), never fatal: the rest are evaluated.
        let per_example: Vec<Vec<f64>> = collected
            .groups
            .iter()
            .filter(|(traces, _)| !traces.is_empty())
            .map(|(traces, _)| traces.iter().map(|(_, t)| t.reward).collect())
            .collect();
        let traces: Vec<&rl_serve::pb::Trace> =
            collected.groups.iter().flat_map(|(traces, _)| traces.iter().map(|(_, t)| t)).collect();
        let multi_agent = traces.iter().any(|t| !t.member_id.is_empty());
        out.extend(eval_metrics(
            &e.name,
            &per_example,
            collected.retried.values().sum::<usize>() + collected.dropped_total(),
            !multi_agent,
        ));
        if multi_agent {
            out.extend(member_rewards(&e.name, &traces));
        }
        let turns: Vec<&[f64]> = collected
            .groups
            .iter()
            .flat_map(|(traces, _)| traces.iter().map(|(_, t)| t.turn_rewards.as_slice()))
            .collect();
        out.extend(turn_metrics(&e.name, &turns));
        for (key, value) in component_metrics(&e.name, &traces) {
            // `reward/mean` is the total's; a reward function of that name keeps the total's key.
            out.entry(key).or_insert(value);
        }
        out.insert(format!("eval/{}/dropped", e.name), json!(collected.dropped_total()));
        out.insert(format!("eval/{}/policy_version", e.name), json!(policy.get()));
        out.insert(format!("eval/{}/time_s", e.name), json!(started.elapsed().as_secs_f64()));
        all_traces
            .extend(collected.groups.into_iter().flat_map(|(traces, _)| traces).map(|(_, t)| (e.name.clone(), t)));
    }
    Ok(Evaluated { metrics: out, traces: all_traces, policy_version: policy.get() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_matches_the_combinatorial_formula() {
        // n = 4, c = 1: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6.
        assert!((pass_at_k(4, 1, 1) - 0.25).abs() < 1e-12);
        assert!((pass_at_k(4, 1, 2) - 0.5).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 0, 4), 0.0);
        assert_eq!(pass_at_k(4, 3, 2), 1.0, "fewer failures than draws: always solved");
        // n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!((pass_at_k(5, 2, 2) - 0.7).abs() < 1e-12);
        assert!(pass_at_k(2, 1, 3).is_nan());
    }

    #[test]
    fn eval_metrics_by_hand() {
        let per_example = vec![vec![1.0, 0.0, 0.0, 0.0], vec![0.5, 0.5, 1.0, 1.0]];
        let m = eval_metrics("rt", &per_example, 0, true);
        assert_eq!(m["eval/rt/reward/mean"], json!(0.5));
        assert_eq!(m["eval/rt/avg@4"], json!(0.5));
        // Example 1: pass@1 1/4, example 2: 2/4 -> 0.375. pass@2: (0.5 + (1 - 1/6)) / 2.
        assert_eq!(m["eval/rt/pass@1"], json!(0.375));
        assert!((m["eval/rt/pass@2"].as_f64().unwrap() - (0.5 + 5.0 / 6.0) / 2.0).abs() < 1e-12);
        assert_eq!(m["eval/rt/pass@4"], json!(1.0), "with 4 draws of 4 samples any correct one is drawn");
        assert!(!m.contains_key("eval/rt/pass@8"));
        // Members' traces are not attempts: no avg@k or pass@k, and each member's mean reward.
        let m = eval_metrics("debate", &per_example, 0, false);
        assert_eq!(m["eval/debate/reward/mean"], json!(0.5));
        assert!(!m.keys().any(|k| k.contains("pass@") || k.contains("avg@")), "{m:?}");
        let trace =
            |member: &str, reward| rl_serve::pb::Trace { member_id: member.into(), reward, ..Default::default() };
        let traces = [trace("a", 1.0), trace("b", -1.0), trace("a", 0.0)];
        let m = member_rewards("debate", &traces.iter().collect::<Vec<_>>());
        assert_eq!(
            (m["eval/debate/reward/member/a"].clone(), m["eval/debate/reward/member/b"].clone()),
            (json!(0.5), json!(-1.0))
        );
    }

    #[test]
    fn reward_functions_and_metrics_are_averaged_per_key() {
        use rl_serve::pb;
        let trace = |a: f64, b: Option<f64>, turns: f64| {
            let mut t = pb::Trace::default();
            t.rewards.insert(String::from("correct"), pb::RewardValue { score: a, weight: 1.0 });
            if let Some(b) = b {
                t.rewards.insert(String::from("format"), pb::RewardValue { score: b, weight: 0.2 });
            }
            t.metrics.insert(String::from("num_turns"), turns);
            t
        };
        let (x, y) = (trace(1.0, Some(0.5), 2.0), trace(0.0, None, 4.0));
        let m = component_metrics("math", &[&x, &y]);
        assert_eq!(m["eval/math/reward/correct"], json!(0.5));
        assert_eq!(m["eval/math/reward/format"], json!(0.5), "over the traces that have it");
        assert_eq!(m["eval/math/metric/num_turns"], json!(3.0));
    }

    #[test]
    fn turn_metrics_by_hand() {
        // Three episodes: one turn (1.0), two turns (0.5, 1.0), three turns (0.0, 0.2, 0.4).
        let eps: [&[f64]; 3] = [&[1.0], &[0.5, 1.0], &[0.0, 0.2, 0.4]];
        let m = turn_metrics("as", &eps);
        assert_eq!(m["eval/as/turn/1/reward"], json!(0.5));
        assert_eq!(m["eval/as/turn/1/solved"], json!(1.0 / 3.0));
        assert_eq!(m["eval/as/turn/1/episodes"], json!(3));
        assert_eq!(m["eval/as/turn/2/reward"], json!(0.6));
        assert_eq!(m["eval/as/turn/2/solved"], json!(0.5));
        assert_eq!(m["eval/as/turn/3/reward"], json!(0.4));
        assert_eq!(m["eval/as/turn/3/episodes"], json!(1));
        assert_eq!(m.len(), 9);
        // Envs without turn rewards, or with one turn only, add nothing.
        assert!(turn_metrics("rt", &[&[], &[]]).is_empty());
        assert!(turn_metrics("rt", &[&[1.0], &[0.0]]).is_empty());
    }
}
