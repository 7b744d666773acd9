//! Hostile requests: `RunGroup` with arbitrary tasks, sizes, sampling and model settings, and
//! `RunAlgorithms` with real traces damaged field by field (parents pointing anywhere, token,
//! mask and logprob lists of other lengths, non-finite numbers, junk algorithm fields) are answered
//! with a result or INVALID_ARGUMENT naming a field: never an internal error or a dropped
//! connection, and the server keeps serving (a plain request succeeds after every case).

use std::sync::Arc;

use proptest::prelude::*;
use rl_configs::ServeConfig;
use rl_serve::{ClientOptions, Error, pb};

use crate::{StepEnv, actor, dataset, echo_model, start};

/// Strings the parsers give meaning to, and junk.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "{}",
            "[]",
            "null",
            "1e999",
            "{\"q\": 1}",
            "{\"alpha\": -1}",
            "{\"alpha\": 1e308, \"beta\": null}",
            "{\"n\": 64}",
            "{\"temperature\": 0}",
            "{\"max_tokens\": 4294967296}",
            "{\"stop\": [\"\", \"\"]}",
            "\u{0}",
            "🙂漢é",
            "http://127.0.0.1:1/v1",
            "user",
            "assistant",
            "tool",
        ])
        .prop_map(str::to_owned),
        ".{0,24}",
    ]
}

fn number() -> impl Strategy<Value = f64> {
    prop_oneof![
        prop::sample::select(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 0.0, 1e-300, 0.5, 1.0, 1e300]),
        any::<f64>(),
    ]
}

/// One change to a `RunGroup` request.
#[derive(Debug, Clone)]
enum GroupEdit {
    Inline(String),
    Dataset(String, u64),
    GroupSize(u32),
    Temperature(f64),
    TopP(f64),
    TopK(i64),
    MaxTokens(u32),
    Stop(Vec<String>),
    Seed(u64),
    Extra(String),
    BaseUrl(String),
    Timeout(f64),
    Context(u64, Vec<(String, String)>),
    Model(String, String),
}

fn group_edit() -> impl Strategy<Value = GroupEdit> {
    prop_oneof![
        text().prop_map(GroupEdit::Inline),
        (text(), prop::sample::select(vec![0u64, 9, 10, u64::MAX])).prop_map(|(s, i)| GroupEdit::Dataset(s, i)),
        prop::sample::select(vec![0u32, 1, 3, 4097, u32::MAX]).prop_map(GroupEdit::GroupSize),
        number().prop_map(GroupEdit::Temperature),
        number().prop_map(GroupEdit::TopP),
        any::<i64>().prop_map(GroupEdit::TopK),
        any::<u32>().prop_map(GroupEdit::MaxTokens),
        prop::collection::vec(text(), 0..3).prop_map(GroupEdit::Stop),
        any::<u64>().prop_map(GroupEdit::Seed),
        text().prop_map(GroupEdit::Extra),
        text().prop_map(GroupEdit::BaseUrl),
        number().prop_map(GroupEdit::Timeout),
        (any::<u64>(), prop::collection::vec((text(), text()), 0..2)).prop_map(|(s, e)| GroupEdit::Context(s, e)),
        (text(), text()).prop_map(|(k, m)| GroupEdit::Model(k, m)),
    ]
}

fn apply_group(req: &mut pb::RunGroupRequest, edit: &GroupEdit) {
    let actor = req.actor.get_or_insert_with(Default::default);
    let sampling = actor.sampling.get_or_insert_with(Default::default);
    match edit.clone() {
        GroupEdit::Inline(json) => {
            req.example = Some(pb::ExampleRef { source: Some(pb::example_ref::Source::InlineJson(json)) });
        }
        GroupEdit::Dataset(split, index) => req.example = dataset(&split, index),
        GroupEdit::GroupSize(n) => req.group_size = n,
        GroupEdit::Temperature(t) => sampling.temperature = Some(t),
        GroupEdit::TopP(p) => sampling.top_p = Some(p),
        GroupEdit::TopK(k) => sampling.top_k = Some(k),
        GroupEdit::MaxTokens(n) => sampling.max_completion_tokens = Some(n),
        GroupEdit::Stop(stop) => sampling.stop = stop,
        GroupEdit::Seed(s) => sampling.seed = Some(s),
        GroupEdit::Extra(json) => sampling.extra_json = json,
        GroupEdit::BaseUrl(url) => actor.base_url = url,
        GroupEdit::Timeout(t) => actor.timeout_s = t,
        GroupEdit::Context(step, extra) => {
            req.training_context =
                Some(pb::TrainingContext { step, extra: extra.into_iter().collect(), ..Default::default() });
        }
        GroupEdit::Model(key, model) => {
            let runtime = pb::ModelRuntime { model, ..actor.clone() };
            req.models.insert(key, runtime);
        }
    }
}

/// One change to a trace of a `RunAlgorithms` request (indices are taken modulo the lists).
#[derive(Debug, Clone)]
enum TraceEdit {
    Parent(prop::sample::Index, i32),
    TruncateTokens(prop::sample::Index, usize),
    TruncateMask(prop::sample::Index, usize),
    TruncateLogprobs(prop::sample::Index, usize),
    PushToken(prop::sample::Index, u32),
    Logprob(prop::sample::Index, f32),
    Role(prop::sample::Index, String),
    Sampled(prop::sample::Index, bool),
    NoNodes,
    Reward(f64),
    Rewards(String, f64, f64),
    TurnRewards(Vec<f64>),
    Member(String),
    TaskKey(String),
    TaskJson(String),
    Temperature(Option<f64>),
}

fn trace_edit() -> impl Strategy<Value = TraceEdit> {
    let idx = any::<prop::sample::Index>;
    prop_oneof![
        (idx(), prop::sample::select(vec![-2i32, -1, 0, 1, 2, 3, 100, i32::MIN, i32::MAX]))
            .prop_map(|(i, p)| TraceEdit::Parent(i, p)),
        (idx(), 0usize..4).prop_map(|(i, n)| TraceEdit::TruncateTokens(i, n)),
        (idx(), 0usize..4).prop_map(|(i, n)| TraceEdit::TruncateMask(i, n)),
        (idx(), 0usize..4).prop_map(|(i, n)| TraceEdit::TruncateLogprobs(i, n)),
        (idx(), any::<u32>()).prop_map(|(i, t)| TraceEdit::PushToken(i, t)),
        (idx(), prop::sample::select(vec![f32::NAN, f32::INFINITY, 1.0, -1e30]))
            .prop_map(|(i, l)| TraceEdit::Logprob(i, l)),
        (idx(), text()).prop_map(|(i, r)| TraceEdit::Role(i, r)),
        (idx(), any::<bool>()).prop_map(|(i, s)| TraceEdit::Sampled(i, s)),
        Just(TraceEdit::NoNodes),
        number().prop_map(TraceEdit::Reward),
        (text(), number(), number()).prop_map(|(n, s, w)| TraceEdit::Rewards(n, s, w)),
        prop::collection::vec(number(), 0..4).prop_map(TraceEdit::TurnRewards),
        text().prop_map(TraceEdit::Member),
        text().prop_map(TraceEdit::TaskKey),
        text().prop_map(TraceEdit::TaskJson),
        prop::option::of(number()).prop_map(TraceEdit::Temperature),
    ]
}

fn apply_trace(t: &mut pb::Trace, edit: &TraceEdit) {
    let node = |t: &mut pb::Trace, i: &prop::sample::Index| {
        let n = t.nodes.len();
        (n > 0).then(|| i.index(n))
    };
    match edit.clone() {
        TraceEdit::Parent(i, p) => {
            if let Some(k) = node(t, &i) {
                t.nodes[k].parent = p;
            }
        }
        TraceEdit::TruncateTokens(i, n) => {
            if let Some(k) = node(t, &i) {
                t.nodes[k].token_ids.truncate(n);
            }
        }
        TraceEdit::TruncateMask(i, n) => {
            if let Some(k) = node(t, &i) {
                t.nodes[k].mask.truncate(n);
            }
        }
        TraceEdit::TruncateLogprobs(i, n) => {
            if let Some(k) = node(t, &i) {
                t.nodes[k].logprobs.truncate(n);
            }
        }
        TraceEdit::PushToken(i, tok) => {
            if let Some(k) = node(t, &i) {
                t.nodes[k].token_ids.push(tok);
            }
        }
        TraceEdit::Logprob(i, l) => {
            if let Some(k) = node(t, &i)
                && let Some(first) = t.nodes[k].logprobs.first_mut()
            {
                *first = l;
            }
        }
        TraceEdit::Role(i, role) => {
            if let Some(k) = node(t, &i) {
                t.nodes[k].role = role;
            }
        }
        TraceEdit::Sampled(i, s) => {
            if let Some(k) = node(t, &i) {
                t.nodes[k].sampled = s;
            }
        }
        TraceEdit::NoNodes => t.nodes.clear(),
        TraceEdit::Reward(r) => t.reward = r,
        TraceEdit::Rewards(name, score, weight) => {
            t.rewards.insert(name, pb::RewardValue { score, weight });
        }
        TraceEdit::TurnRewards(r) => t.turn_rewards = r,
        TraceEdit::Member(m) => t.member_id = m,
        TraceEdit::TaskKey(k) => t.task_key = k,
        TraceEdit::TaskJson(j) => t.task_json = j,
        TraceEdit::Temperature(x) => t.sampling_temperature = x,
    }
}

/// Ok, or a bad request naming its field; anything else is a server fault.
fn client_side<T>(what: &str, result: Result<T, Error>) -> Result<(), TestCaseError> {
    match result {
        Ok(_) | Err(Error::BadRequest { .. }) => Ok(()),
        Err(e) => Err(TestCaseError::fail(format!("{what}: {e}"))),
    }
}

#[test]
fn hostile_requests_get_results_or_invalid_argument_and_the_server_keeps_serving() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let model = rt.block_on(echo_model());
    let h = rt.block_on(start(
        Arc::new(StepEnv::new()),
        ServeConfig::default(),
        ClientOptions { retries: 0, ..Default::default() },
    ));
    let plain = pb::RunGroupRequest {
        example: dataset("train", 1),
        group_size: 3,
        actor: Some(actor(&model)),
        training_context: Some(pb::TrainingContext { step: 2, ..Default::default() }),
        ..Default::default()
    };
    let traces = rt.block_on(h.client.run_group(plain.clone())).unwrap().episodes[0].traces.clone();
    let mut algorithms = rt.block_on(h.client.info()).unwrap().algorithms;
    algorithms.extend([String::new(), String::from("nope")]);
    // 256 in CI; `PROPTEST_CASES` (proptest's own variable) asks for a longer search.
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256);
    let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    let group = prop::collection::vec(group_edit(), 1..4);
    let algo = (
        prop::sample::select(algorithms),
        text(),
        prop::collection::vec((any::<prop::sample::Index>(), trace_edit()), 0..4),
    );
    proptest!(config, |(edits in group, (id, fields, damage) in algo)| {
        let mut req = plain.clone();
        for e in &edits {
            apply_group(&mut req, e);
        }
        client_side(&format!("RunGroup {edits:?}"), rt.block_on(h.client.run_group(req)))?;
        let mut bad = traces.clone();
        for (i, e) in &damage {
            let k = i.index(bad.len());
            apply_trace(&mut bad[k], e);
        }
        let spec = pb::AlgorithmSpec { id: id.clone(), fields_json: fields.clone() };
        let req = pb::RunAlgorithmsRequest { algorithms: vec![spec], traces: bad, ..Default::default() };
        client_side(&format!("RunAlgorithms {id} {fields:?} {damage:?}"), rt.block_on(h.client.run_algorithms(req)))?;
        let after = rt.block_on(h.client.run_group(plain.clone()));
        prop_assert!(after.is_ok(), "a plain request after the case: {:?}", after.err());
    });
}
