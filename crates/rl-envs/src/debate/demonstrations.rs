//! Demonstrations for the debate's supervised warm start (free positions): debates played by the
//! kernel with scripted replies, so each conversation is exactly a member's view in RL. A
//! debater states the true answer whatever its opponent says; the judge picks the debater that is
//! right, either one where both are (so a sampling judge breaks such ties at random), and no one
//! where neither is (a tie: the verdict only ever rewards being right).

use rl_serve::{Error, Kernel, Message, MultiAgent, Result, Role, Task};

use serde_json::Value;

use super::questions::plain;
use super::{DEBATER_A, DEBATER_B, DEBATERS, Debate, JUDGE, verdict_tag};
use crate::rng::Rng;

impl Debate {
    /// Two conversations per question of `split`: one debater's (which one alternates) and the
    /// judge's (none where the grader gives the verdict). Free positions only: an assigned claim is not something to imitate.
    pub fn sft_conversations(&self, split: &str) -> Result<Vec<Vec<Message>>> {
        if !self.free {
            return Err(Error::bad_request(
                "data.args.positions",
                "debate demonstrations state the true answer: set positions = \"free\"",
            ));
        }
        let mut rng = Rng::new(self.seed, &format!("debate/demonstrations/{split}"));
        let mut out = Vec::new();
        for (i, (data, question)) in self.data.get(split).iter().zip(self.questions.get(split)).enumerate() {
            let task = Task { key: format!("{split}/{i}"), data: data.clone() };
            let truth = question.answer();
            // An answer that is either the truth or a near miss, at even odds.
            let maybe_right = |rng: &mut Rng| if rng.coin() { truth.clone() } else { question.near_miss(rng) };
            // The debater's demonstration: the truth against a right or wrong opponent.
            let member = DEBATERS[i % 2];
            let opponent = maybe_right(&mut rng);
            let answers = if member == DEBATER_A { [truth.clone(), opponent] } else { [opponent, truth.clone()] };
            let kernel = self.scripted(&task, &answers)?;
            let mut view = kernel.view(member, &self.instructions(&task, member));
            let last_own = view.iter().rposition(|m| m.role == Role::Assistant).unwrap_or(view.len());
            view.truncate(last_own + 1);
            out.push(view);
            // The judge's (where a judge speaks): each debater right or wrong at even odds.
            if self.grader_verdict {
                continue;
            }
            let answers = [maybe_right(&mut rng), maybe_right(&mut rng)];
            let right: Vec<&str> =
                DEBATERS.into_iter().zip(&answers).filter(|(_, a)| **a == truth).map(|(m, _)| m).collect();
            let pick = match right.len() {
                0 => None,
                1 => Some(right[0]),
                _ => Some(if rng.coin() { DEBATER_A } else { DEBATER_B }),
            };
            let kernel = self.scripted(&task, &answers)?;
            let mut view = kernel.view(JUDGE, &self.instructions(&task, JUDGE));
            view.push(Message::assistant(verdict_tag(pick)));
            out.push(view);
        }
        Ok(out)
    }

    /// The debaters' slots of `task` played with fixed answers (debater_a's, debater_b's).
    fn scripted(&self, task: &Task, answers: &[Value; 2]) -> Result<Kernel> {
        let protocol = |e: rl_serve::ProtocolError| Error::Env(format!("debate demonstration: {e}"));
        let mut k = Kernel::new(self.members(task), self.schedule(task)).map_err(protocol)?;
        while let Some(slot) = k.current().map(<[String]>::to_vec) {
            if slot.iter().any(|m| m == JUDGE) {
                break;
            }
            for m in slot {
                let answer = plain(if m == DEBATER_A { &answers[0] } else { &answers[1] });
                k.submit(&m, &format!("<answer>{answer}</answer>")).map_err(protocol)?;
            }
        }
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use rl_serve::Environment;
    use serde_json::json;

    use super::*;
    use crate::debate::{stated_answer, verdict};

    #[tokio::test]
    async fn demonstrations_are_views_that_score_as_intended() {
        for (rounds, questions) in
            [(1, "arithmetic"), (2, "arithmetic"), (1, "reverse"), (1, "first-word"), (1, "first-letter")]
        {
            let args = json!({"positions": "free", "rounds": rounds, "simultaneous": rounds == 1, "questions": questions, "num_examples": 40, "test_examples": 8});
            let d = Debate::new(args.as_object().unwrap()).unwrap();
            let convs = d.sft_conversations("train").unwrap();
            assert_eq!(convs.len(), 80);
            assert_eq!(d.sft_conversations("test").unwrap().len(), 16);
            for (i, c) in convs.iter().enumerate() {
                let task = d.task("train", (i / 2) as u64).unwrap();
                let truth = Some(plain(&task.data["answer"]));
                let last = c.last().unwrap();
                assert_eq!(last.role, Role::Assistant);
                if i % 2 == 0 {
                    // A debater: its instructions first (an alternating debater_b has heard
                    // debater_a by its first turn), every reply of it the truth.
                    let member = DEBATERS[(i / 2) % 2];
                    let instructions = d.instructions(&task, member);
                    assert_eq!(c[0], instructions[0]);
                    assert!(c[1].content.starts_with(&instructions[1].content));
                    let own: Vec<_> = c.iter().filter(|m| m.role == Role::Assistant).collect();
                    assert_eq!(own.len(), rounds as usize);
                    assert!(own.iter().all(|m| stated_answer(&m.content) == truth));
                } else {
                    // The judge: picks a right debater whenever exactly one is.
                    let seen = &c[1].content;
                    let said = |m: &str| {
                        let line = seen.lines().rev().find(|l| l.starts_with(&format!("[{m}]"))).unwrap();
                        stated_answer(line)
                    };
                    let pick = verdict(&last.content);
                    let (a, b) = (said(DEBATER_A) == truth, said(DEBATER_B) == truth);
                    match (a, b) {
                        (false, false) => assert_eq!(last.content, "<verdict>none</verdict>"),
                        (true, true) => assert!(pick.is_some()),
                        _ => assert_eq!(pick, Some(if a { DEBATER_A } else { DEBATER_B })),
                    }
                }
            }
        }
        let graded = json!({"positions": "free", "verdict": "grader", "num_examples": 10, "test_examples": 2});
        let graded = Debate::new(graded.as_object().unwrap()).unwrap().sft_conversations("train").unwrap();
        assert_eq!(graded.len(), 10, "no judge to demonstrate");
        let assigned = Debate::new(json!({}).as_object().unwrap()).unwrap();
        assert!(assigned.sft_conversations("train").unwrap_err().to_string().contains("positions"));
    }
}
