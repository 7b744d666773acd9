//! The debate's questions, each with one true answer: integer arithmetic (each operator over every
//! pair of operands), reversing the letters of two words (every ordered pair of distinct words),
//! or which of several options comes first alphabetically (every ordered pair of distinct words,
//! or every ordered triple of distinct letters). A fifth of the space is held out of every training split, so greedy accuracy on the
//! test split measures answers to questions never trained on (in SFT or RL).

use rl_serve::{Error, Result};
use serde_json::Value;

use crate::rng::Rng;
use crate::splits::Splits;

/// One question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Question {
    /// `a op b`.
    Arithmetic { op: char, a: i64, b: i64 },
    /// The letters of `text` in reverse order.
    Reverse { text: String },
    /// Which of the options comes first alphabetically.
    First { options: Vec<String> },
}

impl Question {
    /// The question as the members read it.
    pub(crate) fn text(&self) -> String {
        match self {
            Question::Arithmetic { op, a, b } => format!("What is {a} {op} {b}?"),
            Question::Reverse { text } => format!("Reverse the letters of: {text}"),
            Question::First { options } => {
                let (last, rest) = options.split_last().expect("a question has options");
                format!("Which comes first alphabetically: {} or {last}?", rest.join(", "))
            }
        }
    }

    /// The true answer (a number for arithmetic, a string otherwise).
    pub(crate) fn answer(&self) -> Value {
        match self {
            Question::Arithmetic { op: '+', a, b } => Value::from(a + b),
            Question::Arithmetic { op: '-', a, b } => Value::from(a - b),
            Question::Arithmetic { a, b, .. } => Value::from(a * b),
            Question::Reverse { text } => Value::from(text.chars().rev().collect::<String>()),
            Question::First { options } => Value::from(options.iter().min().map_or("", String::as_str)),
        }
    }

    /// A wrong answer close to the true one: off by 1-10, two neighbouring letters swapped, or
    /// another option.
    pub(crate) fn near_miss(&self, rng: &mut Rng) -> Value {
        let answer = self.answer();
        if let Question::First { options } = self {
            let others: Vec<&String> = options.iter().filter(|o| answer != o.as_str()).collect();
            return Value::from(rng.choose(&others).as_str());
        }
        if let Some(n) = answer.as_i64() {
            return Value::from(n + rng.range(1, 10) as i64 * if rng.coin() { 1 } else { -1 });
        }
        let mut chars: Vec<char> = plain(&answer).chars().collect();
        // Pairs of different neighbours (every two-word text has one, at the space).
        let pairs: Vec<usize> = (0..chars.len().saturating_sub(1)).filter(|&i| chars[i] != chars[i + 1]).collect();
        let i = *rng.choose(&pairs);
        chars.swap(i, i + 1);
        Value::from(chars.into_iter().collect::<String>())
    }
}

/// An answer as written: strings without quotes, numbers as digits.
pub(crate) fn plain(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// Checks an `ops` argument: a non-empty string of distinct `+`, `-`, `*`.
pub(crate) fn parse_ops(ops: &str) -> Result<Vec<char>> {
    let mut out: Vec<char> = Vec::new();
    for c in ops.chars() {
        if !"+-*".contains(c) || out.contains(&c) {
            return Err(Error::bad_request(
                "env.args.ops",
                format!("debate expects distinct operators among `+`, `-`, `*`, got {ops:?}"),
            ));
        }
        out.push(c);
    }
    if out.is_empty() {
        return Err(Error::bad_request("env.args.ops", "debate needs at least one operator"));
    }
    Ok(out)
}

/// Every arithmetic question over `ops` and operands `2..=max_operand`.
pub(crate) fn arithmetic(ops: &[char], max_operand: u64) -> Vec<Question> {
    let hi = max_operand as i64;
    ops.iter()
        .flat_map(|&op| (2..=hi).flat_map(move |a| (2..=hi).map(move |b| Question::Arithmetic { op, a, b })))
        .collect()
}

/// Every reversal of two distinct words of `words`.
pub(crate) fn reversals(words: &[&str]) -> Vec<Question> {
    words
        .iter()
        .flat_map(|a| {
            words.iter().filter(move |b| *b != a).map(move |b| Question::Reverse { text: format!("{a} {b}") })
        })
        .collect()
}

/// Every ordered `n`-tuple of distinct `options`, as a which-comes-first question.
pub(crate) fn firsts(options: &[&str], n: usize) -> Vec<Question> {
    let mut tuples: Vec<Vec<String>> = vec![Vec::new()];
    for _ in 0..n {
        tuples = tuples
            .into_iter()
            .flat_map(|t| {
                options
                    .iter()
                    .filter(|o| !t.iter().any(|x| x == *o))
                    .map(|o| [t.clone(), vec![(*o).to_owned()]].concat())
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    tuples.into_iter().map(|options| Question::First { options }).collect()
}

/// Splits `all`: shuffled with `seed`, its first fifth is held out (the test split is its first
/// `test_n`, whatever `test_n`, so a validation set and a larger eval set of one seed never meet
/// the training data); `train_n` training questions are drawn from the rest.
pub(crate) fn split(mut all: Vec<Question>, seed: u64, train_n: u64, test_n: u64) -> Result<Splits<Question>> {
    Rng::new(seed, "debate/held-out").shuffle(&mut all);
    let held_out = all.len() / 5;
    if test_n as usize > held_out {
        return Err(Error::bad_request(
            "env.args.test_examples",
            format!("debate holds out {held_out} of its {} questions; test_examples is {test_n}", all.len()),
        ));
    }
    let test = all[..test_n as usize].to_vec();
    let rest = &all[held_out..];
    let mut rng = Rng::new(seed, "debate/train");
    let train = (0..train_n).map(|_| rng.choose(rest).clone()).collect();
    Ok(Splits { train, test })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn held_out_questions_never_train_whatever_the_test_size() {
        let all = || arithmetic(&parse_ops("+-").unwrap(), 20);
        let small = split(all(), 3, 5000, 32).unwrap();
        let large = split(all(), 3, 5000, 64).unwrap();
        assert_eq!(small.test[..], large.test[..32], "a smaller test split is a prefix of a larger one");
        let train: BTreeSet<String> = small.train.iter().chain(&large.train).map(Question::text).collect();
        assert!(large.test.iter().all(|q| !train.contains(&q.text())));
        assert!(train.len() > 400, "training draws from the whole rest: {}", train.len());
        let words = split(reversals(&["ab", "cd", "ef", "gh", "ij", "kl"]), 0, 100, 6).unwrap();
        assert!(words.test.iter().all(|q| !words.train.contains(q)));
    }

    #[test]
    fn answers_and_near_misses() {
        assert_eq!(Question::Arithmetic { op: '-', a: 3, b: 9 }.answer(), -6);
        assert_eq!(Question::Arithmetic { op: '*', a: 3, b: 9 }.text(), "What is 3 * 9?");
        let q = Question::Reverse { text: String::from("sun sea") };
        assert_eq!(q.answer(), "aes nus");
        let mut rng = Rng::new(0, "t");
        for _ in 0..20 {
            let miss = plain(&q.near_miss(&mut rng));
            assert!(miss != "aes nus" && miss.len() == 7 && miss.chars().filter(|c| *c == 'a').count() == 1, "{miss}");
            let miss = Question::Arithmetic { op: '+', a: 3, b: 9 }.near_miss(&mut rng).as_i64().unwrap();
            assert!(miss != 12 && miss.abs_diff(12) <= 10, "{miss}");
            assert_ne!(Question::Reverse { text: String::from("aa bb") }.near_miss(&mut rng), "bb aa");
        }
        let q = Question::First { options: vec![String::from("sun"), String::from("sea")] };
        assert_eq!((q.answer(), q.near_miss(&mut rng)), (Value::from("sea"), Value::from("sun")));
        assert_eq!(q.text(), "Which comes first alphabetically: sun or sea?");
        assert_eq!(firsts(&["a", "b", "c"], 2).len(), 6);
        let triples = firsts(&["q", "d", "m", "x"], 3);
        assert_eq!(triples.len(), 24);
        assert_eq!(triples[0].text(), "Which comes first alphabetically: q, d or m?");
        assert_eq!(triples[0].answer(), "d");
        assert!((0..20).all(|_| ["q", "m"].contains(&plain(&triples[0].near_miss(&mut rng)).as_str())));
        assert_eq!(plain(&Value::from("x y")), "x y");
        assert_eq!(plain(&Value::from(-4)), "-4");
    }

    #[test]
    fn bad_ops_and_oversized_test_splits_are_refused() {
        assert!(parse_ops("").is_err());
        assert!(parse_ops("++").is_err());
        assert!(parse_ops("+/").unwrap_err().to_string().contains("env.args.ops"));
        let err = split(arithmetic(&['+'], 5), 0, 10, 100).unwrap_err().to_string();
        assert!(err.contains("test_examples") && err.contains("holds out 3 of its 16"), "{err}");
    }
}
