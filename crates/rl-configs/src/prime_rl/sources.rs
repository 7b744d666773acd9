//! prime-rl's sources (verifiers `[env]` tables) as `verifiers` envs, with their eval keys,
//! `serve` and curriculum.

use serde_json::{Map, Value, json};

use super::shared::{Notes, algorithm, extra_body};
use crate::deprecated::join;
use crate::error::{ConfigError, Result};

/// prime-rl's eval-wide keys: `group_size` is our `k`, `num_examples = -1` (every example) our
/// unset, `skip_first_step` the inverse of `eval_on_start` (prime-rl evaluates on start unless
/// told not to; its `interval = 100` default is filled in by [`finish`]).
pub(super) fn eval_keys(eval: &mut Map<String, Value>, at: &str, notes: &mut Notes<'_>) -> Result<()> {
    if let Some(k) = eval.remove("group_size") {
        eval.insert(String::from("k"), k);
        notes.push(join(at, "group_size"), &join(at, "k"));
    }
    every_example(eval, at, notes);
    let skip = match eval.remove("skip_first_step") {
        Some(Value::Bool(skip)) => {
            notes.push(join(at, "skip_first_step"), &join(at, "eval_on_start"));
            skip
        }
        Some(_) => return Err(ConfigError::invalid(join(at, "skip_first_step"), "must be true or false")),
        None => false,
    };
    eval.insert(String::from("eval_on_start"), json!(!skip));
    match eval.remove("retrigger_on_resume") {
        Some(Value::Bool(true)) => Err(ConfigError::invalid(
            join(at, "retrigger_on_resume"),
            "is not supported: a resumed run evaluates at its next interval",
        )),
        _ => Ok(()),
    }
}

/// prime-rl's `num_examples = -1` (every example) is our unset.
fn every_example(table: &mut Map<String, Value>, at: &str, notes: &mut Notes<'_>) {
    if table.get("num_examples").and_then(Value::as_i64) == Some(-1) {
        table.remove("num_examples");
        let key = join(at, "num_examples");
        notes.said(format!("{key} = -1"), format!("`{key}` unset: every example"));
    }
}

/// Each `source` of a `train` or `eval` section becomes a `verifiers` env of its `env` list.
pub(super) fn sources(section: &mut Map<String, Value>, at: &str, eval: bool, notes: &mut Notes<'_>) -> Result<()> {
    let Some(list) = section.remove("source") else { return Ok(()) };
    let key = join(at, "source");
    let Value::Array(list) = list else {
        return Err(ConfigError::invalid(key, "must be a list of tables (`[[...source]]`)"));
    };
    if section.contains_key("env") {
        return Err(ConfigError::invalid(
            key,
            format!("and `{at}.env` both list envs: write one (a source is a `verifiers` env)"),
        ));
    }
    let envs = list
        .into_iter()
        .enumerate()
        .map(|(i, source)| env_of_source(source, &format!("{key}.{i}"), eval, notes))
        .collect::<Result<Vec<_>>>()?;
    section.insert(String::from("env"), Value::Array(envs));
    notes.said(key, format!("`{}` (`id = \"verifiers\"`, `args.env` = the source's `env`)", join(at, "env")));
    Ok(())
}

fn env_of_source(source: Value, key: &str, eval: bool, notes: &mut Notes<'_>) -> Result<Value> {
    let Value::Object(mut source) = source else { return Err(ConfigError::invalid(key, "must be a table")) };
    let Some(env) = source.remove("env").filter(Value::is_object) else {
        return Err(ConfigError::invalid(
            format!("{key}.env"),
            "is required: verifiers' env table (`env.taskset.id`, `env.agent.harness.id`, ...)",
        ));
    };
    let name = match source.remove("name") {
        Some(name) => name,
        None => json!(default_name(&env)),
    };
    let mut out = Map::new();
    out.insert(String::from("id"), json!("verifiers"));
    out.insert(String::from("name"), name);
    out.insert(String::from("args"), json!({ "env": env }));
    if let Some(mut sampling) = source.remove("sampling") {
        extra_body(&mut sampling, &format!("{key}.sampling"), notes);
        out.insert(String::from("sampling"), sampling);
    }
    if let Some(serve) = source.remove("serve") {
        out.insert(String::from("serve"), serve_of(serve, &format!("{key}.serve"))?);
    }
    if eval {
        every_example(&mut source, key, notes);
    }
    let kept: &[&str] = if eval { &["num_examples", "interval"] } else { &["ratio", "group_size"] };
    for field in kept {
        if let Some(v) = source.remove(*field) {
            out.insert((*field).to_owned(), v);
        }
    }
    if eval && let Some(k) = source.remove("group_size") {
        out.insert(String::from("k"), k);
    }
    if !eval {
        if let Some(algo) = source.remove("algo") {
            out.insert(String::from("algorithms"), json!([algorithm(algo, &format!("{key}.algo"))?]));
        }
        if let Some(curriculum) = source.remove("curriculum") {
            out.insert(String::from("curriculum"), curriculum_of(curriculum, &format!("{key}.curriculum"))?);
        }
    }
    if let Some(field) = source.keys().next() {
        return Err(ConfigError::invalid(
            format!("{key}.{field}"),
            "is a prime-rl source key with no counterpart here (see docs/configuration.md, prime-rl configs)",
        ));
    }
    Ok(Value::Object(out))
}

/// A source's name by default: its env id, else its taskset id (the last part of either).
fn default_name(env: &Value) -> String {
    let id = env.get("id").or_else(|| env.get("taskset").and_then(|t| t.get("id")));
    let id = id.and_then(Value::as_str).unwrap_or("verifiers");
    id.rsplit('/').next().unwrap_or(id).to_owned()
}

/// verifiers' `serve`: only `max_concurrent` has a counterpart (the env server's).
fn serve_of(serve: Value, key: &str) -> Result<Value> {
    let Value::Object(serve) = serve else { return Err(ConfigError::invalid(key, "must be a table")) };
    let mut out = Map::new();
    for (field, value) in serve {
        match field.as_str() {
            "max_concurrent" => {
                out.insert(field, value);
            }
            "address" => {
                return Err(ConfigError::invalid(
                    format!("{key}.address"),
                    "names a verifiers env server (ZMQ), which this orchestrator does not speak (gRPC): \
                     leave it out and `rl rl` starts the env's server",
                ));
            }
            _ => {
                return Err(ConfigError::invalid(
                    format!("{key}.{field}"),
                    "is verifiers' worker pool; the env server here runs episodes in one host process, \
                     up to `max_concurrent` at once",
                ));
            }
        }
    }
    Ok(Value::Object(out))
}

/// prime-rl's curriculum (`sampler`, `gates`) as ours: `standard` is uniform, `difficulty_pool`'s
/// pools (a table by name) our pool list by threshold; the one gate with a counterpart is the
/// all-zero-advantage filter (`orchestrator.filter_zero_advantages`, on by default).
fn curriculum_of(curriculum: Value, key: &str) -> Result<Value> {
    let Value::Object(mut curriculum) = curriculum else { return Err(ConfigError::invalid(key, "must be a table")) };
    if let Some(gates) = curriculum.remove("gates") {
        let zero_filter = |g: &Value| {
            let bound = |b: &str| g.get(b).map_or(Some(0.0), Value::as_f64) == Some(0.0);
            bound("reject_min") && bound("reject_max")
        };
        if !gates.as_object().is_some_and(|g| g.values().all(zero_filter)) {
            return Err(ConfigError::invalid(
                format!("{key}.gates"),
                "only the all-zero-advantage gate (reject_min = reject_max = 0) has a counterpart here: \
                 `orchestrator.filter_zero_advantages`",
            ));
        }
    }
    let sampler = curriculum.remove("sampler").unwrap_or_else(|| json!({ "type": "standard" }));
    if let Some(field) = curriculum.keys().next() {
        return Err(ConfigError::invalid(format!("{key}.{field}"), "is not a prime-rl curriculum key"));
    }
    let Value::Object(mut sampler) = sampler else {
        return Err(ConfigError::invalid(format!("{key}.sampler"), "must be a table"));
    };
    if sampler.remove("seed").is_some() {
        return Err(ConfigError::invalid(
            format!("{key}.sampler.seed"),
            "is not read here: tasks are drawn with `orchestrator.seed`",
        ));
    }
    match sampler.remove("type").as_ref().and_then(Value::as_str).unwrap_or("standard") {
        "standard" if sampler.is_empty() => Ok(json!({ "type": "uniform" })),
        "difficulty_pool" => {
            let mut out = Map::new();
            out.insert(String::from("type"), json!("difficulty_pool"));
            if let Some(pools) = sampler.remove("pools") {
                let Value::Object(pools) = pools else {
                    return Err(ConfigError::invalid(format!("{key}.sampler.pools"), "must be a table by pool name"));
                };
                let mut list: Vec<Value> = pools
                    .into_iter()
                    .map(|(name, mut pool)| {
                        if let Some(p) = pool.as_object_mut() {
                            p.insert(String::from("name"), json!(name));
                        }
                        pool
                    })
                    .collect();
                let threshold = |p: &Value| p.get("threshold").and_then(Value::as_f64).unwrap_or(f64::NAN);
                list.sort_by(|a, b| threshold(a).total_cmp(&threshold(b)));
                out.insert(String::from("pools"), Value::Array(list));
            }
            if let Some(field) = sampler.keys().next() {
                return Err(ConfigError::invalid(format!("{key}.sampler.{field}"), "is not a difficulty_pool key"));
            }
            Ok(Value::Object(out))
        }
        other => Err(ConfigError::invalid(
            format!("{key}.sampler.type"),
            format!("`{other}` with these keys has no counterpart here: `standard` or `difficulty_pool`"),
        )),
    }
}
