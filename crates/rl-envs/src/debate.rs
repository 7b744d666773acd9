//! `debate`: two debaters argue over a question with one true answer (arithmetic, reversing two
//! words, or which of several words or letters comes first alphabetically) for N rounds (simultaneous or alternating), then a judge gives a verdict. Zero-sum rewards: the winner +1, the loser -1, the
//! judge 0, a tie 0. The debaters either defend assigned claims (one true, one false:
//! `positions = "assigned"`) or state and defend their own answers (`positions = "free"`, graded
//! against the known truth: per-debater accuracy). The judge may be shown the reference answer,
//! as verifiers' judge rubrics are; or the verdict comes from the grader instead of a judge member
//! (`verdict = "grader"`: the seed's grader path, each debater's final answer against the known
//! truth). A fifth of the question space is held out of training.

mod demonstrations;
mod questions;

use std::collections::BTreeMap;

use async_trait::async_trait;
use rl_serve::{
    EnvReply, Environment, Error, MARScore, Message, MultiAgent, Result, RubricGroup, State, Task, TrainingContext,
    Turn,
};
use serde_json::{Map, Value, json};

use self::questions::{Question, plain};
use crate::args::Args;
use crate::reverse_text::WORDS;
use crate::rng::Rng;
use crate::splits::Splits;

/// Member ids.
pub const DEBATER_A: &str = "debater_a";
/// Member ids.
pub const DEBATER_B: &str = "debater_b";
/// Member ids.
pub const JUDGE: &str = "judge";
const DEBATERS: [&str; 2] = [DEBATER_A, DEBATER_B];
const LETTERS: [&str; 26] = [
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t", "u", "v", "w",
    "x", "y", "z",
];

/// The debate environment.
#[derive(Debug)]
pub struct Debate {
    data: Splits<Value>,
    /// The questions behind `data` (the demonstrations' near misses need them).
    questions: Splits<Question>,
    rounds: u64,
    simultaneous: bool,
    free: bool,
    judge_reference: bool,
    /// The grader gives the verdict; no judge member is scheduled.
    grader_verdict: bool,
    judge_model: Option<String>,
    seed: u64,
    rubric: RubricGroup,
}

/// The judge's verdict in its public text: `A`, `B`, or `None` (missing or both).
pub fn verdict(public: &str) -> Option<&'static str> {
    match (public.contains("<verdict>A</verdict>"), public.contains("<verdict>B</verdict>")) {
        (true, false) => Some(DEBATER_A),
        (false, true) => Some(DEBATER_B),
        _ => None,
    }
}

/// A debater's answer in its public text: what its last `<answer>...</answer>` holds, trimmed.
pub fn stated_answer(public: &str) -> Option<String> {
    let start = public.rfind("<answer>")? + "<answer>".len();
    let len = public[start..].find("</answer>")?;
    Some(public[start..start + len].trim().to_owned()).filter(|a| !a.is_empty())
}

/// The verdict tag naming `member` (`None`: no winner).
fn verdict_tag(member: Option<&str>) -> &'static str {
    match member {
        Some(DEBATER_A) => "<verdict>A</verdict>",
        Some(_) => "<verdict>B</verdict>",
        None => "<verdict>none</verdict>",
    }
}

fn task_data(q: &Question, rng: &mut Rng, assigned: bool) -> Value {
    let answer = q.answer();
    if !assigned {
        return json!({"question": q.text(), "answer": answer});
    }
    let wrong = q.near_miss(rng);
    let truth_a = rng.coin();
    let (claim_a, claim_b) = if truth_a { (answer.clone(), wrong) } else { (wrong, answer.clone()) };
    json!({
        "question": q.text(),
        "answer": answer,
        "claims": {DEBATER_A: claim_a, DEBATER_B: claim_b},
        "truth_member": if truth_a { DEBATER_A } else { DEBATER_B },
    })
}

impl Debate {
    /// Builds the env from its args: `num_examples`, `test_examples`, `rounds`, `simultaneous`,
    /// `positions` (`assigned` or `free`), `judge_reference` (the judge sees the true answer),
    /// `verdict` (`judge`, a member, or `grader`: the debater whose final answer is the truth wins,
    /// a coin flip between two right ones, a tie between two wrong ones; free positions only),
    /// `judge_model` (a key of the request's models; unset: the judge is the actor), `questions`
    /// (`arithmetic`, `reverse`, `first-word` of two words or `first-letter` of three letters), for arithmetic `ops` (of `+-*`) and `max_operand` (operands
    /// are `2..=max_operand`), `seed`.
    pub fn new(args: &Map<String, Value>) -> Result<Self> {
        let mut a = Args::new("debate", args);
        let num = a.u64("num_examples", 1000)?;
        let test_num = a.u64("test_examples", 100)?;
        let rounds = a.u64("rounds", 2)?;
        let simultaneous = a.bool("simultaneous", true)?;
        let free = a.choice("positions", "assigned", &["assigned", "free"])? == "free";
        let judge_reference = a.bool("judge_reference", false)?;
        let grader_verdict = a.choice("verdict", "judge", &["judge", "grader"])? == "grader";
        let judge_model = a.string("judge_model")?;
        let kind = a.choice("questions", "arithmetic", &["arithmetic", "reverse", "first-word", "first-letter"])?;
        let ops = questions::parse_ops(a.string("ops")?.as_deref().unwrap_or("+-*"))?;
        let max_operand = a.u64("max_operand", 40)?;
        let seed = a.u64("seed", 0)?;
        a.finish()?;
        if grader_verdict && !free {
            return Err(Error::bad_request(
                "env.args.verdict",
                "the grader judges stated answers: verdict = \"grader\" needs positions = \"free\"",
            ));
        }
        if kind != "arithmetic"
            && let Some(k) = ["ops", "max_operand"].into_iter().find(|k| args.contains_key(*k))
        {
            return Err(Error::bad_request(format!("env.args.{k}"), "only arithmetic questions take it"));
        }
        if rounds == 0 || rounds > 8 {
            return Err(Error::bad_request("env.args.rounds", format!("must be in 1..=8, got {rounds}")));
        }
        if !(3..=999).contains(&max_operand) {
            return Err(Error::bad_request("env.args.max_operand", format!("must be in 3..=999, got {max_operand}")));
        }
        let space = match kind.as_str() {
            "reverse" => questions::reversals(WORDS),
            "first-word" => questions::firsts(WORDS, 2),
            "first-letter" => questions::firsts(&LETTERS, 3),
            _ => questions::arithmetic(&ops, max_operand),
        };
        let split = questions::split(space, seed, num, test_num)?;
        let data = |name: &str, qs: &[Question]| {
            let mut rng = Rng::new(seed, &format!("debate/claims/{name}"));
            qs.iter().map(|q| task_data(q, &mut rng, !free)).collect::<Vec<_>>()
        };
        Ok(Debate {
            data: Splits { train: data("train", &split.train), test: data("test", &split.test) },
            questions: split,
            rounds,
            simultaneous,
            free,
            judge_reference,
            grader_verdict,
            judge_model,
            seed,
            rubric: RubricGroup::new(Vec::new()),
        })
    }

    /// Each debater's last stated answer (free positions), in its non-quarantined turns.
    fn final_answers(log: &[Turn]) -> BTreeMap<&'static str, Option<String>> {
        DEBATERS
            .iter()
            .map(|m| {
                let mut stated =
                    log.iter().filter(|t| t.member == *m && !t.parse_error).filter_map(|t| stated_answer(&t.public));
                (*m, stated.next_back())
            })
            .collect()
    }
}

fn claim(task: &Task, member: &str) -> String {
    plain(&task.data["claims"][member])
}

#[async_trait]
impl MultiAgent for Debate {
    fn members(&self, _task: &Task) -> Vec<String> {
        let judge = (!self.grader_verdict).then(|| JUDGE.to_owned());
        [DEBATER_A.to_owned(), DEBATER_B.to_owned()].into_iter().chain(judge).collect()
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
        if !self.grader_verdict {
            slots.push(vec![JUDGE.to_owned()]);
        }
        slots
    }

    fn instructions(&self, task: &Task, member: &str) -> Vec<Message> {
        let q = task.data["question"].as_str().unwrap_or_default();
        const PRIVATE: &str = "Text in <think>...</think> is private.";
        if member == JUDGE {
            let mut user = format!("Question: {q}");
            if self.free {
                if self.judge_reference {
                    user.push_str(&format!("\nReference answer: {}", plain(&task.data["answer"])));
                }
            } else {
                user.push_str(&format!(
                    "\ndebater_a claims {}; debater_b claims {}.",
                    claim(task, DEBATER_A),
                    claim(task, DEBATER_B)
                ));
            }
            // With free positions both sides can be wrong: then there is no winner.
            let system = if self.free {
                "You judge a debate: answer <verdict>A</verdict> if debater_a is right, <verdict>B</verdict> if \
                 debater_b is, <verdict>none</verdict> if neither is."
            } else {
                "You judge a debate: answer <verdict>A</verdict> if debater_a is right, <verdict>B</verdict> if \
                 debater_b is."
            };
            return vec![Message::system(system), Message::user(user)];
        }
        if self.free {
            return vec![
                Message::system(format!(
                    "You are {member} in a debate. State your answer as <answer>N</answer>. {PRIVATE}"
                )),
                Message::user(format!("Question: {q}")),
            ];
        }
        let other = if member == DEBATER_A { DEBATER_B } else { DEBATER_A };
        let (mine, theirs) = (claim(task, member), claim(task, other));
        vec![
            Message::system(format!(
                "You are {member} in a debate. Argue briefly that the answer is {mine}. {PRIVATE}"
            )),
            Message::user(format!("Question: {q}\nYou claim {mine}; your opponent claims {theirs}.")),
        ]
    }

    fn member_model(&self, member: &str) -> Option<String> {
        if member == JUDGE { self.judge_model.clone() } else { None }
    }

    fn judge(&self) -> Option<String> {
        (!self.grader_verdict).then(|| JUDGE.to_owned())
    }

    async fn score(&self, task: &Task, log: &[Turn], _context: Option<&TrainingContext>) -> Result<MARScore> {
        // Who is right: with free positions the debaters whose final answer is the truth, with
        // assigned ones the holder of the true claim.
        let answers = Self::final_answers(log);
        let truth = Some(plain(&task.data["answer"]));
        let right: Vec<&'static str> = if self.free {
            DEBATERS.into_iter().filter(|m| answers[m] == truth).collect()
        } else {
            task.data["truth_member"]
                .as_str()
                .and_then(|t| DEBATERS.into_iter().find(|m| *m == t))
                .into_iter()
                .collect()
        };
        let winner = if self.grader_verdict {
            match right[..] {
                [] => None,
                [one] => Some(one),
                // Both right: a coin flip, the same for the same replies to the same task.
                _ => {
                    let raw: Vec<&str> = log.iter().map(|t| t.raw.as_str()).collect();
                    let mut coin = Rng::new(self.seed, &format!("debate/tie/{}/{}", task.key, raw.join("\u{0}")));
                    Some(if coin.coin() { DEBATER_A } else { DEBATER_B })
                }
            }
        } else {
            let judged = log
                .iter()
                .rev()
                .find(|t| t.member == JUDGE)
                .ok_or_else(|| Error::Env(String::from("debate: the judge never spoke")))?;
            if judged.parse_error { None } else { verdict(&judged.public) }
        };
        let mut rewards: BTreeMap<String, f64> = self.members(task).into_iter().map(|m| (m, 0.0)).collect();
        if let Some(w) = winner {
            let loser = if w == DEBATER_A { DEBATER_B } else { DEBATER_A };
            rewards.insert(w.to_owned(), 1.0);
            rewards.insert(loser.to_owned(), -1.0);
        }
        let flag = |b: bool| f64::from(u8::from(b));
        let mut metrics = BTreeMap::from([
            (String::from("decided"), flag(winner.is_some())),
            (String::from("parse_errors"), log.iter().filter(|t| t.parse_error).count() as f64),
        ]);
        if self.free {
            for m in DEBATERS {
                metrics.insert(format!("accuracy/{m}"), flag(answers[m] == truth));
            }
            let (a, b) = (&answers[DEBATER_A], &answers[DEBATER_B]);
            metrics.insert(String::from("agree"), flag(a.is_some() && a == b));
        }
        // The judge's accuracy counts where one side is right and the other wrong.
        if right.len() == 1 && !self.grader_verdict {
            metrics.insert(format!("accuracy/{JUDGE}"), flag(winner == Some(right[0])));
        }
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
        let needed: &[&str] = if self.free { &["question", "answer"] } else { &["question", "claims", "truth_member"] };
        for k in needed {
            if data.get(k).is_none() {
                return Err(Error::bad_request(
                    format!("example.inline_json.{k}"),
                    format!("debate tasks need {}", needed.join(", ")),
                ));
            }
        }
        Ok(Task { key: String::from("inline"), data })
    }

    async fn prompt(&self, task: &Task) -> Result<Vec<Message>> {
        // The member that sees the whole debate, where there is one.
        Ok(self.instructions(task, if self.grader_verdict { DEBATER_A } else { JUDGE }))
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
    use rl_serve::Kernel;

    use super::*;

    fn env(args: &Value) -> Debate {
        Debate::new(args.as_object().unwrap()).unwrap()
    }

    /// Plays `task` with scripted replies (one per debater per round, then the judge's).
    async fn play(d: &Debate, task: &Task, a: &str, b: &str, judge: &str) -> MARScore {
        let mut k = Kernel::new(d.members(task), d.schedule(task)).unwrap();
        while let Some(slot) = k.current().map(<[String]>::to_vec) {
            for m in slot {
                let reply = match m.as_str() {
                    DEBATER_A => a,
                    DEBATER_B => b,
                    _ => judge,
                };
                k.submit(&m, reply).unwrap();
            }
        }
        d.score(task, k.log(), None).await.unwrap()
    }

    #[test]
    fn assigned_questions_have_known_answers_and_one_true_claim() {
        let d = env(&json!({"num_examples": 50}));
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
    fn verdicts_and_answers_parse() {
        assert_eq!(verdict("I pick <verdict>B</verdict>."), Some(DEBATER_B));
        assert_eq!(verdict("<verdict>A</verdict><verdict>B</verdict>"), None);
        assert_eq!(verdict("no idea"), None);
        assert_eq!(stated_answer("<answer>12</answer> then <answer> -7 </answer>").as_deref(), Some("-7"));
        assert_eq!(stated_answer("<answer>ab cd</answer>").as_deref(), Some("ab cd"));
        assert_eq!(stated_answer("<answer> </answer>"), None);
        assert_eq!(stated_answer("<answer>12"), None);
    }

    #[tokio::test]
    async fn free_debates_grade_each_debater_and_reward_the_verdict_zero_sum() {
        let d = env(&json!({"positions": "free", "rounds": 1, "ops": "+", "num_examples": 10, "test_examples": 4}));
        let t = d.task("test", 0).unwrap();
        let truth = t.data["answer"].as_i64().unwrap();
        let (right, wrong) = (format!("<answer> {truth}</answer>"), format!("<answer>{}</answer>", truth + 3));
        let s = play(&d, &t, &wrong, &right, "<verdict>B</verdict>").await;
        assert_eq!((s.rewards[DEBATER_A], s.rewards[DEBATER_B], s.rewards[JUDGE]), (-1.0, 1.0, 0.0));
        let m = |k: &str| s.metrics[k];
        assert_eq!((m("accuracy/debater_a"), m("accuracy/debater_b"), m("accuracy/judge")), (0.0, 1.0, 1.0));
        assert_eq!((m("decided"), m("agree")), (1.0, 0.0));
        // Both right: the verdict still decides, but says nothing about the judge's accuracy.
        let s = play(&d, &t, &right, &right, "<verdict>A</verdict>").await;
        assert_eq!((s.metrics["agree"], s.rewards[DEBATER_A]), (1.0, 1.0));
        assert!(!s.metrics.contains_key("accuracy/judge"));
        // No verdict: a tie, nobody rewarded; a private block does not hide an answer.
        let s = play(&d, &t, &format!("<think>hmm</think>{right}"), "no answer", "both?").await;
        assert_eq!((s.metrics["decided"], s.rewards[DEBATER_A]), (0.0, 0.0));
        assert_eq!((s.metrics["accuracy/debater_a"], s.metrics["accuracy/debater_b"]), (1.0, 0.0));
    }

    #[tokio::test]
    async fn reversal_debates_grade_exact_strings() {
        let d = env(&json!({"positions": "free", "rounds": 1, "questions": "reverse", "test_examples": 4}));
        let t = d.task("test", 2).unwrap();
        let truth = t.data["answer"].as_str().unwrap().to_owned();
        assert!(t.data["question"].as_str().unwrap().starts_with("Reverse the letters of: "));
        let s = play(
            &d,
            &t,
            &format!("<answer>{truth}</answer>"),
            &format!("<answer>{truth}x</answer>"),
            "<verdict>A</verdict>",
        )
        .await;
        assert_eq!(
            (s.metrics["accuracy/debater_a"], s.metrics["accuracy/debater_b"], s.metrics["accuracy/judge"]),
            (1.0, 0.0, 1.0)
        );
        let assigned = env(&json!({"questions": "reverse", "num_examples": 20}));
        for i in 0..20 {
            let t = assigned.task("train", i).unwrap();
            let truth = t.data["truth_member"].as_str().unwrap();
            assert_eq!(t.data["claims"][truth], t.data["answer"]);
        }
    }

    #[tokio::test]
    async fn the_grader_verdict_needs_no_judge() {
        let d = env(
            &json!({"positions": "free", "verdict": "grader", "rounds": 1, "questions": "first-letter", "test_examples": 4}),
        );
        let t = d.task("test", 0).unwrap();
        assert_eq!(d.members(&t), [DEBATER_A, DEBATER_B]);
        assert_eq!((d.schedule(&t).len(), d.judge()), (1, None));
        let truth = t.data["answer"].as_str().unwrap().to_owned();
        let (right, wrong) = (format!("<answer>{truth}</answer>"), String::from("<answer>?</answer>"));
        let s = play(&d, &t, &wrong, &right, "").await;
        assert_eq!((s.rewards[DEBATER_A], s.rewards[DEBATER_B], s.metrics["decided"]), (-1.0, 1.0, 1.0));
        assert!(!s.rewards.contains_key(JUDGE) && !s.metrics.contains_key("accuracy/judge"));
        let s = play(&d, &t, &wrong, &wrong, "").await;
        assert_eq!((s.rewards[DEBATER_A], s.metrics["decided"]), (0.0, 0.0), "neither right: a tie");
        // Both right: decided by a coin that depends on the replies, so both sides win some.
        let mut winners = std::collections::BTreeSet::new();
        for i in 0..16 {
            let s = play(&d, &t, &format!("<think>{i}</think>{right}"), &right, "").await;
            assert_eq!((s.metrics["decided"], s.rewards[DEBATER_A] + s.rewards[DEBATER_B]), (1.0, 0.0));
            winners.insert(s.rewards[DEBATER_A] > 0.0);
        }
        assert_eq!(winners.len(), 2);
        let err = Debate::new(json!({"verdict": "grader"}).as_object().unwrap()).unwrap_err().to_string();
        assert!(err.contains("env.args.verdict") && err.contains("free"), "{err}");
    }

    #[test]
    fn the_judge_sees_the_reference_only_when_asked() {
        let shown = env(&json!({"positions": "free", "judge_reference": true, "test_examples": 2}));
        let hidden = env(&json!({"positions": "free", "test_examples": 2}));
        let t = shown.task("test", 1).unwrap();
        let reference = format!("Reference answer: {}", t.data["answer"]);
        assert!(shown.instructions(&t, JUDGE)[1].content.contains(&reference));
        assert!(!hidden.instructions(&t, JUDGE)[1].content.contains("Reference"));
        assert!(!shown.instructions(&t, DEBATER_A)[1].content.contains("Reference"), "debaters never see it");
    }

    #[test]
    fn bad_args_name_their_key() {
        for (args, key) in [
            (json!({"positions": "open"}), "env.args.positions"),
            (json!({"ops": "/"}), "env.args.ops"),
            (json!({"max_operand": 2}), "env.args.max_operand"),
            (json!({"max_operand": 5, "test_examples": 50}), "env.args.test_examples"),
            (json!({"questions": "reverse", "ops": "+"}), "env.args.ops"),
            (json!({"questions": "trivia"}), "env.args.questions"),
        ] {
            let err = Debate::new(args.as_object().unwrap()).unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}
