//! One wiki-nav episode's rules, whichever harness carries the moves: the actions (parsed from a
//! text reply or a tool call) and the game position they change, with what the model is shown.

use serde_json::Value;

use super::graph::Graph;

/// A player's action, whichever harness carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Follow the link with this title.
    Click(String),
    /// Return to the previous article.
    Back,
    /// Something that is not a valid action (the reason is shown to the model).
    Invalid(String),
}

/// Parses a text-harness reply: the first `<click_link>..</click_link>` or `<go_back/>`.
pub fn parse_text_action(reply: &str) -> Action {
    let click = reply.find("<click_link>");
    let back = reply.find("<go_back/>").or_else(|| reply.find("<go_back>"));
    match (click, back) {
        (Some(c), b) if b.is_none_or(|b| c < b) => {
            let start = c + "<click_link>".len();
            match reply[start..].find("</click_link>") {
                Some(end) => Action::Click(reply[start..start + end].trim().to_owned()),
                None => Action::Invalid(String::from("<click_link> is not closed with </click_link>")),
            }
        }
        (_, Some(_)) => Action::Back,
        _ => Action::Invalid(String::from(
            "no action found: reply with <click_link>Exact Title</click_link> or <go_back/>",
        )),
    }
}

/// A native tool call as an action.
pub fn tool_action(name: &str, arguments: &str) -> Action {
    match name {
        "go_back" => Action::Back,
        "click_link" => match serde_json::from_str::<Value>(arguments) {
            Ok(v) => match v.get("title").and_then(Value::as_str) {
                Some(t) => Action::Click(t.to_owned()),
                None => Action::Invalid(String::from("click_link needs a string argument `title`")),
            },
            Err(e) => Action::Invalid(format!("click_link arguments are not JSON: {e}")),
        },
        other => Action::Invalid(format!("unknown tool `{other}`; use click_link or go_back")),
    }
}

/// One episode's position, kept in `State::data["game"]`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Game {
    /// Visited articles; the last one is the current article (go_back pops).
    pub history: Vec<usize>,
    /// Target article.
    pub target: usize,
    /// Actions taken (valid or not).
    pub moves: u32,
    /// Invalid actions.
    pub invalid: u32,
    /// The target was reached.
    pub reached: bool,
    /// Pages list their links in an order drawn per move (`shuffle_links`).
    #[serde(default)]
    pub shuffle_links: bool,
}

impl Game {
    /// Applies one action and returns what the model is shown.
    pub fn apply(&mut self, graph: &Graph, action: &Action) -> String {
        self.moves += 1;
        let current = *self.history.last().expect("the start is always in the history");
        let error = |g: &mut Game, why: String| {
            g.invalid += 1;
            format!("Error: {why}\n{}", graph.observation(current, g.target, g.order()))
        };
        match action {
            Action::Click(title) => match graph.find(title).filter(|j| graph.links[current].contains(j)) {
                Some(j) => {
                    self.history.push(j);
                    self.reached = j == self.target;
                    graph.observation(j, self.target, self.order())
                }
                None => error(self, format!("`{title}` is not a link on this page")),
            },
            Action::Back if self.history.len() > 1 => {
                self.history.pop();
                graph.observation(*self.history.last().expect("non-empty"), self.target, self.order())
            }
            Action::Back => error(self, String::from("there is no previous page")),
            Action::Invalid(why) => error(self, why.clone()),
        }
    }
}

impl Game {
    /// A new episode from `start` to `target`.
    pub fn new(start: usize, target: usize, shuffle_links: bool) -> Self {
        Game { history: vec![start], target, moves: 0, invalid: 0, reached: false, shuffle_links }
    }

    /// The link order of the observation shown after the moves made so far.
    fn order(&self) -> Option<(usize, u32)> {
        self.shuffle_links.then(|| (self.history[0], self.moves))
    }

    /// What the model is shown of the current page now.
    pub fn observation(&self, graph: &Graph) -> String {
        graph.observation(*self.history.last().expect("the start is always in the history"), self.target, self.order())
    }
}
