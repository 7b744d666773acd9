//! `debate`: two debaters argue for different answers to an arithmetic question over N rounds
//! (simultaneous or alternating), then a judge gives a verdict. Zero-sum rewards: the winner +1,
//! the loser -1, the judge 0, a tie 0. Questions come from a seed with known answers, so the
//! debater defending the truth (`truth_member`) is known and the judge's accuracy is a metric.

use std::collections::BTreeMap;

use async_trait::async_trait;
use rl_serve::{
    EnvReply, Environment, Error, MARScore, Message, MultiAgent, Result, RubricGroup, State, Task, TrainingContext,
    Turn,
};
use serde_json::{Map, Value, json};

use crate::args::Args;
use crate::rng::Rng;
use crate::splits::Splits;

/// Member ids.
pub const DEBATER_A: &str = "debater_a";
/// Member ids.
pub const DEBATER_B: &str = "debater_b";
/// Member ids.
pub const JUDGE: &str = "judge";

/// The debate environment.
#[derive(Debug)]
pub struct Debate {
    data: Splits<Value>,
    rounds: u64,
    simultaneous: bool,
    judge_model: Option<String>,
    rubric: RubricGroup,
}

fn question(rng: &mut Rng) -> Value {
    let (a, b) = (rng.range(2, 40) as i64, rng.range(2, 40) as i64);
    let (text, answer) = match rng.range(0, 2) {
        0 => (format!("What is {a} + {b}?"), a + b),
        1 => (format!("What is {a} - {b}?"), a - b),
        _ => (format!("What is {a} * {b}?"), a * b),
    };
    let delta = rng.range(1, 5) as i64 * if rng.coin() { 1 } else { -1 };
    let truth_a = rng.coin();
    let (claim_a, claim_b) = if truth_a { (answer, answer + delta) } else { (answer + delta, answer) };
    json!({
        "question": text,
        "answer": answer,
        "claims": {DEBATER_A: claim_a, DEBATER_B: claim_b},
        "truth_member": if truth_a { DEBATER_A } else { DEBATER_B },
    })
}

/// The judge's verdict in its public text: `A`, `B`, or `None` (missing or both).
pub fn verdict(public: &str) -> Option<&'static str> {
    match (public.contains("<verdict>A</verdict>"), public.contains("<verdict>B</verdict>")) {
        (true, false) => Some(DEBATER_A),
        (false, true) => Some(DEBATER_B),
        _ => None,
    }
}

impl Debate {
    /// Builds the env from its args: `num_examples`, `test_examples`, `rounds`, `simultaneous`,
    /// `judge_model` (a key of the request's models; unset: the judge is the actor), `seed`.
    pub fn new(args: &Map<String, Value>) -> Result<Self> {
        let mut a = Args::new("debate", args);
        let num = a.u64("num_examples", 1000)?;
        let test_num = a.u64("test_examples", 100)?;
        let rounds = a.u64("rounds", 2)?;
        let simultaneous = a.bool("simultaneous", true)?;
        let judge_model = a.string("judge_model")?;
        let seed = a.u64("seed", 0)?;
        if rounds == 0 || rounds > 8 {
            return Err(Error::bad_request("env.args.rounds", format!("must be in 1..=8, got {rounds}")));
        }
        a.finish()?;
        let gen_split = |stream: &str, n: u64| {
            let mut rng = Rng::new(seed, stream);
            (0..n).map(|_| question(&mut rng)).collect::<Vec<_>>()
        };
        Ok(Debate {
            data: Splits { train: gen_split("debate/train", num), test: gen_split("debate/test", test_num) },
            rounds,
            simultaneous,
            judge_model,
            rubric: RubricGroup::new(Vec::new()),
        })
    }
}

fn claim(task: &Task, member: &str) -> String {
    task.data["claims"][member].to_string()
}

#[async_trait]
impl MultiAgent for Debate {
    fn members(&self, _task: &Task) -> Vec<String> {
        vec![DEBATER_A.to_owned(), DEBATER_B.to_owned(), JUDGE.to_owned()]
    }

    fn schedule(&self, _task: &Task) -> Vec<Vec<String>> {
        let (a, b) = (DEBATER_A.to_owned(), DEBATER_B.to_owned());
        let mut slots = Vec::new();
        for _ in 0..self.rounds {
            if self.simultaneous {
                slots.push(vec![a.clone(), b.clone()]);
            } else {
                slots.push(vec![a.clone()]);
                slots.push(vec![b.clone()]);
            }
        }
        slots.push(vec![JUDGE.to_owned()]);
        slots
    }

    fn instructions(&self, task: &Task, member: &str) -> Vec<Message> {
        let q = task.data["question"].as_str().unwrap_or_default();
        let (a, b) = (claim(task, DEBATER_A), claim(task, DEBATER_B));
        if member == JUDGE {
            return vec![
                Message::system(
                    "You judge a debate. When it ends, answer <verdict>A</verdict> if debater_a is right or \
                     <verdict>B</verdict> if debater_b is right.",
                ),
                Message::user(format!("Question: {q}\ndebater_a claims {a}; debater_b claims {b}.")),
            ];
        }
        let (mine, theirs) = if member == DEBATER_A { (a, b) } else { (b, a) };
        vec![
            Message::system(format!(
                "You are {member} in a debate. Argue briefly that the answer is {mine}. Text inside \
                 <think>...</think> is private; everything else is shown to the others."
            )),
            Message::user(format!("Question: {q}\nYou claim {mine}; your opponent claims {theirs}.")),
        ]
    }

    fn member_model(&self, member: &str) -> Option<String> {
        if member == JUDGE { self.judge_model.clone() } else { None }
    }

    fn judge(&self) -> Option<String> {
        Some(JUDGE.to_owned())
    }

    async fn score(&self, task: &Task, log: &[Turn], _context: Option<&TrainingContext>) -> Result<MARScore> {
        let judged = log
            .iter()
            .rev()
            .find(|t| t.member == JUDGE)
            .ok_or_else(|| Error::Env(String::from("debate: the judge never spoke")))?;
        let winner = if judged.parse_error { None } else { verdict(&judged.public) };
        let truth = task.data["truth_member"].as_str().unwrap_or_default();
        let mut rewards =
            BTreeMap::from([(DEBATER_A.to_owned(), 0.0), (DEBATER_B.to_owned(), 0.0), (JUDGE.to_owned(), 0.0)]);
        if let Some(w) = winner {
            let loser = if w == DEBATER_A { DEBATER_B } else { DEBATER_A };
            rewards.insert(w.to_owned(), 1.0);
            rewards.insert(loser.to_owned(), -1.0);
        }
        let metrics = BTreeMap::from([
            (String::from("tie"), f64::from(u8::from(winner.is_none()))),
            (String::from("judge_correct"), f64::from(u8::from(winner == Some(truth)))),
            (String::from("parse_errors"), log.iter().filter(|t| t.parse_error).count() as f64),
        ]);
        Ok(MARScore { rewards, metrics })
    }
}

#[async_trait]
impl Environment for Debate {
    fn id(&self) -> &str {
        "debate"
    }

    fn splits(&self) -> Vec<(String, u64)> {
        self.data.sizes()
    }

    fn task(&self, split: &str, index: u64) -> Result<Task> {
        self.data.task(split, index)
    }

    fn inline_task(&self, data: Value) -> Result<Task> {
        for k in ["question", "claims", "truth_member"] {
            if data.get(k).is_none() {
                return Err(Error::bad_request(
                    format!("example.inline_json.{k}"),
                    "debate tasks need question, claims, truth_member",
                ));
            }
        }
        Ok(Task { key: String::from("inline"), data })
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        Ok(self.instructions(task, JUDGE))
    }

    async fn env_response(&self, _task: &Task, _state: &mut State) -> Result<EnvReply> {
        Err(Error::Env(String::from("debate is multi-agent: its episodes run through the multi-agent kernel")))
    }

    fn rubric(&self) -> &RubricGroup {
        &self.rubric
    }

    fn multi_agent(&self) -> Option<&dyn MultiAgent> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_have_known_answers_and_one_true_claim() {
        let d = Debate::new(json!({"num_examples": 50}).as_object().unwrap()).unwrap();
        for i in 0..50 {
            let t = d.task("train", i).unwrap();
            let truth = t.data["truth_member"].as_str().unwrap();
            assert_eq!(t.data["claims"][truth], t.data["answer"]);
            let other = if truth == DEBATER_A { DEBATER_B } else { DEBATER_A };
            assert_ne!(t.data["claims"][other], t.data["answer"]);
        }
        assert_eq!(d.schedule(&d.task("train", 0).unwrap()).len(), 3, "2 simultaneous rounds + the judge");
    }

    #[test]
    fn verdicts_parse_and_rewards_are_zero_sum() {
        assert_eq!(verdict("I pick <verdict>B</verdict>."), Some(DEBATER_B));
        assert_eq!(verdict("<verdict>A</verdict><verdict>B</verdict>"), None);
        assert_eq!(verdict("no idea"), None);
    }
}
