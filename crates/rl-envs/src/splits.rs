//! The train and test datasets every built-in env has, with the lookups every env needs.

use rl_serve::{Result, Task, check_index};
use serde_json::Value;

/// A dataset per split.
#[derive(Debug, Clone)]
pub(crate) struct Splits<T> {
    pub(crate) train: Vec<T>,
    pub(crate) test: Vec<T>,
}

impl<T> Splits<T> {
    /// The items of `name` (`test`, else `train`).
    pub(crate) fn get(&self, name: &str) -> &[T] {
        if name == "test" { &self.test } else { &self.train }
    }

    /// Split names and sizes, for `Info`.
    pub(crate) fn sizes(&self) -> Vec<(String, u64)> {
        vec![(String::from("train"), self.train.len() as u64), (String::from("test"), self.test.len() as u64)]
    }

    /// Item `index` of `split`; a bad split or index is a bad request naming the field.
    pub(crate) fn at(&self, split: &str, index: u64) -> Result<&T> {
        check_index(split, &["train", "test"], index, self.get(split).len() as u64)?;
        Ok(&self.get(split)[index as usize])
    }
}

impl Splits<Value> {
    /// The task at `index` of `split`, keyed `split/index`, for envs whose items are task data.
    pub(crate) fn task(&self, split: &str, index: u64) -> Result<Task> {
        Ok(Task { key: format!("{split}/{index}"), data: self.at(split, index)?.clone() })
    }
}
