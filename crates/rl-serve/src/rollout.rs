//! Running episodes: the turn loop against the actor model, stop conditions, scoring with the
//! request's training context, and assembling the wire trace.

use std::collections::BTreeMap;
use std::time::Instant;

use rl_configs::Temperature;
use rl_proto::env::v1 as pb;

use crate::env::{EnvReply, Environment};
use crate::episode::{RolloutRequest, State};
use crate::error::Error;
use crate::model_client::ModelClient;
use crate::rubric::ScoringContext;
use crate::trace::TraceBuilder;
use crate::types::tool_spec;

/// Runs one single-agent episode and scores it. Model and env failures are recorded on the trace.
pub async fn run_episode(env: &dyn Environment, models: &ModelClient, req: RolloutRequest<'_>) -> pb::Trace {
    let start = Instant::now();
    let mut model_s = 0.0;
    let tools = env.tools(req.task);
    let max_turns = env.max_turns(req.task);
    let mut builder = TraceBuilder::default();
    let mut state = State::default();
    let mut errors = Vec::new();
    let mut stop = String::from("max_turns");
    let mut truncated = false;
    match env.prompt(req.task).await {
        Ok(prompt) => state.messages = prompt,
        Err(e) => {
            errors.push(e.to_trace_error());
            stop = String::from("error");
        }
    }
    let seed = req.actor.sampling.seed.map(|s| s.wrapping_add(u64::from(req.index)));
    let id = new_id();
    while errors.is_empty() && state.turns < max_turns {
        let call = Instant::now();
        let turn_seed = seed.map(|s| s.wrapping_add(u64::from(state.turns) << 32));
        let response = models.chat(req.actor, &state.messages, &tools, turn_seed, 1, Some(id.as_str())).await;
        model_s += call.elapsed().as_secs_f64();
        let response = match response {
            Ok(r) => r,
            // The conversation outgrew the context after some turns: the episode ends there and is
            // kept (as verifiers does), its turns scored and trained. Without any turn there is
            // nothing to keep: that is an error.
            Err(Error::OverlongPrompt(_)) if state.turns > 0 => {
                stop = String::from("prompt_too_long");
                break;
            }
            Err(e) => {
                errors.push(e.to_trace_error());
                stop = String::from(if matches!(e, Error::OverlongPrompt(_)) { "context_length" } else { "error" });
                break;
            }
        };
        let Some(choice) = response.choices.into_iter().next() else { break };
        builder.add_turn(&state.messages, response.prompt_token_ids.as_deref(), &choice);
        truncated = choice.finish_reason == "length";
        state.messages.push(choice.message);
        state.turns += 1;
        match env.env_response(req.task, &mut state).await {
            Ok(EnvReply::Done) => {
                stop = String::from("env_done");
                break;
            }
            Ok(EnvReply::Continue(replies)) => {
                if state.turns >= max_turns {
                    builder.add_trailing(&replies);
                    state.messages.extend(replies);
                    break;
                }
                state.messages.extend(replies);
            }
            Err(e) => {
                errors.push(e.to_trace_error());
                stop = String::from("error");
            }
        }
    }
    let scoring = Instant::now();
    let (rewards, metrics, reward_errors, turn_rewards) = if errors.is_empty() {
        let ctx = ScoringContext {
            task: req.task,
            messages: &state.messages,
            state: &state,
            training_context: req.training_context.map(|c| &c.decoded),
            models: req.models,
            client: Some(models),
        };
        let scores = env.rubric().score(&ctx).await;
        let rewards: BTreeMap<String, pb::RewardValue> = scores
            .rewards
            .iter()
            .map(|(k, (score, weight))| (k.clone(), pb::RewardValue { score: *score, weight: *weight }))
            .collect();
        let errors = scores
            .errors
            .iter()
            .map(|(name, message)| pb::RewardError { name: name.clone(), message: message.clone() })
            .collect();
        (rewards, scores.metrics, errors, scores.turns.unwrap_or_default())
    } else {
        (BTreeMap::new(), BTreeMap::new(), Vec::new(), Vec::new())
    };
    let reward = rewards.values().map(|r| r.score * r.weight).sum();
    let mut metrics: std::collections::HashMap<String, f64> = metrics.into_iter().collect();
    metrics.insert(String::from("num_turns"), f64::from(state.turns));
    pb::Trace {
        id,
        member_id: String::new(),
        nodes: builder.nodes,
        tools: tools.iter().map(tool_spec).collect(),
        rewards: rewards.into_iter().collect(),
        reward,
        metrics,
        stop_condition: stop,
        is_truncated: truncated,
        errors,
        reward_errors,
        timing: Some(pb::Timing {
            total_s: start.elapsed().as_secs_f64(),
            model_s,
            scoring_s: scoring.elapsed().as_secs_f64(),
        }),
        num_turns: state.turns,
        scored_with: req.training_context.map(|c| c.wire.clone()),
        task_json: req.task.data.to_string(),
        task_key: req.task.key.clone(),
        sampling_temperature: req.actor.sampling.temperature.map(Temperature::value),
        turn_rewards,
    }
}

/// A process-unique id (time-based prefix plus a counter).
pub(crate) fn new_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}-{:x}", nanos as u64, std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}
