//! Demonstrations for wiki-nav's supervised warm start: a shortest path played through a harness,
//! message for message as an episode of perfect moves would record it.

use rl_serve::{Message, ToolCall};
use serde_json::json;

use super::game::{Action, Game};
use super::graph::Graph;

/// The conversation of a shortest path from `start` to `target`: the prompt (`system`, the start's
/// observation), then per move the model's action (a `click_link` tool call, or a tagged action
/// in text) and, until the target is reached, what the env shows next (a tool result, or a user
/// turn). The episode ends on the move that reaches the target, as the env's does; with
/// `shuffle_links` each page lists its links in the order the env would show at that move.
pub(super) fn conversation(
    graph: &Graph,
    system: &str,
    start: usize,
    target: usize,
    tools: bool,
    shuffle_links: bool,
) -> Vec<Message> {
    let path = graph.path(start, target);
    let mut game = Game::new(start, target, shuffle_links);
    let mut messages = vec![Message::system(system), Message::user(game.observation(graph))];
    for (i, &next) in path.iter().enumerate().skip(1) {
        let title = &graph.titles[next];
        let id = format!("call_{i}");
        if tools {
            let call = ToolCall {
                id: id.clone(),
                name: String::from("click_link"),
                arguments: json!({"title": title}).to_string(),
            };
            messages.push(Message { tool_calls: vec![call], ..Message::assistant("") });
        } else {
            messages.push(Message::assistant(format!("<click_link>{title}</click_link>")));
        }
        let shown = game.apply(graph, &Action::Click(title.clone()));
        if next != target {
            messages.push(if tools { Message::tool(id, shown) } else { Message::user(shown) });
        }
    }
    messages
}
