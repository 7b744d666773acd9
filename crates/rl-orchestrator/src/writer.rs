//! What a step leaves in the run directory besides metrics: the training batch the trainer reads
//! and the traces as text for people (`RunDir::batch`, `RunDir::traces`, `RunDir::eval_traces`),
//! each written atomically.

use prost::Message;
use rl_proto::train::v1::TrainBatch;
use rl_run::RunDir;
use rl_run::write_atomic;
use rl_serve::pb::Trace;
use serde_json::{Map, Value, json};

use crate::error::Result;
use crate::rollout::Group;

/// Writes the batch of `batch.step`.
pub fn write_batch(run: &RunDir, batch: &TrainBatch) -> Result<std::path::PathBuf> {
    let path = run.batch(batch.step);
    write_atomic(&path, &batch.encode_to_vec())?;
    Ok(path)
}

/// Writes the step's traces: one line per rollout (env, task, member, reward, reward components,
/// the messages as text, errors), for reading what the policy did.
pub fn write_traces(run: &RunDir, step: u64, groups: &[Group], env_names: &[String]) -> Result<()> {
    let lines = groups
        .iter()
        .flat_map(|g| g.rollouts.iter().map(|r| trace_line(&env_names[g.env], &r.trace, g.policy_version)));
    write_lines(&run.traces(step), lines)
}

/// Writes the traces of the evaluation at `step` (`(env name, trace)` pairs, all sampled with
/// `policy_version`), in the training traces' format.
pub fn write_eval_traces<'a>(
    run: &RunDir,
    step: u64,
    traces: impl IntoIterator<Item = (&'a str, &'a Trace)>,
    policy_version: u64,
) -> Result<std::path::PathBuf> {
    let path = run.eval_traces(step);
    write_lines(&path, traces.into_iter().map(|(env, t)| trace_line(env, t, policy_version)))?;
    Ok(path)
}

fn write_lines(path: &std::path::Path, lines: impl Iterator<Item = Value>) -> Result<()> {
    let mut out = String::new();
    for line in lines {
        out.push_str(&line.to_string());
        out.push('\n');
    }
    write_atomic(path, out.as_bytes())?;
    Ok(())
}

/// One rollout as a line of a traces file.
fn trace_line(env: &str, t: &Trace, policy_version: u64) -> Value {
    let messages: Vec<Value> = t
        .nodes
        .iter()
        .map(|n| {
            let mut m = json!({"role": n.role, "content": n.content});
            if !n.tool_calls.is_empty() {
                m["tool_calls"] =
                    n.tool_calls.iter().map(|c| json!({"name": c.name, "arguments": c.arguments})).collect();
            }
            m
        })
        .collect();
    let rewards: Map<String, Value> = t.rewards.iter().map(|(k, r)| (k.clone(), json!(r.score))).collect();
    let mut line = json!({
        "env": env, "task": t.task_key, "member": t.member_id, "reward": t.reward,
        "rewards": rewards, "stop": t.stop_condition, "truncated": t.is_truncated,
        "policy_version": policy_version,
        "errors": t.errors.iter().map(|x| x.message.clone()).collect::<Vec<_>>(),
        "reward_errors": t.reward_errors.iter().map(|e| json!({"name": e.name, "message": e.message})).collect::<Vec<_>>(),
        "messages": messages,
    });
    if !t.turn_rewards.is_empty() {
        line["turn_rewards"] = json!(t.turn_rewards);
    }
    line
}
