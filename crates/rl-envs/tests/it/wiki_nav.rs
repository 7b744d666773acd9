//! wiki-nav episodes through a scripted model: the shortest path scores 1, detours score less,
//! invalid actions are reported and counted, the tool and text harnesses agree, and tool results are
//! context (mask false) in the trace.

use std::sync::Arc;

use rl_envs::{Graph, WikiNav};
use rl_serve::fake_model::{FakeModel, FakeReply, FakeRequest};
use rl_serve::{Environment, pb};
use serde_json::json;

use crate::{actor, example, serve};

/// What the scripted player does on each turn.
#[derive(Clone, Copy, PartialEq)]
enum Plan {
    /// Follow a shortest path.
    Shortest,
    /// Click a link off the shortest path, go back, then follow a shortest path.
    Detour,
    /// Click a title that is not a link, then follow a shortest path.
    Invalid,
}

fn current(r: &FakeRequest, graph: &Graph) -> usize {
    let last = &r.messages.last().expect("a conversation").1;
    let title = last.lines().find_map(|l| l.strip_prefix("You are at: ")).expect("an observation");
    graph.find(title).expect("a known article")
}

/// The player: picks the action of `plan` for this turn and writes it for the harness.
async fn player(graph: Arc<Graph>, target: usize, plan: Plan, tools: bool) -> FakeModel {
    FakeModel::start(move |r: &FakeRequest| {
        let here = current(r, &graph);
        let next_on_path = || graph.shortest_path(here, target)[1].clone();
        let action = match (plan, r.turn()) {
            (Plan::Detour, 0) => {
                let best = graph.distances_from(here)[target];
                let off = graph.links[here].iter().find(|&&j| graph.distances_from(j)[target] >= best).copied();
                Some(graph.titles[off.expect("a link off the shortest path")].clone())
            }
            (Plan::Detour, 1) => None,
            (Plan::Invalid, 0) => Some(String::from("Nowhere At All")),
            _ => Some(next_on_path()),
        };
        match (tools, action) {
            (true, Some(t)) => {
                FakeReply::ToolCalls(vec![(String::from("click_link"), json!({"title": t}).to_string())])
            }
            (true, None) => FakeReply::ToolCalls(vec![(String::from("go_back"), String::from("{}"))]),
            (false, Some(t)) => FakeReply::Text(format!("I will click. <click_link>{t}</click_link>")),
            (false, None) => FakeReply::Text(String::from("Back. <go_back/>")),
        }
    })
    .await
}

struct Outcome {
    reward: f64,
    moves: f64,
    invalid: f64,
    reached: f64,
    trace: pb::Trace,
}

async fn play(harness: &str, plan: Plan) -> (Outcome, u64) {
    play_with(harness, plan, 0.0).await
}

async fn play_with(harness: &str, plan: Plan, invalid_penalty: f64) -> (Outcome, u64) {
    let args = json!({"num_examples": 10, "seed": 5, "harness": harness, "min_distance": 2, "max_distance": 3,
                      "invalid_penalty": invalid_penalty});
    let env = WikiNav::new(args.as_object().unwrap()).unwrap();
    let task = env.task("train", 3).unwrap();
    let graph = Arc::new(env.graph().clone());
    let target = graph.find(task.data["target"].as_str().unwrap()).unwrap();
    let model = player(Arc::clone(&graph), target, plan, harness == "tools").await;
    let h = serve("wiki-nav", args).await;
    let resp = h
        .client
        .run_rollout(pb::RunRolloutRequest {
            example: example("train", 3),
            actor: Some(actor(&model, "0")),
            ..Default::default()
        })
        .await
        .unwrap();
    let trace = resp.episode.unwrap().traces.remove(0);
    assert!(trace.errors.is_empty(), "{:?}", trace.errors);
    // A function with a weight is a reward component, one without a metric.
    let m =
        |k: &str| trace.metrics.get(k).copied().or_else(|| trace.rewards.get(k).map(|r| r.score)).unwrap_or(f64::NAN);
    let outcome = Outcome {
        reward: trace.reward,
        moves: m("moves"),
        invalid: m("invalid_actions"),
        reached: m("reached"),
        trace: trace.clone(),
    };
    (outcome, task.data["shortest"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shortest_path_scores_one_and_tool_results_are_context() {
    let (o, shortest) = play("tools", Plan::Shortest).await;
    assert_eq!((o.reward, o.reached, o.invalid), (1.0, 1.0, 0.0));
    assert_eq!(o.moves, shortest as f64);
    assert_eq!(o.trace.stop_condition, "env_done");
    let roles: Vec<&str> = o.trace.nodes.iter().map(|n| n.role.as_str()).collect();
    let mut expected = vec!["system", "user"];
    for i in 0..shortest {
        expected.push("assistant");
        if i + 1 < shortest {
            expected.push("tool");
        }
    }
    assert_eq!(roles, expected);
    for node in &o.trace.nodes {
        assert!(node.mask.iter().all(|m| *m == node.sampled), "{}: only sampled tokens are trained", node.role);
        if node.role == "tool" {
            assert!(!node.sampled && !node.token_ids.is_empty() && node.tool_call_id.starts_with("call_"));
            assert!(node.content.contains("You are at: "));
        }
        if node.role == "assistant" {
            assert_eq!(node.tool_calls.len(), 1);
            assert_eq!(node.tool_calls[0].name, "click_link");
        }
    }
    assert_eq!(o.trace.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["click_link", "go_back"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detours_score_less_and_invalid_actions_are_reported_and_counted() {
    let (detour, shortest) = play("tools", Plan::Detour).await;
    let s = shortest as f64;
    assert_eq!(detour.reached, 1.0);
    assert!(detour.moves >= s + 2.0, "a detour costs at least a click and a go_back: {}", detour.moves);
    assert!((detour.reward - s / detour.moves).abs() < 1e-12 && detour.reward < 1.0);

    let (invalid, _) = play("tools", Plan::Invalid).await;
    assert_eq!((invalid.invalid, invalid.moves, invalid.reached), (1.0, s + 1.0, 1.0));
    assert!((invalid.reward - s / (s + 1.0)).abs() < 1e-12);
    let first_tool = invalid.trace.nodes.iter().find(|n| n.role == "tool").unwrap();
    assert!(first_tool.content.starts_with("Error: `Nowhere At All` is not a link"), "{}", first_tool.content);
}

/// `invalid_penalty` is subtracted per invalid action (the reached walk above, and nothing else
/// about it, changes); a penalty outside 0..=1 is refused, naming the arg.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invalid_action_penalty_lowers_the_reward_per_invalid_action() {
    let (invalid, shortest) = play_with("tools", Plan::Invalid, 0.25).await;
    let s = shortest as f64;
    assert_eq!((invalid.invalid, invalid.moves, invalid.reached), (1.0, s + 1.0, 1.0));
    assert!((invalid.reward - (s / (s + 1.0) - 0.25)).abs() < 1e-12, "{}", invalid.reward);
    let (clean, _) = play_with("tools", Plan::Shortest, 0.25).await;
    assert_eq!(clean.reward, 1.0);
    let err = WikiNav::new(json!({"invalid_penalty": 1.5}).as_object().unwrap()).unwrap_err().to_string();
    assert!(err.contains("invalid_penalty") && err.contains("0..=1"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_harnesses_give_the_same_game_outcome() {
    for plan in [Plan::Shortest, Plan::Detour, Plan::Invalid] {
        let (tools, _) = play("tools", plan).await;
        let (text, _) = play("text", plan).await;
        assert_eq!(
            (tools.reward, tools.moves, tools.invalid, tools.reached),
            (text.reward, text.moves, text.invalid, text.reached)
        );
        assert!(text.trace.tools.is_empty(), "the text harness offers no tools");
        assert!(text.trace.nodes.iter().all(|n| n.role != "tool"), "text observations come as user turns");
        assert!(text.trace.nodes.iter().filter(|n| n.role == "user").count() >= 2);
    }
}

#[tokio::test]
async fn wiki_nav_loads_by_id_and_offers_tools_only_in_the_tool_harness() {
    let tools = rl_envs::load("wiki_nav", json!({}).as_object().unwrap()).await.unwrap();
    let task = tools.task("test", 0).unwrap();
    assert_eq!(tools.tools(&task).len(), 2);
    let text = rl_envs::load("wiki-nav", json!({"harness": "text"}).as_object().unwrap()).await.unwrap();
    assert!(text.tools(&task).is_empty());
    assert!(text.prompt(&task).await.unwrap()[0].content.contains("<click_link>"));
}

fn pairs(env: &WikiNav, split: &str) -> Vec<(String, String)> {
    let n = env.splits().into_iter().find(|(s, _)| s == split).unwrap().1;
    (0..n)
        .map(|i| {
            let t = env.task(split, i).unwrap();
            (t.data["start"].as_str().unwrap().to_owned(), t.data["target"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[test]
fn held_out_pairs_are_never_trained_on_whatever_the_test_size() {
    let env = |test: u64| {
        let args = json!({"num_examples": 2000, "test_examples": test, "num_articles": 20, "links_per_article": 3, "min_distance": 1, "max_distance": 3});
        WikiNav::new(args.as_object().unwrap()).unwrap()
    };
    let (small, large) = (env(8), env(1000));
    let test = pairs(&large, "test");
    assert!(test.len() >= 30, "a fifth of the distinct pairs is held out: {}", test.len());
    let distinct: std::collections::BTreeSet<_> = test.iter().collect();
    assert_eq!(distinct.len(), test.len(), "the test split's pairs are distinct");
    for train in [pairs(&small, "train"), pairs(&large, "train")] {
        assert!(train.iter().all(|p| !distinct.contains(p)), "a held-out pair was drawn for training");
    }
    assert_eq!(pairs(&small, "test"), test[..8], "a smaller test split is a prefix of the same held-out pairs");
}

#[test]
fn a_longer_training_range_adds_pairs_and_holds_out_the_same_ones() {
    let env = |extra: serde_json::Value| {
        let mut args = json!({"num_examples": 4000, "test_examples": 1000, "num_articles": 20, "links_per_article": 3, "min_distance": 1, "max_distance": 3});
        args.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        WikiNav::new(args.as_object().unwrap()).unwrap()
    };
    let (base, longer) = (env(json!({})), env(json!({"train_max_distance": 4})));
    assert_eq!(
        env(json!({"train_max_distance": 3})).task("train", 7).unwrap().data,
        base.task("train", 7).unwrap().data
    );
    let test = pairs(&base, "test");
    assert_eq!(pairs(&longer, "test"), test, "the held-out pairs do not depend on the training range");
    let held: std::collections::BTreeSet<_> = test.iter().collect();
    let train: Vec<_> = (0..4000).map(|i| longer.task("train", i).unwrap().data).collect();
    assert!(
        train
            .iter()
            .all(|t| !held
                .contains(&(t["start"].as_str().unwrap().to_owned(), t["target"].as_str().unwrap().to_owned())))
    );
    assert!(train.iter().any(|t| t["shortest"].as_f64() == Some(4.0)), "no pair 4 clicks apart was drawn");
    assert!(train.iter().all(|t| (1.0..=4.0).contains(&t["shortest"].as_f64().unwrap())));
    let bad = json!({"num_examples": 1, "min_distance": 1, "max_distance": 3, "train_max_distance": 2});
    let err = WikiNav::new(bad.as_object().unwrap()).unwrap_err().to_string();
    assert!(err.contains("train_max_distance"), "{err}");
}

/// Replies each assistant turn of a demonstration, in order.
async fn replay(demo: Vec<rl_serve::Message>) -> FakeModel {
    let turns: Vec<FakeReply> = demo
        .iter()
        .filter(|m| m.role == rl_serve::Role::Assistant)
        .map(|m| match m.tool_calls.is_empty() {
            true => FakeReply::Text(m.content.clone()),
            false => FakeReply::ToolCalls(m.tool_calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect()),
        })
        .collect();
    FakeModel::start(move |r: &FakeRequest| turns[r.turn()].clone()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demonstrations_are_the_episodes_of_perfect_moves() {
    for (harness, shuffle_links) in [("tools", false), ("text", false), ("tools", true), ("text", true)] {
        let args = json!({"num_examples": 6, "seed": 5, "harness": harness, "min_distance": 1, "max_distance": 3,
                          "shuffle_links": shuffle_links});
        let env = WikiNav::new(args.as_object().unwrap()).unwrap();
        let demos = rl_envs::demonstrations("wiki-nav", args.as_object().unwrap(), "train").unwrap();
        assert_eq!(demos.conversations.len(), 6);
        assert_eq!(demos.tools.len(), if harness == "tools" { 2 } else { 0 });
        let h = serve("wiki-nav", args.clone()).await;
        for (i, demo) in demos.conversations.into_iter().enumerate() {
            let task = env.task("train", i as u64).unwrap();
            assert_eq!(env.prompt(&task).await.unwrap(), demo[..2], "the demonstration starts from the env's prompt");
            let model = replay(demo.clone()).await;
            let resp = h
                .client
                .run_rollout(pb::RunRolloutRequest {
                    example: example("train", i as u64),
                    actor: Some(actor(&model, "0")),
                    ..Default::default()
                })
                .await
                .unwrap();
            let trace = resp.episode.unwrap().traces.remove(0);
            assert_eq!(trace.reward, 1.0, "{harness}: a shortest path scores 1");
            assert_eq!(trace.metrics["moves"], task.data["shortest"].as_f64().unwrap());
            let recorded: Vec<(String, String, Vec<String>)> = trace
                .nodes
                .iter()
                .map(|n| {
                    (n.role.clone(), n.content.clone(), n.tool_calls.iter().map(|c| c.arguments.clone()).collect())
                })
                .collect();
            let demo: Vec<(String, String, Vec<String>)> = demo
                .iter()
                .map(|m| {
                    (
                        m.role.as_str().to_owned(),
                        m.content.clone(),
                        m.tool_calls.iter().map(|c| c.arguments.clone()).collect(),
                    )
                })
                .collect();
            assert_eq!(recorded, demo, "{harness}: the episode records the demonstration's messages");
        }
    }
}

#[test]
fn shuffled_links_are_the_same_links_in_an_order_drawn_per_episode_and_move() {
    let args = |shuffle: bool| {
        json!({"num_examples": 40, "seed": 5, "harness": "text", "min_distance": 1,
                                      "max_distance": 3, "shuffle_links": shuffle})
    };
    let demos =
        |shuffle: bool| rl_envs::demonstrations("wiki-nav", args(shuffle).as_object().unwrap(), "train").unwrap();
    let (fixed, shuffled) = (demos(false), demos(true));
    assert_eq!(shuffled.conversations, demos(true).conversations, "the order is drawn from the episode, not the clock");
    let links = |text: &str| -> Vec<String> {
        let line = text.lines().find_map(|l| l.strip_prefix("Links: ")).expect("a links line");
        line.split(", ").map(String::from).collect()
    };
    let (mut pages, mut reordered) = (0, 0);
    for (f, s) in fixed.conversations.iter().zip(&shuffled.conversations) {
        assert_eq!(f.len(), s.len());
        for (a, b) in f.iter().zip(s).filter(|(a, _)| a.content.contains("Links: ")) {
            let (mut la, mut lb) = (links(&a.content), links(&b.content));
            pages += 1;
            reordered += usize::from(la != lb);
            la.sort();
            lb.sort();
            assert_eq!(la, lb, "the same links, reordered");
        }
    }
    // 3 links have 6 orders: a fixed order survives a draw 1 time in 6.
    assert!(pages > 50 && reordered * 2 > pages, "{reordered} of {pages} pages reordered");
}
