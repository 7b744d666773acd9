//! Reads an environment's `args` table with defaults, rejecting unknown keys and wrong types.

use std::collections::BTreeSet;

use rl_serve::{Error, Result};
use serde_json::{Map, Value};

/// Typed access to an env's args; call [`Args::finish`] to reject keys nobody read.
#[derive(Debug)]
pub(crate) struct Args<'a> {
    env: &'static str,
    map: &'a Map<String, Value>,
    read: BTreeSet<&'static str>,
}

impl<'a> Args<'a> {
    pub(crate) fn new(env: &'static str, map: &'a Map<String, Value>) -> Self {
        Args { env, map, read: BTreeSet::new() }
    }

    fn field(&self, key: &str) -> String {
        format!("env.args.{key}")
    }

    pub(crate) fn u64(&mut self, key: &'static str, default: u64) -> Result<u64> {
        self.read.insert(key);
        match self.map.get(key) {
            None => Ok(default),
            Some(v) => v.as_u64().ok_or_else(|| {
                Error::bad_request(self.field(key), format!("{} expects a non-negative integer, got {v}", self.env))
            }),
        }
    }

    pub(crate) fn f64(&mut self, key: &'static str, default: f64) -> Result<f64> {
        self.read.insert(key);
        match self.map.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_f64()
                .filter(|f| f.is_finite())
                .ok_or_else(|| Error::bad_request(self.field(key), format!("{} expects a number, got {v}", self.env))),
        }
    }

    pub(crate) fn bool(&mut self, key: &'static str, default: bool) -> Result<bool> {
        self.read.insert(key);
        match self.map.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| {
                Error::bad_request(self.field(key), format!("{} expects true or false, got {v}", self.env))
            }),
        }
    }

    /// An optional string.
    pub(crate) fn string(&mut self, key: &'static str) -> Result<Option<String>> {
        self.read.insert(key);
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
            Some(v) => {
                Err(Error::bad_request(self.field(key), format!("{} expects a non-empty string, got {v}", self.env)))
            }
        }
    }

    /// A string that must be one of `choices`.
    pub(crate) fn choice(&mut self, key: &'static str, default: &str, choices: &[&str]) -> Result<String> {
        self.read.insert(key);
        match self.map.get(key) {
            None => Ok(default.to_owned()),
            Some(Value::String(s)) if choices.contains(&s.as_str()) => Ok(s.clone()),
            Some(v) => Err(Error::bad_request(
                self.field(key),
                format!("{} expects one of {}, got {v}", self.env, choices.join(", ")),
            )),
        }
    }

    /// The value of `key` as given, if any (for tables passed on unchanged).
    pub(crate) fn raw(&mut self, key: &'static str) -> Option<&'a Value> {
        self.read.insert(key);
        self.map.get(key)
    }

    /// A list of non-empty strings (empty when absent).
    pub(crate) fn strings(&mut self, key: &'static str) -> Result<Vec<String>> {
        self.read.insert(key);
        let bad = |v: &Value| {
            Error::bad_request(format!("env.args.{key}"), format!("{} expects a list of strings, got {v}", self.env))
        };
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned).ok_or_else(|| bad(v)))
                .collect(),
            Some(v) => Err(bad(v)),
        }
    }

    /// Fails on any key that was not read.
    pub(crate) fn finish(self) -> Result<()> {
        if let Some(unknown) = self.map.keys().find(|k| !self.read.contains(k.as_str())) {
            let known: Vec<&str> = self.read.iter().copied().collect();
            return Err(Error::bad_request(
                self.field(unknown),
                format!("{} has no argument `{unknown}`; it takes {}", self.env, known.join(", ")),
            ));
        }
        Ok(())
    }

    /// Checks `lo <= hi` for a pair of arguments.
    pub(crate) fn ordered(&self, lo_key: &str, lo: u64, hi_key: &str, hi: u64) -> Result<()> {
        if lo > hi {
            return Err(Error::bad_request(self.field(lo_key), format!("{lo_key} ({lo}) must be <= {hi_key} ({hi})")));
        }
        Ok(())
    }
}
