//! Running one multi-agent episode: slot by slot, every member of the slot samples on its own view
//! (concurrently for simultaneous slots), the kernel commits the slot only when all replies are in,
//! and the finished log is scored with `MARScore`. One trace per member, tagged with its id.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use futures::future::join_all;
use rl_configs::Temperature;
use rl_proto::env::v1 as pb;

use crate::episode::RolloutRequest;
use crate::error::Error;
use crate::model_client::ModelClient;
use crate::multi_agent::{Kernel, MultiAgent, Turn};
use crate::rollout::new_id;
use crate::trace::TraceBuilder;
use crate::types::ModelRuntime;

/// Runs and scores one multi-agent episode; `models` are the request's extra model runtimes
/// (members whose model key is not found there, or is `policy`, sample with the actor).
pub async fn run_multi_agent_episode(
    ma: &dyn MultiAgent,
    client: &ModelClient,
    req: RolloutRequest<'_>,
    models: &BTreeMap<String, ModelRuntime>,
) -> pb::Episode {
    let start = Instant::now();
    let task = req.task;
    let members = ma.members(task);
    let mut errors: Vec<pb::TraceError> = Vec::new();
    let mut builders: BTreeMap<String, TraceBuilder> =
        members.iter().map(|m| (m.clone(), TraceBuilder::default())).collect();
    let mut turns: BTreeMap<String, u32> = BTreeMap::new();
    let instructions: BTreeMap<String, _> = members.iter().map(|m| (m.clone(), ma.instructions(task, m))).collect();
    let runtime = |m: &str| -> &ModelRuntime { ma.member_model(m).and_then(|k| models.get(&k)).unwrap_or(req.actor) };
    let mut kernel = match Kernel::new(members.clone(), ma.schedule(task)) {
        Ok(k) => Some(k),
        Err(e) => {
            errors.push(Error::Env(e.to_string()).to_trace_error());
            None
        }
    };
    let seed = req.actor.sampling.seed.map(|s| s.wrapping_add(u64::from(req.index)));
    // Every member's calls carry the episode's id as their session (one conversation, one replica).
    let episode_id = new_id();
    while let Some(k) = kernel.as_mut().filter(|k| !k.done() && errors.is_empty()) {
        let slot: Vec<String> = k.current().map(<[String]>::to_vec).unwrap_or_default();
        let views: Vec<_> = slot.iter().map(|m| k.view(m, &instructions[m])).collect();
        let calls = join_all(slot.iter().zip(&views).enumerate().map(|(i, (m, view))| {
            let s = seed.map(|s| s.wrapping_add(((k.slot() as u64) << 32) + i as u64));
            client.chat(runtime(m), view, &[], s, 1, Some(episode_id.as_str()))
        }))
        .await;
        // All-or-nothing: a slot with any failed call commits nothing.
        let mut replies = Vec::new();
        for (m, call) in slot.iter().zip(calls) {
            match call {
                Ok(r) => match r.choices.into_iter().next() {
                    Some(choice) => replies.push((m, r.prompt_token_ids, choice)),
                    None => errors
                        .push(Error::InvalidModelResponse(format!("no choices for member `{m}`")).to_trace_error()),
                },
                Err(e) => errors.push(e.to_trace_error()),
            }
        }
        if !errors.is_empty() {
            break;
        }
        for ((m, prompt_ids, choice), view) in replies.into_iter().zip(&views) {
            let builder = builders.get_mut(m).expect("a builder per member");
            builder.add_turn(view, prompt_ids.as_deref(), &choice);
            if Turn::new(m, &choice.message.content).parse_error
                && let Some(node) = builder.nodes.last_mut()
            {
                node.parse_error = true;
            }
            *turns.entry(m.clone()).or_default() += 1;
            if let Err(e) = k.submit(m, &choice.message.content) {
                errors.push(Error::Env(e.to_string()).to_trace_error());
                break;
            }
        }
    }
    let score = match (&kernel, errors.is_empty()) {
        (Some(k), true) => {
            match ma
                .score(task, k.log(), req.training_context.map(|c| &c.decoded))
                .await
                .and_then(|s| s.validate(&members).map(|()| s))
            {
                Ok(s) => Some(s),
                Err(e) => {
                    errors.push(e.to_trace_error());
                    None
                }
            }
        }
        _ => None,
    };
    let total_s = start.elapsed().as_secs_f64();
    let episode_metrics: HashMap<String, f64> =
        score.as_ref().map(|s| s.metrics.iter().map(|(k, v)| (k.clone(), *v)).collect()).unwrap_or_default();
    let traces = members
        .iter()
        .map(|m| {
            let n = turns.get(m).copied().unwrap_or(0);
            // Every member's trace carries the episode's metrics, so per-env means (which count
            // traces) weigh each episode alike and the orchestrator's tallies see them.
            let mut metrics = episode_metrics.clone();
            metrics.insert(String::from("num_turns"), f64::from(n));
            pb::Trace {
                id: new_id(),
                member_id: m.clone(),
                nodes: builders.remove(m).map(|b| b.nodes).unwrap_or_default(),
                reward: score.as_ref().and_then(|s| s.rewards.get(m).copied()).unwrap_or(0.0),
                metrics,
                stop_condition: String::from(if errors.is_empty() { "env_done" } else { "error" }),
                errors: errors.clone(),
                timing: Some(pb::Timing { total_s, ..Default::default() }),
                num_turns: n,
                scored_with: req.training_context.map(|c| c.wire.clone()),
                task_json: task.data.to_string(),
                task_key: task.key.clone(),
                sampling_temperature: runtime(m).sampling.temperature.map(Temperature::value),
                ..Default::default()
            }
        })
        .collect();
    pb::Episode {
        id: episode_id,
        task_key: task.key.clone(),
        traces,
        errors,
        metrics: score.map(|s| s.metrics.into_iter().collect()).unwrap_or_default(),
    }
}
