//! `wiki-nav`: a Wikispeedia-like game on a link graph of articles generated from a seed. The model
//! starts at one article and must reach a target by following links (`click_link(title)`) or
//! stepping back (`go_back()`). Reward: 1 for reaching the target, times shortest / moves taken.
//! Invalid actions get an error as their result and count as a move; `max_turns` ends the episode.
//! The same game runs with native tool calls (`harness = "tools"`) or with actions written as XML
//! tags in plain text (`harness = "text"`), chosen by the env's args. A fifth of the start/target
//! pairs is held out of every training split (`graph.rs`); `sft_conversations` gives shortest-path
//! demonstrations played through the harness (`demonstrations.rs`) for a supervised warm start.

use async_trait::async_trait;
use rl_serve::{
    EnvReply, Environment, Error, Message, Result, Role, Rubric, RubricGroup, ScoringContext, State, Task, ToolSpec,
    reward_fn,
};
use serde_json::{Map, Value, json};

use crate::args::Args;
use crate::splits::Splits;

mod demonstrations;
mod game;
mod graph;

pub use game::{Action, Game, parse_text_action, tool_action};
pub use graph::Graph;

/// The tool-harness system prompt.
pub const TOOLS_PROMPT: &str = "You navigate a small encyclopedia. Reach the target article by following links. \
Call click_link with the exact title of a link on the current page, or go_back to return to the previous page.";
/// The text-harness system prompt.
pub const TEXT_PROMPT: &str = "You navigate a small encyclopedia. Reach the target article by following links. \
Reply with exactly one action: <click_link>Exact Title</click_link> to follow a link on the current page, \
or <go_back/> to return to the previous page.";

/// The wiki-nav environment.
#[derive(Debug)]
pub struct WikiNav {
    graph: Graph,
    data: Splits<(usize, usize)>,
    tools_harness: bool,
    shuffle_links: bool,
    max_turns: u32,
    rubric: RubricGroup,
}

fn game(state: &State) -> Result<Game> {
    let value = state
        .data
        .get("game")
        .cloned()
        .ok_or_else(|| Error::Env(String::from("wiki-nav: the episode has no game state")))?;
    serde_json::from_value(value).map_err(|e| Error::Env(format!("wiki-nav: bad game state: {e}")))
}

/// The game state a reward function reads.
fn scored(ctx: &ScoringContext<'_>) -> std::result::Result<Game, String> {
    game(ctx.state).map_err(|e| e.to_string())
}

impl WikiNav {
    /// Builds the env from its args: `num_articles`, `links_per_article`, `num_examples`,
    /// `test_examples`, `min_distance`, `max_distance`, `train_max_distance` (training pairs up
    /// to this many clicks apart; `max_distance` by default; the held-out pairs are always those
    /// of `min_distance..=max_distance`), `max_turns`, `seed`, `harness`, `invalid_penalty`
    /// (subtracted from the reward per invalid action; 0 by default), `shuffle_links` (each
    /// observation lists the page's links in an order drawn from the episode and its move count,
    /// rather than the graph's fixed order; false by default).
    pub fn new(args: &Map<String, Value>) -> Result<Self> {
        let mut a = Args::new("wiki-nav", args);
        let n = a.u64("num_articles", 30)?;
        let degree = a.u64("links_per_article", 4)?;
        let num = a.u64("num_examples", 1000)?;
        let test_num = a.u64("test_examples", 100)?;
        let min_d = a.u64("min_distance", 2)?;
        let max_d = a.u64("max_distance", 4)?;
        let train_max_d = a.u64("train_max_distance", max_d)?;
        let max_turns = a.u64("max_turns", 10)?;
        let seed = a.u64("seed", 0)?;
        let harness = a.choice("harness", "tools", &["tools", "text"])?;
        let invalid_penalty = a.f64("invalid_penalty", 0.0)?;
        let shuffle_links = a.bool("shuffle_links", false)?;
        if !(0.0..=1.0).contains(&invalid_penalty) {
            return Err(Error::bad_request(
                "env.args.invalid_penalty",
                format!("must be in 0..=1 (subtracted per invalid action), got {invalid_penalty}"),
            ));
        }
        a.ordered("min_distance", min_d, "max_distance", max_d)?;
        a.ordered("max_distance", max_d, "train_max_distance", train_max_d)?;
        let most = graph::MAX_ARTICLES as u64;
        if !(3..=most).contains(&n) {
            return Err(Error::bad_request("env.args.num_articles", format!("must be in 3..={most}, got {n}")));
        }
        if degree == 0 || degree >= n {
            return Err(Error::bad_request("env.args.links_per_article", format!("must be in 1..{n}, got {degree}")));
        }
        if min_d == 0 || max_turns == 0 {
            return Err(Error::bad_request("env.args.min_distance", "min_distance and max_turns must be at least 1"));
        }
        a.finish()?;
        let graph = Graph::generate(seed, n as usize, degree as usize);
        let range = (min_d as usize, max_d as usize);
        let data = graph::split_pairs(&graph, seed, num, test_num, range, train_max_d as usize);
        if data.train.is_empty() && num > 0 {
            return Err(Error::bad_request(
                "env.args.min_distance",
                format!("no article pairs are {min_d}..={train_max_d} clicks apart in this graph"),
            ));
        }
        let rubric = Rubric::new()
            .reward(
                reward_fn("navigation", |ctx: &ScoringContext<'_>| {
                    let g = scored(ctx)?;
                    let shortest = ctx.task.data["shortest"].as_f64().unwrap_or(1.0);
                    Ok(if g.reached { shortest / f64::from(g.moves).max(shortest) } else { 0.0 })
                }),
                1.0,
            )
            .metric(reward_fn("reached", |ctx: &ScoringContext<'_>| Ok(f64::from(u8::from(scored(ctx)?.reached)))))
            // A walk that fails scores 0 however it failed; the penalty (a negative weight: a
            // metric when 0) tells a walk that clicks what is not on its page from one that
            // explores, which a group of failed walks otherwise cannot.
            .reward(
                reward_fn("invalid_actions", |ctx: &ScoringContext<'_>| Ok(f64::from(scored(ctx)?.invalid))),
                -invalid_penalty,
            )
            .metric(reward_fn("moves", |ctx: &ScoringContext<'_>| Ok(f64::from(scored(ctx)?.moves))));
        Ok(WikiNav {
            graph,
            data,
            tools_harness: harness == "tools",
            shuffle_links,
            max_turns: max_turns as u32,
            rubric: RubricGroup::new(vec![rubric]),
        })
    }

    /// The article graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Demonstrations for a supervised warm start: every start/target pair of `split` walked along
    /// a shortest path, played through this env's harness (the messages an episode of perfect
    /// moves would have).
    pub fn sft_conversations(&self, split: &str) -> Vec<Vec<Message>> {
        let system = if self.tools_harness { TOOLS_PROMPT } else { TEXT_PROMPT };
        self.data
            .get(split)
            .iter()
            .map(|&(a, b)| {
                demonstrations::conversation(&self.graph, system, a, b, self.tools_harness, self.shuffle_links)
            })
            .collect()
    }

    /// The tools of the tools harness (none for the text harness).
    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        if !self.tools_harness {
            return Vec::new();
        }
        vec![
            ToolSpec {
                name: String::from("click_link"),
                description: String::from("Follow a link on the current page."),
                parameters: json!({"type": "object", "properties": {"title": {"type": "string", "description": "Exact title of the linked article"}}, "required": ["title"]}),
            },
            ToolSpec {
                name: String::from("go_back"),
                description: String::from("Return to the previous page."),
                parameters: json!({"type": "object", "properties": {}}),
            },
        ]
    }

    fn task_of(&self, key: String, start: usize, target: usize) -> Task {
        let shortest = self.graph.distances_from(start)[target];
        Task {
            key,
            data: json!({
                "start": self.graph.titles[start],
                "target": self.graph.titles[target],
                "shortest": shortest,
                "demonstration": self.graph.shortest_path(start, target).join(" -> "),
            }),
        }
    }

    fn ends(task: &Task, graph: &Graph) -> Result<(usize, usize)> {
        let find = |k: &str| {
            task.data[k].as_str().and_then(|t| graph.find(t)).ok_or_else(|| {
                Error::bad_request(format!("example.{k}"), "must be the title of an article of this env's graph")
            })
        };
        Ok((find("start")?, find("target")?))
    }
}

#[async_trait]
impl Environment for WikiNav {
    fn id(&self) -> &str {
        "wiki-nav"
    }

    fn splits(&self) -> Vec<(String, u64)> {
        self.data.sizes()
    }

    fn task(&self, split: &str, index: u64) -> Result<Task> {
        let &(a, b) = self.data.at(split, index)?;
        Ok(self.task_of(format!("{split}/{index}"), a, b))
    }

    fn inline_task(&self, data: Value) -> Result<Task> {
        let probe = Task { key: String::from("inline"), data };
        let (a, b) = Self::ends(&probe, &self.graph)?;
        Ok(self.task_of(String::from("inline"), a, b))
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        let (start, target) = Self::ends(task, &self.graph)?;
        let system = if self.tools_harness { TOOLS_PROMPT } else { TEXT_PROMPT };
        let shown = Game::new(start, target, self.shuffle_links).observation(&self.graph);
        Ok(vec![Message::system(system), Message::user(shown)])
    }

    fn tools(&self, _task: &Task) -> Vec<ToolSpec> {
        self.tool_specs()
    }

    fn max_turns(&self, _task: &Task) -> u32 {
        self.max_turns
    }

    async fn env_response(&self, task: &Task, state: &mut State) -> Result<EnvReply> {
        let mut g = match state.data.get("game") {
            Some(_) => game(state)?,
            None => {
                let (start, target) = Self::ends(task, &self.graph)?;
                Game::new(start, target, self.shuffle_links)
            }
        };
        let reply = state
            .messages
            .last()
            .filter(|m| m.role == Role::Assistant)
            .cloned()
            .ok_or_else(|| Error::Env(String::from("wiki-nav: env_response without a model reply")))?;
        let mut out = Vec::new();
        if self.tools_harness {
            if reply.tool_calls.is_empty() {
                let shown =
                    g.apply(&self.graph, &Action::Invalid(String::from("no tool call: call click_link or go_back")));
                out.push(Message::user(shown));
            }
            for call in &reply.tool_calls {
                if g.reached {
                    break;
                }
                let shown = g.apply(&self.graph, &tool_action(&call.name, &call.arguments));
                out.push(Message::tool(call.id.clone(), shown));
            }
        } else {
            out.push(Message::user(g.apply(&self.graph, &parse_text_action(&reply.content))));
        }
        let reached = g.reached;
        state.data.insert(String::from("game"), serde_json::to_value(&g).map_err(|e| Error::Env(e.to_string()))?);
        Ok(if reached { EnvReply::Done } else { EnvReply::Continue(out) })
    }

    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(harness: &str) -> WikiNav {
        WikiNav::new(json!({"num_examples": 20, "harness": harness}).as_object().unwrap()).unwrap()
    }

    #[test]
    fn the_graph_is_deterministic_connected_and_paths_are_shortest() {
        let (a, b) = (Graph::generate(3, 30, 4), Graph::generate(3, 30, 4));
        assert_eq!(a.titles, b.titles);
        assert_eq!(a.links, b.links);
        for i in 0..30 {
            assert!(a.distances_from(i).iter().all(|d| *d != usize::MAX), "the ring reaches every article");
            assert_eq!(a.links[i].len(), 4);
        }
        let path = a.shortest_path(0, 17);
        assert_eq!(path.len() - 1, a.distances_from(0)[17]);
        assert_ne!(Graph::generate(4, 30, 4).links, a.links, "another seed, another graph");
    }

    #[test]
    fn text_actions_parse_and_tool_calls_map_to_the_same_actions() {
        assert_eq!(
            parse_text_action("ok <click_link> Amber River </click_link>"),
            Action::Click(String::from("Amber River"))
        );
        assert_eq!(parse_text_action("<go_back/> then <click_link>X</click_link>"), Action::Back);
        assert!(matches!(parse_text_action("<click_link>X"), Action::Invalid(_)));
        assert!(matches!(parse_text_action("hello"), Action::Invalid(_)));
        assert_eq!(
            tool_action("click_link", r#"{"title": "Amber River"}"#),
            Action::Click(String::from("Amber River"))
        );
        assert_eq!(tool_action("go_back", "{}"), Action::Back);
        assert!(matches!(tool_action("click_link", "{"), Action::Invalid(_)));
        assert!(matches!(tool_action("jump", "{}"), Action::Invalid(_)));
    }

    #[test]
    fn invalid_actions_count_as_moves_and_show_an_error() {
        let e = env("text");
        let t = e.task("train", 0).unwrap();
        let (start, target) = WikiNav::ends(&t, &e.graph).unwrap();
        let mut g = Game::new(start, target, false);
        let shown = g.apply(&e.graph, &Action::Click(String::from("Nowhere")));
        assert!(shown.starts_with("Error: `Nowhere` is not a link on this page"), "{shown}");
        assert!(g.apply(&e.graph, &Action::Back).starts_with("Error: there is no previous page"));
        assert_eq!((g.moves, g.invalid, g.history.len()), (2, 2, 1));
    }

    #[test]
    fn bad_args_name_the_field() {
        let err = WikiNav::new(json!({"harness": "xml"}).as_object().unwrap()).unwrap_err();
        assert!(err.to_string().contains("env.args.harness"), "{err}");
        let err = WikiNav::new(json!({"links_per_article": 0}).as_object().unwrap()).unwrap_err();
        assert!(err.to_string().contains("links_per_article"), "{err}");
    }
}
