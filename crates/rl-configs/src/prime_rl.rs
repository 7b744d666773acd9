//! prime-rl's current config spellings, read as this schema's, so a prime-rl `rl.toml` whose envs
//! are verifiers tasksets runs unchanged: its sources (`[[orchestrator.train.source]]`,
//! `[[orchestrator.eval.source]]`, prime-rl #3150: a verifiers `[env]` table each) become
//! `verifiers` envs, `[orchestrator.algo]` the algorithm list, `[orchestrator.renderer]` those envs'
//! renderer, `[monitors.wandb]` the `[wandb]` section, `[trainer.model.lora]` `[trainer.lora]`,
//! `extra_body` the sampling's `extra`. Each translation is reported as a note; a prime-rl key with
//! no counterpart here is refused with what it would need, never dropped.

use serde_json::{Map, Value, json};

use crate::deprecated::{Deprecation, Translation, join};
use crate::error::{ConfigError, Result};

/// Where a config type has counterparts of prime-rl's top-level `[monitors]` (our `[wandb]` at the
/// top level) and of its `model.lora` (our `lora`, in the table `lora_at` names: prime-rl's sits in
/// that table's `model`).
#[derive(Debug, Clone, Copy)]
pub struct PrimeRlLayout {
    /// `[monitors]` is translated at the top level.
    pub monitors: bool,
    /// The table holding our `lora`.
    pub lora_at: Option<&'static [&'static str]>,
    /// The SFT config: prime-rl's `[data]` holds what our top level does (`seq_len`, `loss_mask`).
    pub sft: bool,
}

/// The notes of one source of keys.
struct Notes<'a> {
    origin: &'a str,
    out: Vec<Deprecation>,
}

impl Notes<'_> {
    /// `old` is read as the key `new`.
    fn push(&mut self, old: String, new: &str) {
        self.said(old, format!("`{new}`"));
    }

    /// `old` is read as `text` says.
    fn said(&mut self, old: String, text: String) {
        self.out.push(Deprecation { old, new: text, origin: self.origin.to_owned(), kind: Translation::PrimeRl });
    }
}

/// Translates prime-rl's spellings in one file's tree (`orch_at`: where the orchestrator section
/// sits, if the config has one).
pub(crate) fn translate_tree(
    root: &mut Value,
    orch_at: Option<&[&str]>,
    layout: PrimeRlLayout,
    origin: &str,
) -> Result<Vec<Deprecation>> {
    let mut notes = Notes { origin, out: Vec::new() };
    if layout.monitors {
        monitors(root, &mut notes)?;
    }
    if let Some(at) = layout.lora_at {
        let model: Vec<&str> = at.iter().copied().chain(["model"]).collect();
        move_table(root, &model, "lora", at, "lora", &mut notes)?;
    }
    if layout.sft {
        sft_data(root, &mut notes)?;
    }
    let Some(orch_at) = orch_at else { return Ok(notes.out) };
    let prefix = orch_at.join(".");
    let Some(Value::Object(orch)) = orch_at.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) else {
        return Ok(notes.out);
    };
    if let Some(algo) = orch.remove("algo") {
        let key = join(&prefix, "algo");
        orch.insert(String::from("algorithms"), json!([algorithm(algo, &key)?]));
        notes.push(key, &join(&prefix, "algorithms.0"));
    }
    for part in ["train", "eval"] {
        let Some(Value::Object(section)) = orch.get_mut(part) else { continue };
        let at = join(&prefix, part);
        if let Some(sampling) = section.get_mut("sampling") {
            extra_body(sampling, &join(&at, "sampling"), &mut notes);
        }
        if part == "eval" && section.contains_key("source") {
            eval_keys(section, &at, &mut notes)?;
        }
        sources(section, &at, part == "eval", &mut notes)?;
    }
    Ok(notes.out)
}

/// What needs the merged tree (the files' sections may be spread over several): prime-rl's eval
/// `interval` default (100) where eval sources were read (`translated`: the notes so far), and
/// `[orchestrator.renderer]` (a `renderers` config) as the `renderer` of every `verifiers` env
/// that sets none.
pub(crate) fn finish(
    root: &mut Value,
    orch_at: Option<&[&str]>,
    translated: &[Deprecation],
) -> Result<Vec<Deprecation>> {
    let Some(orch_at) = orch_at else { return Ok(Vec::new()) };
    let prefix = orch_at.join(".");
    let Some(Value::Object(orch)) = orch_at.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) else {
        return Ok(Vec::new());
    };
    let eval_sources = join(&prefix, "eval.source");
    if translated.iter().any(|d| d.kind == Translation::PrimeRl && d.old == eval_sources)
        && let Some(Value::Object(eval)) = orch.get_mut("eval")
    {
        eval.entry("interval").or_insert(json!(100));
    }
    let key = join(&prefix, "renderer");
    let Some(renderer) = orch.remove("renderer") else { return Ok(Vec::new()) };
    if !renderer.is_object() {
        return Err(ConfigError::invalid(key, "must be a table: a `renderers` config such as { name = \"qwen3\" }"));
    }
    let mut set = 0;
    for part in ["train", "eval"] {
        let Some(Value::Array(envs)) = orch.get_mut(part).and_then(|s| s.get_mut("env")) else { continue };
        for env in envs.iter_mut().filter(|e| e.get("id").and_then(Value::as_str) == Some("verifiers")) {
            let Some(env) = env.as_object_mut() else { continue };
            let args = env.entry("args").or_insert_with(|| Value::Object(Map::new()));
            if let Some(args) = args.as_object_mut() {
                args.entry("renderer").or_insert_with(|| renderer.clone());
                set += 1;
            }
        }
    }
    if set == 0 {
        return Err(ConfigError::invalid(
            key,
            "renders the prompts of verifiers envs, and this config has none (`[[orchestrator.train.source]]`, \
             or an env with `id = \"verifiers\"`)",
        ));
    }
    let new = format!("`{}` of every verifiers env", join(&prefix, "{train,eval}.env.*.args.renderer"));
    Ok(vec![Deprecation { old: key, new, origin: String::from("the config"), kind: Translation::PrimeRl }])
}

/// `[monitors]`: `wandb` is our `[wandb]`; `file` (metrics.jsonl) is always written here.
fn monitors(root: &mut Value, notes: &mut Notes<'_>) -> Result<()> {
    let Value::Object(top) = root else { return Ok(()) };
    let Some(monitors) = top.remove("monitors") else { return Ok(()) };
    let Value::Object(monitors) = monitors else {
        return Err(ConfigError::invalid("monitors", "must be a table (`[monitors.wandb]`)"));
    };
    for (name, value) in monitors {
        let key = format!("monitors.{name}");
        match name.as_str() {
            "wandb" => {
                let Value::Object(mut wandb) = value else {
                    return Err(ConfigError::invalid(key, "must be a table"));
                };
                match wandb.remove("offline") {
                    Some(Value::Bool(true)) => {
                        wandb.insert(String::from("mode"), json!("offline"));
                        notes.push(format!("{key}.offline"), "wandb.mode");
                    }
                    Some(Value::Bool(false)) | None => {}
                    Some(_) => return Err(ConfigError::invalid(format!("{key}.offline"), "must be true or false")),
                }
                if top.contains_key("wandb") {
                    return Err(ConfigError::invalid(key, "and `[wandb]` are the same section: set one"));
                }
                top.insert(String::from("wandb"), Value::Object(wandb));
                notes.push(key, "wandb");
            }
            "file" => {
                let path = value.get("path").and_then(Value::as_str).unwrap_or("metrics.jsonl");
                if path != "metrics.jsonl" {
                    return Err(ConfigError::invalid(
                        format!("{key}.path"),
                        format!(
                            "metrics go to `<run dir>/metrics.jsonl` here (and the trainer's to `trainer/metrics.jsonl`); `{path}` is not supported"
                        ),
                    ));
                }
                notes.said(key, String::from("`<run dir>/metrics.jsonl`, always written"));
            }
            _ => {
                return Err(ConfigError::invalid(
                    key,
                    "is a prime-rl monitor with no counterpart here: `[wandb]` and `[tensorboard]` are",
                ));
            }
        }
    }
    Ok(())
}

/// prime-rl's SFT `[data]` table (`type = "sft"`) holds keys our top level holds: `seq_len` (tokens
/// per packed row), `loss_mask` and `seed` move there; its default `shuffle`, `micro_batch_size`
/// and `num_workers` are how this trainer works anyway. Its `batch_size` counts packed rows, ours
/// samples: refused with that said, not converted.
fn sft_data(root: &mut Value, notes: &mut Notes<'_>) -> Result<()> {
    let Value::Object(top) = root else { return Ok(()) };
    let Some(Value::Object(data)) = top.get_mut("data") else { return Ok(()) };
    if data.get("type").and_then(Value::as_str) == Some("sft") {
        data.remove("type");
        notes.said(String::from("data.type = \"sft\""), String::from("a dataset by `data.name`"));
    }
    let mut moved = Vec::new();
    for field in ["seq_len", "loss_mask", "seed"] {
        if let Some(value) = data.remove(field) {
            moved.push((field, value));
        }
    }
    for (field, default) in [("shuffle", json!(true)), ("micro_batch_size", json!(1)), ("num_workers", json!(1))] {
        match data.remove(field) {
            Some(v) if v == default => {
                notes.said(format!("data.{field} = {v}"), String::from("what this trainer does anyway"))
            }
            Some(v) => {
                let why = match field {
                    "shuffle" => "is not supported: examples are drawn in a seeded shuffled order (`seed`)",
                    "micro_batch_size" => "is not supported: each packed row is its own forward and backward here",
                    _ => "is not supported: data is read in-process",
                };
                return Err(ConfigError::invalid(format!("data.{field}"), format!("= {v} {why}")));
            }
            None => {}
        }
    }
    if data.contains_key("batch_size") {
        return Err(ConfigError::invalid(
            "data.batch_size",
            "is prime-rl's count of packed rows a step; here the top-level `batch_size` counts samples a step: set that",
        ));
    }
    for (field, value) in moved {
        if top.contains_key(field) {
            return Err(ConfigError::invalid(
                format!("data.{field}"),
                format!("and `{field}` are the same key: set one"),
            ));
        }
        top.insert(field.to_owned(), value);
        notes.push(format!("data.{field}"), field);
    }
    Ok(())
}

/// Moves the table `from.leaf` to `to.new_leaf` (both under the root), refusing a conflict.
fn move_table(
    root: &mut Value,
    from: &[&str],
    leaf: &str,
    to: &[&str],
    new_leaf: &str,
    notes: &mut Notes<'_>,
) -> Result<()> {
    let Some(Value::Object(parent)) = from.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) else {
        return Ok(());
    };
    let Some(value) = parent.remove(leaf) else { return Ok(()) };
    if parent.is_empty() {
        let (last, up) = from.split_last().expect("a path");
        if let Some(Value::Object(grand)) = up.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) {
            grand.remove(*last);
        }
    }
    let (old, new) = (join(&from.join("."), leaf), join(&to.join("."), new_leaf));
    let Some(Value::Object(target)) = to.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) else {
        return Ok(());
    };
    if target.contains_key(new_leaf) {
        return Err(ConfigError::invalid(old, format!("and `{new}` are the same section: set one")));
    }
    target.insert(new_leaf.to_owned(), value);
    notes.push(old, &new);
    Ok(())
}

/// prime-rl's `extra_body` of a sampling table is our `extra`.
fn extra_body(sampling: &mut Value, key: &str, notes: &mut Notes<'_>) {
    let Some(map) = sampling.as_object_mut() else { return };
    if let Some(body) = map.remove("extra_body") {
        map.insert(String::from("extra"), body);
        notes.push(format!("{key}.extra_body"), &format!("{key}.extra"));
    }
}

/// prime-rl's `{ type = "rae", decay = 0.9 }` is our `{ id = "rae", decay = 0.9 }` (the same
/// algorithm names; grpo when `type` is unset).
fn algorithm(algo: Value, key: &str) -> Result<Value> {
    let Value::Object(mut algo) = algo else {
        return Err(ConfigError::invalid(key, "must be a table such as { type = \"grpo\" }"));
    };
    let id = algo.remove("type").unwrap_or_else(|| json!("grpo"));
    algo.insert(String::from("id"), id);
    Ok(Value::Object(algo))
}

/// prime-rl's eval-wide keys: `group_size` is our `k`, `num_examples = -1` (every example) our
/// unset, `skip_first_step` the inverse of `eval_on_start` (prime-rl evaluates on start unless
/// told not to; its `interval = 100` default is filled in by [`finish`]).
fn eval_keys(eval: &mut Map<String, Value>, at: &str, notes: &mut Notes<'_>) -> Result<()> {
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
fn sources(section: &mut Map<String, Value>, at: &str, eval: bool, notes: &mut Notes<'_>) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const RL: Option<&[&str]> = Some(&["orchestrator"]);
    const RL_LAYOUT: PrimeRlLayout = PrimeRlLayout { monitors: true, lora_at: Some(&["trainer"]), sft: false };

    fn translated(mut tree: Value) -> Result<Value> {
        let notes = translate_tree(&mut tree, RL, RL_LAYOUT, "c.toml")?;
        finish(&mut tree, RL, &notes)?;
        Ok(tree)
    }

    fn message(err: ConfigError) -> (String, String) {
        match err {
            ConfigError::Invalid { key, message } => (key, message),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn prime_rls_reverse_text_example_reads_as_a_verifiers_env() {
        // prime-rl's examples/basic/reverse-text/rl.toml, its keys as written.
        let tree = translated(json!({
            "monitors": {"wandb": {"project": "reverse-text", "name": "reverse-text", "group": "g"}},
            "orchestrator": {
                "batch_size": 128, "group_size": 16,
                "train": {
                    "sampling": {"max_completion_tokens": 128, "extra_body": {"top_k": -1}},
                    "source": [{"name": "reverse-text", "env": {
                        "taskset": {"id": "reverse-text"},
                        "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
                    }}],
                },
                "renderer": {"name": "prime-qwen3"},
            },
        }))
        .unwrap();
        assert_eq!(tree["wandb"], json!({"project": "reverse-text", "name": "reverse-text", "group": "g"}));
        assert!(tree.get("monitors").is_none());
        let train = &tree["orchestrator"]["train"];
        assert_eq!(train["sampling"], json!({"max_completion_tokens": 128, "extra": {"top_k": -1}}));
        assert_eq!(
            train["env"],
            json!([{"id": "verifiers", "name": "reverse-text", "args": {
                "env": {"taskset": {"id": "reverse-text"}, "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}},
                "renderer": {"name": "prime-qwen3"},
            }}])
        );
        assert!(tree["orchestrator"].get("renderer").is_none());
    }

    #[test]
    fn eval_sources_take_prime_rls_eval_keys_and_defaults() {
        let env = json!({"taskset": {"id": "org/math"}});
        let tree = translated(json!({"orchestrator": {"eval": {
            "group_size": 4, "num_examples": -1, "skip_first_step": true,
            "source": [{"env": env, "group_size": 2, "num_examples": -1}, {"env": env, "num_examples": 8}],
        }}}))
        .unwrap();
        let eval = &tree["orchestrator"]["eval"];
        assert_eq!((&eval["k"], &eval["eval_on_start"], &eval["interval"]), (&json!(4), &json!(false), &json!(100)));
        assert!(eval.get("num_examples").is_none() && eval.get("group_size").is_none());
        assert_eq!(eval["env"][0], json!({"id": "verifiers", "name": "math", "args": {"env": env}, "k": 2}));
        assert_eq!(eval["env"][1]["num_examples"], json!(8));
        // prime-rl evaluates on start unless told not to; an interval written is kept.
        let tree = translated(json!({"orchestrator": {"eval": {"interval": 5, "source": [{"env": env}]}}})).unwrap();
        assert_eq!(
            (&tree["orchestrator"]["eval"]["eval_on_start"], &tree["orchestrator"]["eval"]["interval"]),
            (&json!(true), &json!(5))
        );
    }

    #[test]
    fn algo_lora_and_curriculum_take_our_shapes() {
        let tree = translated(json!({
            "trainer": {"model": {"lora": {"rank": 32, "alpha": 64}}},
            "orchestrator": {
                "algo": {"type": "rae", "decay": 0.9},
                "train": {"source": [{"env": {"taskset": {"id": "t"}}, "ratio": 2.0, "group_size": 8,
                    "algo": {"decay": 0.5},
                    "curriculum": {
                        "sampler": {"type": "difficulty_pool", "pools": {
                            "easy": {"threshold": 1.0, "weight": 0.1}, "hard": {"threshold": 0.2, "weight": 0.3},
                        }},
                        "gates": {"zero": {"type": "advantage_range", "reject_min": 0.0, "reject_max": 0.0}},
                    },
                }]},
            },
        }))
        .unwrap();
        assert_eq!(tree["trainer"], json!({"lora": {"rank": 32, "alpha": 64}}));
        assert_eq!(tree["orchestrator"]["algorithms"], json!([{"id": "rae", "decay": 0.9}]));
        let env = &tree["orchestrator"]["train"]["env"][0];
        assert_eq!((&env["ratio"], &env["group_size"]), (&json!(2.0), &json!(8)));
        assert_eq!(env["algorithms"], json!([{"id": "grpo", "decay": 0.5}]));
        assert_eq!(
            env["curriculum"],
            json!({"type": "difficulty_pool", "pools": [
                {"name": "hard", "threshold": 0.2, "weight": 0.3}, {"name": "easy", "threshold": 1.0, "weight": 0.1},
            ]})
        );
    }

    #[test]
    fn keys_without_a_counterpart_are_refused_by_name() {
        let source = |extra: Value| {
            let mut s = json!({"env": {"taskset": {"id": "t"}}});
            s.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            json!({"orchestrator": {"train": {"source": [s]}}})
        };
        let refused = |tree: Value| message(translated(tree).unwrap_err()).0;
        assert_eq!(
            refused(source(json!({"serve": {"address": "tcp://x:5000"}}))),
            "orchestrator.train.source.0.serve.address"
        );
        assert_eq!(
            refused(source(json!({"serve": {"pool": {"type": "static"}}}))),
            "orchestrator.train.source.0.serve.pool"
        );
        assert_eq!(refused(source(json!({"tasks_per_minute": 3}))), "orchestrator.train.source.0.tasks_per_minute");
        let gate = json!({"curriculum": {"gates": {"g": {"reject_min": -0.1, "reject_max": 0.1}}}});
        assert_eq!(refused(source(gate)), "orchestrator.train.source.0.curriculum.gates");
        let seeded = json!({"curriculum": {"sampler": {"type": "difficulty_pool", "seed": 42}}});
        assert_eq!(refused(source(seeded)), "orchestrator.train.source.0.curriculum.sampler.seed");
        assert_eq!(
            refused(json!({"orchestrator": {"train": {"source": [{"name": "x"}]}}})),
            "orchestrator.train.source.0.env"
        );
        let both = json!({"orchestrator": {"train": {"env": [{"id": "reverse-text"}], "source": [{"env": {}}]}}});
        assert_eq!(refused(both), "orchestrator.train.source");
        assert_eq!(refused(json!({"monitors": {"prime": {"name": "x"}}})), "monitors.prime");
        assert_eq!(refused(json!({"monitors": {"file": {"path": "m.jsonl"}}})), "monitors.file.path");
        assert_eq!(
            refused(json!({"monitors": {"wandb": {"project": "p"}}, "wandb": {"project": "q"}})),
            "monitors.wandb"
        );
        // A renderer with no verifiers env to render for would do nothing.
        let lone = json!({"orchestrator": {"renderer": {"name": "qwen3"}, "train": {"env": [{"id": "reverse-text"}]}}});
        assert_eq!(refused(lone), "orchestrator.renderer");
        let resumed = json!({"orchestrator": {"eval": {"retrigger_on_resume": true, "source": [{"env": {}}]}}});
        assert_eq!(refused(resumed), "orchestrator.eval.retrigger_on_resume");
    }

    #[test]
    fn the_orchestrator_config_alone_translates_its_own_keys() {
        let orch: Option<&[&str]> = Some(&[]);
        let mut tree = json!({"algo": {"type": "max_rl"}, "train": {"source": [{"env": {"taskset": {"id": "t"}}}]}});
        let notes =
            translate_tree(&mut tree, orch, PrimeRlLayout { monitors: false, lora_at: None, sft: false }, "o.toml")
                .unwrap();
        assert_eq!(notes.iter().map(|n| n.old.as_str()).collect::<Vec<_>>(), ["algo", "train.source"]);
        assert!(notes.iter().all(|n| n.label() == "note" && n.to_string().contains("o.toml")));
        assert_eq!(tree["algorithms"], json!([{"id": "max_rl"}]));
        assert_eq!(tree["train"]["env"][0]["name"], json!("t"));
    }

    #[test]
    fn an_sft_configs_monitors_and_model_lora_move_to_the_top_level() {
        let mut tree =
            json!({"model": {"name": "Qwen/Qwen3-0.6B", "lora": {"rank": 8}}, "monitors": {"wandb": {"project": "p"}}});
        let notes = translate_tree(&mut tree, None, SFT, "s.toml").unwrap();
        assert_eq!(notes.len(), 2);
        assert_eq!(tree, json!({"model": {"name": "Qwen/Qwen3-0.6B"}, "lora": {"rank": 8}, "wandb": {"project": "p"}}));
    }

    const SFT: PrimeRlLayout = PrimeRlLayout { monitors: true, lora_at: Some(&[]), sft: true };

    #[test]
    fn an_sft_configs_data_keys_move_where_ours_are_and_its_batch_size_is_refused() {
        let mut tree = json!({"data": {
            "type": "sft", "name": "org/data", "seq_len": 4096, "seed": 3, "shuffle": true, "micro_batch_size": 1,
            "loss_mask": {"system": false, "assistant": true},
        }});
        translate_tree(&mut tree, None, SFT, "s.toml").unwrap();
        assert_eq!(
            tree,
            json!({"data": {"name": "org/data"}, "seq_len": 4096, "seed": 3, "loss_mask": {"system": false, "assistant": true}})
        );
        let refused = |data: Value| {
            let mut tree = json!({ "data": data });
            message(translate_tree(&mut tree, None, SFT, "s.toml").unwrap_err()).0
        };
        assert_eq!(refused(json!({"name": "d", "batch_size": 32})), "data.batch_size");
        assert_eq!(refused(json!({"name": "d", "micro_batch_size": 2})), "data.micro_batch_size");
        assert_eq!(refused(json!({"name": "d", "shuffle": false})), "data.shuffle");
    }
}
