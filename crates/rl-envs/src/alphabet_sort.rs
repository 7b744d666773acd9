//! `alphabet-sort`: sort names by first or last name over several turns; later turns add names that
//! must be marked `// new name!`. Reward: mean over turns of difflib similarity^power; within a turn
//! a repeated attempt counts only if each is strictly better than the one before. With
//! `history = "gold"` an episode arrives with its earlier turns already answered by their ground
//! truth and the model answers the last turn only (turn-level training at one generation a rollout).

use async_trait::async_trait;
use rl_serve::{
    EnvReply, Environment, Error, Message, Result, Rubric, RubricGroup, ScoringContext, State, Task, reward_fn,
    turn_reward_fn,
};
use serde_json::{Map, Value, json};

use crate::args::Args;
use crate::difflib::ratio;
use crate::rng::Rng;
use crate::splits::Splits;

const FIRST: &[&str] = &[
    "Ada",
    "Alan",
    "Grace",
    "Linus",
    "Ken",
    "Dennis",
    "Barbara",
    "Edsger",
    "Donald",
    "John",
    "Margaret",
    "Tim",
    "Radia",
    "Frances",
    "Niklaus",
    "Bjarne",
    "Guido",
    "Yukihiro",
    "Anders",
    "James",
    "Leslie",
    "Tony",
    "Robin",
    "Shafi",
    "Silvio",
    "Judea",
    "Yoshua",
    "Geoffrey",
    "Yann",
    "Fei",
    "Andrew",
    "Daphne",
    "Cynthia",
    "Whitfield",
    "Martin",
    "Ivan",
    "Butler",
    "Adele",
    "Carl",
    "Hedy",
];
const LAST: &[&str] = &[
    "Lovelace",
    "Turing",
    "Hopper",
    "Torvalds",
    "Thompson",
    "Ritchie",
    "Liskov",
    "Dijkstra",
    "Knuth",
    "McCarthy",
    "Hamilton",
    "Berners",
    "Perlman",
    "Allen",
    "Wirth",
    "Stroustrup",
    "Rossum",
    "Matsumoto",
    "Hejlsberg",
    "Gosling",
    "Lamport",
    "Hoare",
    "Milner",
    "Goldwasser",
    "Micali",
    "Pearl",
    "Bengio",
    "Hinton",
    "Lecun",
    "Li",
    "Ng",
    "Koller",
    "Dwork",
    "Diffie",
    "Hellman",
    "Sutherland",
    "Lampson",
    "Goldberg",
    "Shannon",
    "Lamarr",
];

/// Suffix marking names added in a later turn.
pub const NEW_MARK: &str = " // new name!";

/// The alphabet-sort environment.
#[derive(Debug)]
pub struct AlphabetSort {
    data: Splits<Value>,
    rubric: RubricGroup,
    gold_history: bool,
}

/// Generation settings.
#[derive(Debug, Clone, Copy)]
struct Gen {
    min_turns: u64,
    max_turns: u64,
    min_names: u64,
    max_names: u64,
    /// `Some(true)`: every episode sorts by first name, `Some(false)` by last; `None`: drawn per
    /// episode, by first name with probability `first_share`.
    by_first: Option<bool>,
    first_share: f64,
    /// `sort_by = "given"`: the names repeated in the order the prompt lists them (a copy task
    /// with the same names and format, for a curriculum).
    given: bool,
}

/// The sort key: the part before (by first name) or from (by last name) the first capital after index 0.
fn sort_key(name: &str, by_first: bool) -> &str {
    let split = name.char_indices().skip(1).find(|(_, c)| c.is_uppercase()).map_or(name.len(), |(i, _)| i);
    if by_first { &name[..split] } else { &name[split..] }
}

fn episode(rng: &mut Rng, g: Gen) -> Value {
    let turns = rng.range(g.min_turns, g.max_turns) as usize;
    let counts: Vec<usize> = (0..turns).map(|_| rng.range(g.min_names, g.max_names) as usize).collect();
    let total: usize = counts.iter().sum();
    let mut names: Vec<String> = Vec::new();
    while names.len() < total {
        let name = format!("{}{}", rng.choose(FIRST), rng.choose(LAST));
        if !names.contains(&name) {
            names.push(name);
        }
    }
    // The key's draw happens either way, so fixing the key leaves everything else about an episode
    // as it was; an even share is the low bit, as before shares existed, so those datasets stay.
    let draw = rng.next_u64();
    let drawn = if g.first_share == 0.5 { draw & 1 == 1 } else { unit_interval(draw) < g.first_share };
    let by_first = g.by_first.unwrap_or(drawn);
    let which = if by_first { "FIRST" } else { "LAST" };
    let (ask, ask_all) = if g.given {
        (
            String::from("Repeat these names in the order given"),
            String::from("Now repeat ALL of these names in the order given"),
        )
    } else {
        (
            format!("Sort these names in alphabetical order by {which} name"),
            format!("Now sort ALL of these names alphabetically by {which} name"),
        )
    };
    let mut user_turns = Vec::new();
    let mut truths: Vec<Vec<String>> = Vec::new();
    let mut seen = 0;
    for (t, &count) in counts.iter().enumerate() {
        let turn_names = &names[seen..seen + count];
        let cumulative = &names[..seen + count];
        let mut shown = if t == 0 { turn_names.to_vec() } else { cumulative.to_vec() };
        rng.shuffle(&mut shown);
        // Sorted from the names' drawn order (ties keep it), as datasets have always been.
        let mut sorted: Vec<&String> = if g.given { shown.iter().collect() } else { cumulative.iter().collect() };
        if !g.given {
            sorted.sort_by(|a, b| sort_key(a, by_first).cmp(sort_key(b, by_first)));
        }
        truths.push(
            sorted
                .iter()
                .map(|n| if t > 0 && turn_names.contains(n) { format!("{n}{NEW_MARK}") } else { (*n).clone() })
                .collect(),
        );
        if t == 0 {
            let k = rng.range(g.min_names, g.max_names);
            let lines: Vec<String> = (1..=k).map(|j| format!("Name{j}")).collect();
            user_turns.push(format!(
                "{ask}: {}\n\nUse exactly this format:\n<alphabetical_sorted>\n{}\n</alphabetical_sorted>",
                shown.join(", "),
                lines.join("\n")
            ));
        } else {
            let mut prompt = format!(
                "{ask_all}: {}\n\nThese are in addition to the prior list. Mark any NEW names (that weren't in the prior list) with `// new name!` at the end.",
                shown.join(", ")
            );
            if t == 1 {
                let k = rng.range(g.min_names, (seen + count) as u64);
                let threshold = rng.range(0, k - 1);
                let lines: Vec<String> = (1..=k)
                    .map(|j| if j > threshold { format!("Name{j}{NEW_MARK}") } else { format!("Name{j}") })
                    .collect();
                prompt.push_str(&format!(
                    "\n\nUse exactly this format:\n<combined_alphabetical_sorted>\n{}\n</combined_alphabetical_sorted>",
                    lines.join("\n")
                ));
            } else {
                prompt.push_str(" Follow the same format as before.");
            }
            user_turns.push(prompt);
        }
        seen += count;
    }
    json!({"user_turns": user_turns, "ground_truths": truths, "num_turns": turns})
}

/// A draw's top 53 bits as a number in `[0, 1)`.
fn unit_interval(draw: u64) -> f64 {
    (draw >> 11) as f64 / (1u64 << 53) as f64
}

/// Every `<tag>...</tag>` block of `text`, in order.
fn find_all<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(s) = rest.find(&open) {
        let after = &rest[s + open.len()..];
        let Some(e) = after.find(&close) else { break };
        out.push(&after[..e]);
        rest = &after[e + close.len()..];
    }
    out
}

/// Each turn's similarity to its ground truth (`sim^power` when `power_per_turn`): 0 for a turn
/// without a reply or without the turn's tag; of repeated attempts within a turn the last counts
/// if each is strictly better than the one before, else the turn scores 0.
pub fn turn_scores(replies: &[&str], truths: &[Vec<String>], power: f64, power_per_turn: bool) -> Vec<f64> {
    truths
        .iter()
        .enumerate()
        .map(|(t, truth)| {
            let tag = answer_tag(t);
            let expected: Vec<String> = truth.iter().map(|s| s.trim().to_lowercase()).collect();
            let expected = expected.join("\n");
            let Some(reply) = replies.get(t) else { return 0.0 };
            let attempts: Vec<f64> = find_all(reply, tag)
                .into_iter()
                .map(|content| {
                    let pred: Vec<String> =
                        content.split('\n').filter(|l| !l.trim().is_empty()).map(|l| l.trim().to_lowercase()).collect();
                    let pred = pred.join("\n");
                    let sim = if pred.is_empty() || expected.is_empty() { 0.0 } else { ratio(&pred, &expected) };
                    if power_per_turn { sim.powf(power) } else { sim }
                })
                .collect();
            match attempts.as_slice() {
                [] => 0.0,
                [one] => *one,
                many if many.windows(2).all(|w| w[1] > w[0]) => *many.last().expect("non-empty"),
                _ => 0.0,
            }
        })
        .collect()
}

/// The episode reward from the assistant replies (see the module doc): the mean of the turn
/// scores, raised to `power` afterwards unless it was applied per turn.
pub fn score(replies: &[&str], truths: &[Vec<String>], power: f64, power_per_turn: bool) -> f64 {
    if truths.is_empty() {
        return 0.0;
    }
    let turns = turn_scores(replies, truths, power, power_per_turn);
    let avg = turns.iter().sum::<f64>() / turns.len() as f64;
    if power_per_turn { avg } else { avg.powf(power) }
}

fn truths_of(task: &Task) -> Vec<Vec<String>> {
    task.data["ground_truths"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    t.as_array()
                        .map(|l| l.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn user_turns(task: &Task) -> Vec<&str> {
    task.data["user_turns"].as_array().map(|u| u.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

/// The tag of turn `t`'s answer.
fn answer_tag(t: usize) -> &'static str {
    if t == 0 { "alphabetical_sorted" } else { "combined_alphabetical_sorted" }
}

/// The ideal answer to turn `t`: its ground truth, one name a line, in the turn's tags.
fn gold_answer(t: usize, truth: &[String]) -> String {
    let tag = answer_tag(t);
    format!("<{tag}>\n{}\n</{tag}>", truth.join("\n"))
}

/// The scores of the turns from `first` on: the replies include the prompt's gold answers (with
/// `history = "gold"`), which are scored like any reply and then left out.
fn model_turn_scores(replies: &[&str], truths: &[Vec<String>], first: usize, power: f64, per_turn: bool) -> Vec<f64> {
    let scores = turn_scores(replies, truths, power, per_turn);
    scores[first.min(scores.len())..].to_vec()
}

/// The first turn the model answers: 0, or with gold history the last one.
fn first_model_turn(task: &Task, gold_history: bool) -> usize {
    if gold_history { user_turns(task).len().saturating_sub(1) } else { 0 }
}

impl AlphabetSort {
    /// Builds the env from its args: `num_examples`, `test_examples`, `min_turns`, `max_turns`,
    /// `min_names`, `max_names`, `power`, `power_per_turn`, `seed`, `sort_by` (`"either"`, drawn
    /// per episode; `"first"` or `"last"` name for every episode; `"given"`: no sorting, the names
    /// repeated in the order listed, a copy task for a curriculum), `first_share` (with `"either"`,
    /// the share of episodes sorted by first name, 0.5 by default), `history` (`"model"`: the model
    /// answers every turn; `"gold"`: earlier turns come answered with their ground truth and the
    /// model answers, and is scored on, the last turn only).
    pub fn new(args: &Map<String, Value>) -> Result<Self> {
        let mut a = Args::new("alphabet-sort", args);
        let num = a.u64("num_examples", 1000)?;
        let test_num = a.u64("test_examples", 100)?;
        let sort_by = a.choice("sort_by", "either", &["either", "first", "last", "given"])?;
        let by_first = match sort_by.as_str() {
            "first" => Some(true),
            "last" => Some(false),
            _ => None,
        };
        let first_share = a.f64("first_share", 0.5)?;
        if !(0.0..=1.0).contains(&first_share) {
            return Err(Error::bad_request(
                "env.args.first_share",
                format!("first_share is a share of episodes in [0, 1], got {first_share}"),
            ));
        }
        if sort_by != "either" && first_share != 0.5 {
            return Err(Error::bad_request(
                "env.args.first_share",
                "first_share applies to sort_by = \"either\"; a fixed sort_by sets every episode's key",
            ));
        }
        let g = Gen {
            min_turns: a.u64("min_turns", 1)?,
            max_turns: a.u64("max_turns", 3)?,
            min_names: a.u64("min_names", 1)?,
            max_names: a.u64("max_names", 5)?,
            by_first,
            first_share,
            given: sort_by == "given",
        };
        let power = a.f64("power", 4.0)?;
        let per_turn = a.bool("power_per_turn", true)?;
        let seed = a.u64("seed", 0)?;
        let gold_history = a.choice("history", "model", &["model", "gold"])? == "gold";
        a.ordered("min_turns", g.min_turns, "max_turns", g.max_turns)?;
        a.ordered("min_names", g.min_names, "max_names", g.max_names)?;
        if g.min_turns == 0 || g.min_names == 0 {
            return Err(Error::bad_request("env.args.min_turns", "min_turns and min_names must be at least 1"));
        }
        if g.max_turns * g.max_names > (FIRST.len() * LAST.len()) as u64 {
            return Err(Error::bad_request("env.args.max_names", "too many names per episode for the name pool"));
        }
        a.finish()?;
        let gen_split = |stream: &str, n: u64| {
            let mut rng = Rng::new(seed, stream);
            (0..n).map(|_| episode(&mut rng, g)).collect::<Vec<_>>()
        };
        // With the power applied per turn the reward is a mean over turns, so the env reports
        // each turn's score too (for turn-level credit: `grpo` with `credit = "turn"`).
        let rubric = if per_turn {
            Rubric::new().turn_reward(
                turn_reward_fn("alphabet_sort", move |ctx: &ScoringContext<'_>| {
                    let first = first_model_turn(ctx.task, gold_history);
                    Ok(model_turn_scores(&ctx.assistant_replies(), &truths_of(ctx.task), first, power, true))
                }),
                1.0,
            )
        } else {
            Rubric::new().reward(
                reward_fn("alphabet_sort", move |ctx: &ScoringContext<'_>| {
                    let first = first_model_turn(ctx.task, gold_history);
                    let sims = model_turn_scores(&ctx.assistant_replies(), &truths_of(ctx.task), first, power, false);
                    if sims.is_empty() {
                        return Ok(0.0);
                    }
                    Ok((sims.iter().sum::<f64>() / sims.len() as f64).powf(power))
                }),
                1.0,
            )
        };
        Ok(AlphabetSort {
            data: Splits {
                train: gen_split("alphabet-sort/train", num),
                test: gen_split("alphabet-sort/test", test_num),
            },
            rubric: RubricGroup::new(vec![rubric]),
            gold_history,
        })
    }

    /// Ideal multi-turn conversations (user turns, each answered with its ground truth in the
    /// requested tags) for supervised warm-up on `split`.
    pub fn sft_conversations(&self, split: &str) -> Vec<Vec<Message>> {
        self.data
            .get(split)
            .iter()
            .map(|ep| {
                let task = Task { key: String::new(), data: ep.clone() };
                let truths = truths_of(&task);
                let mut msgs = Vec::new();
                for (t, (user, truth)) in user_turns(&task).into_iter().zip(&truths).enumerate() {
                    msgs.push(Message::user(user));
                    msgs.push(Message::assistant(gold_answer(t, truth)));
                }
                msgs
            })
            .collect()
    }
}

#[async_trait]
impl Environment for AlphabetSort {
    fn id(&self) -> &str {
        "alphabet-sort"
    }

    fn splits(&self) -> Vec<(String, u64)> {
        self.data.sizes()
    }

    fn task(&self, split: &str, index: u64) -> Result<Task> {
        self.data.task(split, index)
    }

    fn inline_task(&self, data: Value) -> Result<Task> {
        let ok = data["user_turns"].as_array().is_some_and(|u| !u.is_empty())
            && data["ground_truths"].as_array().map(Vec::len) == data["user_turns"].as_array().map(Vec::len);
        if !ok {
            return Err(Error::bad_request(
                "example.inline_json",
                "alphabet-sort tasks are {\"user_turns\": [...], \"ground_truths\": [[...], ...]} of equal length",
            ));
        }
        Ok(Task { key: String::from("inline"), data })
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        let turns = user_turns(task);
        if turns.is_empty() {
            return Err(Error::Env(String::from("alphabet-sort task without user turns")));
        }
        let first = first_model_turn(task, self.gold_history);
        let truths = truths_of(task);
        let mut msgs = Vec::new();
        for (t, user) in turns.iter().enumerate().take(first) {
            let truth =
                truths.get(t).ok_or_else(|| Error::Env(format!("alphabet-sort task without turn {t}'s truth")))?;
            msgs.push(Message::user(*user));
            msgs.push(Message::assistant(gold_answer(t, truth)));
        }
        msgs.push(Message::user(turns[first]));
        Ok(msgs)
    }

    fn max_turns(&self, task: &Task) -> u32 {
        (user_turns(task).len() - first_model_turn(task, self.gold_history)) as u32
    }

    async fn env_response(&self, task: &Task, state: &mut State) -> Result<EnvReply> {
        let turns = user_turns(task);
        let next = first_model_turn(task, self.gold_history) + state.turns as usize;
        Ok(match turns.get(next) {
            Some(next) => EnvReply::Continue(vec![Message::user(*next)]),
            None => EnvReply::Done,
        })
    }

    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_keys_split_at_the_second_capital() {
        assert_eq!(sort_key("AdaLovelace", true), "Ada");
        assert_eq!(sort_key("AdaLovelace", false), "Lovelace");
        assert_eq!(sort_key("Plain", false), "");
    }

    #[test]
    fn perfect_answers_score_one_and_worse_retries_score_zero() {
        let truths = vec![vec![String::from("AdaLovelace"), String::from("AlanTuring")]];
        let good = "<alphabetical_sorted>\nAdaLovelace\nAlanTuring\n</alphabetical_sorted>";
        assert_eq!(score(&[good], &truths, 4.0, true), 1.0);
        let bad = "<alphabetical_sorted>\nAlanTuring\n</alphabetical_sorted>";
        let worse_then_better = format!("{bad}{good}");
        assert_eq!(score(&[&worse_then_better], &truths, 4.0, true), 1.0, "strictly better retry counts");
        let better_then_worse = format!("{good}{bad}");
        assert_eq!(score(&[&better_then_worse], &truths, 4.0, true), 0.0, "a worse retry voids the turn");
        assert_eq!(score(&["no tags"], &truths, 4.0, true), 0.0);
    }

    #[test]
    fn the_reward_is_the_mean_of_the_turn_scores_with_the_power_per_turn() {
        let truths =
            vec![vec![String::from("AdaLovelace")], vec![String::from("AdaLovelace"), String::from("AlanTuring")]];
        let first = "<alphabetical_sorted>\nAdaLovelace\n</alphabetical_sorted>";
        let second = "<combined_alphabetical_sorted>\nAlanTuring\nAdaLovelace\n</combined_alphabetical_sorted>";
        let turns = turn_scores(&[first, second], &truths, 4.0, true);
        assert_eq!(turns[0], 1.0);
        assert!(turns[1] > 0.0 && turns[1] < 1.0, "{turns:?}");
        assert_eq!(score(&[first, second], &truths, 4.0, true), (turns[0] + turns[1]) / 2.0);
        // A turn the model never reached scores 0; without the power per turn it applies to the mean.
        assert_eq!(turn_scores(&[first], &truths, 4.0, true), vec![1.0, 0.0]);
        let plain = turn_scores(&[first, second], &truths, 4.0, false);
        assert_eq!(score(&[first, second], &truths, 4.0, false), ((plain[0] + plain[1]) / 2.0).powf(4.0));
    }

    #[test]
    fn with_gold_history_only_the_model_turns_count() {
        let truths =
            vec![vec![String::from("AdaLovelace")], vec![String::from("AdaLovelace"), String::from("AlanTuring")]];
        let gold = gold_answer(0, &truths[0]);
        let wrong = "<combined_alphabetical_sorted>\nAlanTuring\nAdaLovelace\n</combined_alphabetical_sorted>";
        let plain = model_turn_scores(&[&gold, wrong], &truths, 1, 4.0, false);
        assert_eq!(plain.len(), 1, "the gold turn is not the model's");
        assert!(plain[0] > 0.0 && plain[0] < 1.0, "{plain:?}");
        assert_eq!(model_turn_scores(&[&gold, wrong], &truths, 1, 4.0, true), vec![plain[0].powf(4.0)]);
        let right = gold_answer(1, &truths[1]);
        assert_eq!(model_turn_scores(&[&gold, &right], &truths, 1, 4.0, true), vec![1.0]);
        // Without history every turn is the model's.
        assert_eq!(model_turn_scores(&[&gold, &right], &truths, 0, 4.0, true), vec![1.0, 1.0]);
    }

    #[test]
    fn sort_by_fixes_the_key_and_leaves_the_rest_of_each_episode_alone() {
        let load = |sort_by: &str| {
            let args = json!({"num_examples": 40, "sort_by": sort_by, "seed": 3});
            AlphabetSort::new(args.as_object().unwrap()).unwrap().data.train
        };
        let (either, first, last) = (load("either"), load("first"), load("last"));
        let key = |ep: &Value| ep["user_turns"][0].as_str().unwrap().contains("by FIRST name");
        assert!(either.iter().any(key) && !either.iter().all(key), "a coin flip per episode");
        assert!(first.iter().all(key) && !last.iter().any(key));
        for ((e, f), l) in either.iter().zip(&first).zip(&last) {
            let same = if key(e) { f } else { l };
            assert_eq!(e, same, "the same episode with the key it drew");
        }
        let bad = AlphabetSort::new(json!({"sort_by": "middle"}).as_object().unwrap()).unwrap_err().to_string();
        assert!(bad.contains("env.args.sort_by") && bad.contains("either, first, last"), "{bad}");
    }

    #[test]
    fn given_order_repeats_each_turns_list_with_the_same_names() {
        let load = |sort_by: &str| {
            let args = json!({"num_examples": 40, "sort_by": sort_by, "seed": 3, "max_turns": 3});
            AlphabetSort::new(args.as_object().unwrap()).unwrap().data.train
        };
        let (either, given) = (load("either"), load("given"));
        let listed = |turn: &str| -> Vec<String> {
            let list = turn.split_once(": ").unwrap().1.split("\n\n").next().unwrap();
            list.split(", ").map(str::to_owned).collect()
        };
        for (e, g) in either.iter().zip(&given) {
            let turns: Vec<&str> = g["user_turns"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
            assert!(turns[0].starts_with("Repeat these names in the order given: "), "{}", turns[0]);
            for (t, turn) in turns.iter().enumerate() {
                let truth: Vec<String> = g["ground_truths"][t]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap().trim_end_matches(NEW_MARK).to_owned())
                    .collect();
                assert_eq!(truth, listed(turn), "turn {t}: the names as listed");
                let mut sorted_truth = truth.clone();
                sorted_truth.sort();
                let mut drawn: Vec<String> = e["ground_truths"][t]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap().trim_end_matches(NEW_MARK).to_owned())
                    .collect();
                drawn.sort();
                assert_eq!(sorted_truth, drawn, "turn {t}: the same names as the sorting episode");
            }
        }
        let bad = AlphabetSort::new(json!({"sort_by": "given", "first_share": 0.7}).as_object().unwrap());
        assert!(bad.unwrap_err().to_string().contains("env.args.first_share"));
    }

    #[test]
    fn first_share_sets_how_many_episodes_sort_by_first_name() {
        let load = |extra: Value| {
            let mut args = json!({"num_examples": 2000, "seed": 5});
            args.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            AlphabetSort::new(args.as_object().unwrap()).map(|env| env.data.train)
        };
        let key = |ep: &Value| ep["user_turns"][0].as_str().unwrap().contains("by FIRST name");
        let share = |eps: &[Value]| eps.iter().filter(|e| key(e)).count() as f64 / eps.len() as f64;
        // An even share is the coin of every dataset made before shares existed.
        assert_eq!(load(json!({})).unwrap(), load(json!({"first_share": 0.5})).unwrap());
        let (even, most) = (load(json!({})).unwrap(), load(json!({"first_share": 0.7})).unwrap());
        assert!(
            (share(&even) - 0.5).abs() < 0.04 && (share(&most) - 0.7).abs() < 0.04,
            "{} {}",
            share(&even),
            share(&most)
        );
        assert_eq!(share(&load(json!({"first_share": 1.0})).unwrap()), 1.0);
        assert_eq!(share(&load(json!({"first_share": 0.0})).unwrap()), 0.0);
        // Only the key moves: an episode keeps its names and turns whichever key it drew.
        let names = |ep: &Value| {
            ep["ground_truths"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let mut t: Vec<String> = serde_json::from_value(t.clone()).unwrap();
                    t.sort();
                    t
                })
                .collect::<Vec<_>>()
        };
        assert!(even.iter().zip(&most).all(|(a, b)| names(a) == names(b)));
        for (bad, why) in
            [(json!({"first_share": 1.5}), "[0, 1]"), (json!({"first_share": 0.7, "sort_by": "last"}), "either")]
        {
            let err = load(bad).unwrap_err().to_string();
            assert!(err.contains("env.args.first_share") && err.contains(why), "{err}");
        }
    }

    #[test]
    fn later_turns_mark_new_names_and_sort_everything() {
        let args = json!({"num_examples": 20, "min_turns": 2, "max_turns": 2, "min_names": 2, "max_names": 3});
        let env = AlphabetSort::new(args.as_object().unwrap()).unwrap();
        for ep in &env.data.train {
            let truths: Vec<Vec<String>> = serde_json::from_value(ep["ground_truths"].clone()).unwrap();
            assert_eq!(truths.len(), 2);
            assert!(truths[1].len() > truths[0].len());
            let marked = truths[1].iter().filter(|n| n.ends_with(NEW_MARK)).count();
            assert_eq!(marked, truths[1].len() - truths[0].len());
            assert!(ep["user_turns"][1].as_str().unwrap().contains("<combined_alphabetical_sorted>"));
        }
    }
}
