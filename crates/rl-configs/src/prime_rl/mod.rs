//! prime-rl's current config spellings, read as this schema's, so a prime-rl `rl.toml` (or its
//! SFT, inference or eval config) whose envs are verifiers tasksets runs unchanged: its sources
//! (`[[orchestrator.train.source]]`, `[[orchestrator.eval.source]]`, prime-rl #3150: a verifiers
//! `[env]` table each) become `verifiers` envs (`sources.rs`), `[orchestrator.algo]` the algorithm
//! list, `[orchestrator.renderer]` those envs' renderer, the orchestrator's model `client` and
//! `lora` our endpoint fields (here and `sections.rs`), and the sections outside the orchestrator
//! (`[monitors]`, the trainer's `model`, `optim` and `loss`, SFT `[data]`, `[inference.server]`,
//! `[inference.vllm]`) ours (`sections.rs`). Each translation is reported as a note (the full list
//! is in docs/configuration.md, "prime-rl configs"); a prime-rl key with no counterpart here is
//! refused with what it would need, never dropped; none of it touches a key of our own schema.

mod sections;
mod shared;
mod sources;

use serde_json::{Map, Value, json};

use self::shared::{Notes, algorithm, extra_body};
use crate::deprecated::{Deprecation, Translation, join};
use crate::error::{ConfigError, Result};

/// Where a config type has counterparts of prime-rl's sections: its top-level `[monitors]` (our
/// `[wandb]` at the top level), its trainer's `model.lora`, `optim` and `loss` (in the table
/// `trainer_at` names), the SFT `[data]` keys, the inference server's tables.
#[derive(Debug, Clone, Copy)]
pub struct PrimeRlLayout {
    /// `[monitors]` is translated at the top level.
    pub monitors: bool,
    /// The trainer's table (our `lora`, `optim`, `loss`; prime-rl's `model.lora` in its `model`).
    pub trainer_at: Option<&'static [&'static str]>,
    /// The SFT config: prime-rl's `[data]` holds what our top level does (`seq_len`, `loss_mask`).
    pub sft: bool,
    /// The inference server's section (prime-rl's has `server` and `vllm` tables in it).
    pub inference_at: Option<&'static [&'static str]>,
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
        sections::monitors(root, &mut notes)?;
    }
    if let Value::Object(top) = &mut *root {
        sections::log_and_ckpt_keys(top, "", &mut notes);
        if orch_at == Some(&["orchestrator"]) {
            sections::weight_broadcast(top, &mut notes)?;
        }
    }
    for at in [layout.trainer_at, layout.inference_at, orch_at].into_iter().flatten().filter(|at| !at.is_empty()) {
        if let Some(Value::Object(section)) = at.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) {
            sections::log_and_ckpt_keys(section, &at.join("."), &mut notes);
        }
    }
    if let Some(at) = layout.trainer_at
        && let Some(Value::Object(section)) = at.iter().try_fold(&mut *root, |node, k| node.get_mut(*k))
    {
        sections::trainer(section, &at.join("."), &mut notes)?;
    }
    if layout.sft {
        sections::sft_data(root, &mut notes)?;
    }
    if let Some(at) = layout.inference_at
        && let Some(Value::Object(section)) = at.iter().try_fold(&mut *root, |node, k| node.get_mut(*k))
    {
        sections::inference(section, &at.join("."), &mut notes)?;
    }
    let Some(orch_at) = orch_at else { return Ok(notes.out) };
    let prefix = orch_at.join(".");
    // The trainer's adapter, which prime-rl's `orchestrator.model.lora` must agree with.
    let trainer_lora = layout.trainer_at.and_then(|at| {
        let trainer = at.iter().try_fold(&*root, |node, k| node.get(*k))?;
        trainer.get("lora").cloned()
    });
    let Some(Value::Object(orch)) = orch_at.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) else {
        return Ok(notes.out);
    };
    // prime-rl's eval entrypoint (`eval @ eval.toml`, our `rl eval`) names the model's endpoint
    // in `[eval.client]`: the model's `client`, read below.
    let eval_client = match orch.get_mut("eval") {
        Some(Value::Object(eval)) => eval.remove("client"),
        _ => None,
    };
    if let Some(client) = eval_client {
        let model = orch.entry("model").or_insert_with(|| json!({}));
        if let Some(model) = model.as_object_mut() {
            if model.contains_key("client") {
                return Err(ConfigError::invalid(
                    join(&prefix, "eval.client"),
                    format!("and `{}` both name the model's endpoint: set one", join(&prefix, "model.client")),
                ));
            }
            model.insert(String::from("client"), client);
            notes.push(join(&prefix, "eval.client"), &join(&prefix, "model.client"));
        }
    }
    if let Some(Value::Object(model)) = orch.get_mut("model") {
        sections::orchestrator_model(model, &join(&prefix, "model"), trainer_lora.as_ref(), &mut notes)?;
    }
    if orch.contains_key("concurrency") {
        return Err(ConfigError::invalid(
            join(&prefix, "concurrency"),
            "is prime-rl's adaptive limit on episodes in flight, with no counterpart here: each env \
             server's `serve.max_concurrent` and the inference server's queue (`max_pending_requests`) \
             bound the load; remove it",
        ));
    }
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
            sources::eval_keys(section, &at, &mut notes)?;
        }
        sources::sources(section, &at, part == "eval", &mut notes)?;
    }
    Ok(notes.out)
}

/// What needs the merged tree (the files' sections may be spread over several): prime-rl's eval
/// `interval` default (100) where eval sources were read (`translated`: the notes so far); its
/// orchestrator LoRA name dropped where `rl rl` runs the embedded server (which takes each step's
/// adapter through `/update_weights`; the name is for an external vLLM's LoRA API); and
/// `[orchestrator.renderer]` (a `renderers` config) as the `renderer` of every `verifiers` env
/// that sets none.
pub(crate) fn finish(
    root: &mut Value,
    orch_at: Option<&[&str]>,
    translated: &[Deprecation],
) -> Result<Vec<Deprecation>> {
    let Some(orch_at) = orch_at else { return Ok(Vec::new()) };
    let prefix = orch_at.join(".");
    let was = |key: &str| translated.iter().any(|d| d.kind == Translation::PrimeRl && d.old == join(&prefix, key));
    let embedded = orch_at == ["orchestrator"] && root.get("inference").is_some_and(|i| !i.is_null());
    let Some(Value::Object(orch)) = orch_at.iter().try_fold(&mut *root, |node, k| node.get_mut(*k)) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    if was("eval.source")
        && let Some(Value::Object(eval)) = orch.get_mut("eval")
    {
        eval.entry("interval").or_insert(json!(100));
    }
    if was("model.lora")
        && embedded
        && let Some(Value::Object(model)) = orch.get_mut("model")
    {
        model.remove("lora_name");
        let text = "nothing: the embedded server takes each step's adapter through `/update_weights`";
        out.push(Deprecation {
            old: join(&prefix, "model.lora"),
            new: text.to_owned(),
            origin: String::from("the config"),
            kind: Translation::PrimeRl,
        });
    }
    let key = join(&prefix, "renderer");
    let Some(renderer) = orch.remove("renderer") else { return Ok(out) };
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
    out.push(Deprecation { old: key, new, origin: String::from("the config"), kind: Translation::PrimeRl });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RL: Option<&[&str]> = Some(&["orchestrator"]);
    const RL_LAYOUT: PrimeRlLayout = PrimeRlLayout {
        monitors: true,
        trainer_at: Some(&["trainer"]),
        sft: false,
        inference_at: Some(&["inference"]),
    };

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
        let notes = translate_tree(
            &mut tree,
            orch,
            PrimeRlLayout { monitors: false, trainer_at: None, sft: false, inference_at: None },
            "o.toml",
        )
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

    const SFT: PrimeRlLayout = PrimeRlLayout { monitors: true, trainer_at: Some(&[]), sft: true, inference_at: None };

    #[test]
    fn an_sft_configs_data_keys_move_where_ours_are() {
        let mut tree = json!({"data": {
            "type": "sft", "name": "org/data", "seq_len": 4096, "seed": 3, "shuffle": true, "micro_batch_size": 1,
            "loss_mask": {"system": false, "assistant": true},
        }});
        translate_tree(&mut tree, None, SFT, "s.toml").unwrap();
        assert_eq!(
            tree,
            json!({"data": {"name": "org/data"}, "seq_len": 4096, "seed": 3, "loss_mask": {"system": false, "assistant": true}})
        );
        // Our task generator's own seed stays where it is.
        let mut ours = json!({"data": {"type": "task", "task": "reverse-text", "seed": 3}, "seed": 1});
        let before = ours.clone();
        translate_tree(&mut ours, None, SFT, "s.toml").unwrap();
        assert_eq!(ours, before);
        // prime-rl's data.batch_size counts packed rows: our batch_rows.
        let mut tree = json!({"data": {"name": "d", "batch_size": 32, "seq_len": 4096}});
        translate_tree(&mut tree, None, SFT, "s.toml").unwrap();
        assert_eq!(tree, json!({"data": {"name": "d"}, "batch_rows": 32, "seq_len": 4096}));
        let refused = |data: Value| {
            let mut tree = json!({ "data": data });
            message(translate_tree(&mut tree, None, SFT, "s.toml").unwrap_err()).0
        };
        assert_eq!(refused(json!({"name": "d", "micro_batch_size": 2})), "data.micro_batch_size");
        assert_eq!(refused(json!({"name": "d", "shuffle": false})), "data.shuffle");
    }
    #[test]
    fn prime_rls_inference_server_and_vllm_tables_take_our_keys() {
        let tree = translated(json!({"inference": {
            "server": {"port": 8001},
            "vllm": {"max_model_len": 4096, "dtype": "bfloat16", "model": "Qwen/Qwen3-0.6B", "seed": 3},
        }}))
        .unwrap();
        assert_eq!(
            tree["inference"],
            json!({"port": 8001, "max_model_len": 4096, "dtype": "bf16", "model": {"name": "Qwen/Qwen3-0.6B"}, "seed": 3})
        );
        let auto = translated(json!({"inference": {"vllm": {"dtype": "auto"}}})).unwrap();
        assert_eq!(auto["inference"], json!({}));
        let refused = |tree: Value| message(translated(tree).unwrap_err()).0;
        assert_eq!(
            refused(json!({"inference": {"vllm": {"gpu_memory_utilization": 0.9}}})),
            "inference.vllm.gpu_memory_utilization"
        );
        assert_eq!(refused(json!({"inference": {"port": 1, "server": {"port": 2}}})), "inference.server.port");
        assert_eq!(refused(json!({"inference": {"vllm": {"dtype": "int8"}}})), "inference.vllm.dtype");
    }
    #[test]
    fn trainer_spellings_take_our_keys() {
        let tree = translated(json!({"trainer": {
            "model": {"impl": "auto", "attn": "auto", "lora": {"rank": 32, "alpha": 64}},
            "optim": {"lr": 1e-5, "betas1": 0.8, "max_norm": null},
            "loss": {"type": "default", "dppo_mask_low": 0.1, "dppo_mask_high": 0.3, "kl_tau": 0.0},
        }}))
        .unwrap();
        assert_eq!(
            tree["trainer"],
            json!({
                "lora": {"rank": 32, "alpha": 64},
                "optim": {"lr": 1e-5, "betas": [0.8, 0.999], "max_norm": 0.0},
                "loss": {"mask_low": 0.1, "mask_high": 0.3, "kl_tau": 0.0},
            })
        );
        let refused = |trainer: Value| message(translated(json!({ "trainer": trainer })).unwrap_err()).0;
        assert_eq!(refused(json!({"model": {"impl": "hf"}})), "trainer.model.impl");
        assert_eq!(refused(json!({"model": {"ac": {"freq": 1}}})), "trainer.model.ac");
        let busy = json!({"orchestrator": {"concurrency": {"max_inflight": 64}}});
        assert_eq!(message(translated(busy).unwrap_err()).0, "orchestrator.concurrency");
        assert_eq!(refused(json!({"loss": {"type": "ipo"}})), "trainer.loss.type");
        assert_eq!(refused(json!({"model": {"lora": {}}, "lora": {}})), "trainer.model.lora");
    }
    #[test]
    fn the_orchestrators_model_client_and_lora_take_our_keys() {
        let tree = translated(json!({
            "trainer": {"model": {"lora": {"rank": 16, "alpha": 32.0}}},
            "orchestrator": {"model": {
                "name": "Qwen/Qwen3-0.6B", "trust_remote_code": false,
                "client": {"base_url": ["http://a:8000/v1", "http://b:8000/v1"], "api_key_var": "KEY", "headers": {"X": "1"}},
                "lora": {"rank": 16},
            }},
        }))
        .unwrap();
        assert_eq!(
            tree["orchestrator"]["model"],
            json!({
                "name": "Qwen/Qwen3-0.6B", "base_url": ["http://a:8000/v1", "http://b:8000/v1"], "api_key_env": "KEY",
                "headers": {"X": "1"}, "lora_name": "r16-a32.0",
            })
        );
        let named = translated(json!({"orchestrator": {"model": {"lora": {"name": "mine"}}}})).unwrap();
        assert_eq!(named["orchestrator"]["model"], json!({"lora_name": "mine"}));
        // With the embedded server the adapter goes through /update_weights: no name to load it by.
        let embedded =
            translated(json!({"inference": {}, "orchestrator": {"model": {"lora": {"name": "mine"}}}})).unwrap();
        assert_eq!(embedded["orchestrator"]["model"], json!({}));
        let refused = |tree: Value| message(translated(tree).unwrap_err()).0;
        let differs = json!({"trainer": {"lora": {"rank": 8}}, "orchestrator": {"model": {"lora": {"rank": 16}}}});
        assert_eq!(refused(differs), "orchestrator.model.lora.rank");
        assert_eq!(
            refused(json!({"orchestrator": {"model": {"trust_remote_code": true}}})),
            "orchestrator.model.trust_remote_code"
        );
        let admin = json!({"orchestrator": {"model": {"client": {"admin_base_url": ["http://a/v1"]}}}});
        assert_eq!(refused(admin), "orchestrator.model.client.admin_base_url");
    }
    #[test]
    fn log_json_logging_and_a_filesystem_broadcast_take_our_shapes() {
        let tree = translated(json!({
            "log": {"level": "debug", "json_logging": true},
            "ckpt": {"output_dir": "/ckpts", "interval": 5},
            "trainer": {"log": {"json_logging": false}},
            "weight_broadcast": {"type": "filesystem"},
        }))
        .unwrap();
        assert_eq!(
            tree,
            json!({
                "log": {"level": "debug", "json": true}, "ckpt": {"dir": "/ckpts", "interval": 5},
                "trainer": {"log": {"json": false}},
            })
        );
        let err = message(translated(json!({"weight_broadcast": {"type": "nccl"}})).unwrap_err());
        assert_eq!(err.0, "weight_broadcast");
    }
    #[test]
    fn prime_rls_eval_config_names_the_model_endpoint_in_eval_client() {
        let orch: Option<&[&str]> = Some(&[]);
        let layout = PrimeRlLayout { monitors: false, trainer_at: None, sft: false, inference_at: None };
        let mut tree = json!({
            "model": {"name": "Qwen/Qwen3-0.6B"},
            "eval": {"client": {"base_url": ["http://h:8000/v1"]}, "num_examples": -1,
                     "source": [{"env": {"taskset": {"id": "gsm8k"}}}]},
        });
        translate_tree(&mut tree, orch, layout, "eval.toml").unwrap();
        assert_eq!(tree["model"], json!({"name": "Qwen/Qwen3-0.6B", "base_url": ["http://h:8000/v1"]}));
        assert_eq!(tree["eval"]["env"][0]["args"]["env"]["taskset"]["id"], "gsm8k");
        assert!(tree["eval"].get("client").is_none() && tree["eval"].get("num_examples").is_none());
    }
}
