//! Validation rules: shared-key propagation, cross-part checks, model keys, per-env sampling.

use rl_configs::{ConfigError, OrchestratorConfig, RlConfig, SftConfig, SftDataConfig};

use crate::{Files, MINIMAL_RL, load_args};

fn rl_with(extra: &[&str]) -> Result<RlConfig, ConfigError> {
    let f = Files::new();
    let rl = f.write("rl.toml", MINIMAL_RL);
    let mut args = vec!["@", rl.as_str()];
    args.extend_from_slice(extra);
    load_args::<RlConfig>(&args).map(|l| l.config)
}

/// The key a refused value is blamed on: a failed check, or a value its type refuses as it is
/// read (a `Temperature` out of range).
fn invalid_key(err: ConfigError) -> String {
    match err {
        ConfigError::Invalid { key, .. } | ConfigError::WrongType { key, .. } => key,
        other => panic!("expected a validation error, got {other}"),
    }
}

#[test]
fn shared_keys_fill_the_parts_and_conflicts_are_errors() {
    let c = rl_with(&["--seq-len", "300", "--trainer.model.seq-len", "300"]).unwrap();
    assert_eq!(c.trainer.max_steps, Some(5));
    assert_eq!(c.orchestrator.max_steps, Some(5));
    assert_eq!(c.orchestrator.seq_len, 300);
    assert_eq!(c.trainer.model.path.as_deref(), Some(std::path::Path::new("m/tiny")));
    let err = rl_with(&["--trainer.max-steps", "6"]).unwrap_err();
    assert!(matches!(err, ConfigError::SharedConflict { ref target, .. } if target == "trainer.max_steps"), "{err}");
}

#[test]
fn parts_are_checked_against_each_other() {
    assert_eq!(
        invalid_key(rl_with(&["--trainer.model.seq-len", "64", "--orchestrator.seq-len", "128"]).unwrap_err()),
        "trainer.model.seq_len"
    );
    let f = Files::new();
    let split = f.write("split.toml", "[trainer.model]\npath = \"m/a\"\n[orchestrator.model]\npath = \"m/b\"\n[[orchestrator.train.env]]\nid = \"x\"\n");
    assert_eq!(invalid_key(load_args::<RlConfig>(&["@", &split]).unwrap_err()), "orchestrator.model.path");
    assert_eq!(invalid_key(rl_with(&["--trainer.ckpt.interval", "3"]).unwrap_err()), "ckpt");
    let no_env = f.write("rl.toml", "[model]\npath = \"m\"\n");
    assert_eq!(invalid_key(load_args::<RlConfig>(&["@", &no_env]).unwrap_err()), "orchestrator.train.env");
}

#[test]
fn the_run_directory_and_the_embedded_endpoint_are_derived() {
    let c = rl_with(&["--output-dir", "/tmp/x", "--inference.port", "8123"]).unwrap();
    assert_eq!(c.run.name.as_deref(), Some("reverse-text--tiny"));
    assert_eq!(c.trainer.output_dir, std::path::Path::new("/tmp/x/reverse-text--tiny"));
    assert_eq!(c.orchestrator.output_dir, c.trainer.output_dir);
    assert_eq!(c.orchestrator.model.base_url, "http://127.0.0.1:8123/v1");
    let err =
        rl_with(&["--inference.port", "8123", "--orchestrator.model.base-url", "http://127.0.0.1:9/v1"]).unwrap_err();
    assert_eq!(invalid_key(err), "orchestrator.model.base_url");
    let parts = c.parts();
    assert_eq!(parts.env_servers.len(), 1);
    assert_eq!(parts.env_servers[0].config.env.id, "reverse-text");
    assert_eq!(parts.env_servers[0].config.serve.host, "127.0.0.1", "servers bind loopback by default");
}

#[test]
fn actor_and_algorithm_model_keys_must_be_configured() {
    let err = load_args::<OrchestratorConfig>(&["--actor", "teacher"]).unwrap_err();
    assert_eq!(invalid_key(err), "actor");
    let err = load_args::<OrchestratorConfig>(&["--algorithms", "sft"]).unwrap_err();
    assert_eq!(invalid_key(err), "algorithms.0");
    let err =
        load_args::<OrchestratorConfig>(&["--models.policy.base-url", "http://h/v1", "--models.policy.name", "p"])
            .unwrap_err();
    assert_eq!(invalid_key(err), "models.policy");
    let base = ["--models.ref.base-url", "http://127.0.0.1:9/v1", "--models.ref.name", "r"];
    let mut opd = base.to_vec();
    opd.extend(["--algorithms", r#"[{"id": "opd", "model": "ref"}]"#]);
    assert_eq!(invalid_key(load_args::<OrchestratorConfig>(&opd).unwrap_err()), "algorithms.0.model");
    opd.extend(["--models.ref.tokens"]);
    let c = load_args::<OrchestratorConfig>(&opd).unwrap().config;
    assert!(c.models["ref"].tokens);
    let mut sft = base.to_vec();
    sft.extend(["--actor", "ref", "--algorithms", "sft"]);
    let err = load_args::<OrchestratorConfig>(&sft).unwrap_err();
    assert_eq!(invalid_key(err), "models.ref.tokens", "sft trains the actor's token ids");
    sft.push("--models.ref.tokens");
    assert!(load_args::<OrchestratorConfig>(&sft).is_ok());
}

#[test]
fn per_env_sampling_overrides_merge_over_the_group() {
    let f = Files::new();
    let o = f.write(
        "o.toml",
        "[train.sampling]\ntemperature = 0.8\nmax_completion_tokens = 40\n[[train.env]]\nid = \"a\"\nsampling = { temperature = 0.2 }\n[[train.env]]\nid = \"b\"\n",
    );
    let c = load_args::<OrchestratorConfig>(&["@", &o]).unwrap().config;
    let a = c.env_sampling(&c.train.env[0]);
    assert_eq!((a.temperature.value(), a.max_completion_tokens), (0.2, Some(40)));
    let b = c.env_sampling(&c.train.env[1]);
    assert_eq!((b.temperature.value(), b.max_completion_tokens), (0.8, Some(40)));
    let bad = f.write("bad.toml", "[[train.env]]\nid = \"a\"\nsampling = { temperature = 2.5 }\n");
    assert_eq!(
        invalid_key(load_args::<OrchestratorConfig>(&["@", &bad]).unwrap_err()),
        "train.env.0.sampling.temperature"
    );
    let dup = f.write("dup.toml", "[[train.env]]\nid = \"a\"\n[[train.env]]\nid = \"a\"\n");
    assert_eq!(invalid_key(load_args::<OrchestratorConfig>(&["@", &dup]).unwrap_err()), "train.env.1.name");
}

#[test]
fn sft_schedules_need_a_sane_budget() {
    let err =
        load_args::<SftConfig>(&["--max-steps", "5", "--scheduler.type", "cosine", "--scheduler.warmup-steps", "10"])
            .unwrap_err();
    assert_eq!(invalid_key(err), "scheduler.warmup_steps");
    let err = load_args::<SftConfig>(&["--data.type", "jsonl"]).unwrap_err();
    assert!(err.to_string().contains("path"), "{err}");
    assert!(load_args::<SftConfig>(&["--data.task", "alphabet-sort"]).is_ok());
    let err = load_args::<SftConfig>(&["--data.task", "sorting"]).unwrap_err().to_string();
    assert!(err.contains("reverse-text") && err.contains("alphabet-sort"), "{err}");
}

/// prime-rl's `[data] name = "org/dataset"` reads a Hugging Face dataset without a `type`; its
/// keys are checked where they are given.
#[test]
fn sft_data_by_name_is_a_hugging_face_dataset() {
    let cfg = load_args::<SftConfig>(&["--data.name", "org/chat"]).unwrap().config;
    let SftDataConfig::Hf { name, subsets, splits, val_split } = &cfg.data else { panic!("{:?}", cfg.data) };
    assert_eq!((name.as_str(), subsets.len(), val_split), ("org/chat", 0, &None));
    assert_eq!(splits, &[String::from("train")]);
    assert!(matches!(load_args::<SftConfig>(&[]).unwrap().config.data, SftDataConfig::Task { .. }), "no name: a task");
    let err = load_args::<SftConfig>(&["--data.name", "org/chat", "--data.splits", "[]"]).unwrap_err();
    assert_eq!(invalid_key(err), "data.splits");
    let err = load_args::<SftConfig>(&["--data.name", " "]).unwrap_err();
    assert_eq!(invalid_key(err), "data.name");
    let err = load_args::<SftConfig>(&["--data.name", "org/chat", "--data.val-split", "test"]).unwrap_err();
    assert_eq!(invalid_key(err), "data.val_split");
    let ok = load_args::<SftConfig>(&["--data.name", "org/chat", "--data.val-split", "test", "--val", "{}"]);
    assert!(ok.is_ok(), "{ok:?}");
    let err = load_args::<SftConfig>(&["--data.name", "org/chat", "--data.num-examples", "3"]).unwrap_err();
    assert!(err.to_string().contains("num_examples"), "a task's key on a dataset is named: {err}");
    let cfg = load_args::<SftConfig>(&["--data.path", "rows.jsonl"]).unwrap().config;
    assert!(
        matches!(&cfg.data, SftDataConfig::Jsonl { path } if path == "rows.jsonl"),
        "a path: a file, {:?}",
        cfg.data
    );
}

#[test]
fn a_key_of_another_variant_names_the_variant_that_has_it() {
    let err = load_args::<SftConfig>(&["--data.type", "task", "--data.path", "rows.jsonl"]).unwrap_err().to_string();
    assert!(
        err.contains("`data.path` (from the command line) is a key of `data.type` = \"jsonl\", and this `data` is `type = \"task\"`"),
        "{err}"
    );
    // Unset, the default variant: a linear or cosine schedule's key on the constant one.
    let err = rl_with(&["--trainer.scheduler.min-lr", "1e-5"]).unwrap_err().to_string();
    assert!(
        err.contains("is a key of `trainer.scheduler.type` = \"linear\" or \"cosine\"")
            && err.contains("the default (`type` unset)"),
        "{err}"
    );
    // Algorithms are tagged by `id`.
    let algs = r#"[{"id": "grpo", "alpha": 0.5}]"#;
    let err = load_args::<OrchestratorConfig>(&["--algorithms", algs]).unwrap_err().to_string();
    assert!(
        err.contains("is a key of `algorithms.0.id` = \"echo\", and this `algorithms.0` is `id = \"grpo\"`"),
        "{err}"
    );
    // A key no variant has stays an unknown key with its suggestion.
    let err = load_args::<SftConfig>(&["--data.type", "task", "--data.pth", "x"]).unwrap_err();
    assert!(matches!(err, ConfigError::UnknownKey { .. }), "{err}");
}

#[test]
fn greedy_training_rollouts_are_rejected_naming_the_key_that_set_them() {
    let err = rl_with(&["--orchestrator.train.sampling.temperature", "0"]).unwrap_err();
    assert_eq!(invalid_key(err), "orchestrator.train.sampling.temperature");
    let err = rl_with(&["--orchestrator.train.env.0.sampling.temperature", "0"]).unwrap_err();
    assert_eq!(invalid_key(err), "orchestrator.train.env.0.sampling.temperature");
    // Between 0 and the floor, logits / T overflow: refused everywhere, eval included.
    let f = Files::new();
    let rl = f.write("rl.toml", MINIMAL_RL);
    let eval =
        f.write("eval.toml", "[orchestrator.eval]\ninterval = 2\n[[orchestrator.eval.env]]\nid = \"reverse-text\"\n");
    let args = ["@", rl.as_str(), "@", eval.as_str(), "--orchestrator.eval.sampling.temperature"];
    load_args::<RlConfig>(&[&args[..], &["0"]].concat()).expect("greedy eval is fine");
    let err = load_args::<RlConfig>(&[&args[..], &["0.001"]].concat()).unwrap_err();
    assert!(invalid_key(err).ends_with("sampling.temperature"));
    let err = rl_with(&["--orchestrator.train.sampling.temperature", "1e-40"]).unwrap_err();
    assert!(err.to_string().contains("0.01"), "{err}");
}

#[test]
fn non_finite_numbers_are_refused_naming_their_key() {
    let f = Files::new();
    let rl = f.write("rl.toml", MINIMAL_RL);
    for (file, key) in [
        ("[trainer.optim]\nlr = nan\n", "trainer.optim.lr"),
        ("[trainer.optim]\nlr = inf\n", "trainer.optim.lr"),
        ("[orchestrator.train.sampling]\ntop_p = -nan\n", "orchestrator.train.sampling.top_p"),
    ] {
        let extra = f.write("extra.toml", file);
        let err = load_args::<RlConfig>(&["@", rl.as_str(), "@", extra.as_str()]).unwrap_err().to_string();
        assert!(err.contains(key) && !err.contains("null"), "{file}: {err}");
    }
    let err = rl_with(&["--trainer.optim.lr", "nan"]).unwrap_err().to_string();
    assert!(err.contains("trainer.optim.lr") && !err.contains("null"), "{err}");
}

/// A duration past a week is a mistake, and past ~1.8e19 s no `Duration` holds it (the server
/// panicked on one before this bound).
#[test]
fn durations_are_bounded_to_a_week_naming_their_key() {
    for key in [
        "orchestrator.trainer_timeout_s",
        "orchestrator.model.timeout_s",
        "orchestrator.rollout_timeout_s",
        "trainer.batch_timeout_s",
        "inference.request_timeout_s",
        "launcher.stall_timeout_s",
    ] {
        for bad in ["1e30", "604800.5", "0", "-1"] {
            let err = rl_with(&[&format!("--{key}"), bad]).unwrap_err();
            let text = err.to_string();
            assert_eq!(invalid_key(err), key, "{key} = {bad}: {text}");
            assert!(text.contains("seconds in (0, 604800]"), "{key} = {bad}: {text}");
        }
        rl_with(&[&format!("--{key}"), "604800"]).unwrap_or_else(|e| panic!("{key} = a week: {e}"));
    }
}
#[test]
fn difficulty_pools_must_be_ordered_named_and_weighted() {
    let f = Files::new();
    let with = |pools: &str| {
        let o = f.write(
            "o.toml",
            &format!("[[train.env]]\nid = \"a\"\ncurriculum = {{ type = \"difficulty_pool\", pools = {pools} }}\n"),
        );
        load_args::<OrchestratorConfig>(&["@", &o])
    };
    let c = with(r#"[{name = "hard", threshold = 0.2, weight = 0.5}, {name = "rest", threshold = 1.0, weight = 1.0}]"#)
        .unwrap()
        .config;
    assert!(matches!(
        c.train.env[0].curriculum,
        rl_configs::CurriculumConfig::DifficultyPool { unseen_weight: 1.0, .. }
    ));
    let unordered =
        with(r#"[{name = "a", threshold = 0.5, weight = 1.0}, {name = "b", threshold = 0.5, weight = 1.0}]"#);
    assert_eq!(invalid_key(unordered.unwrap_err()), "train.env.0.curriculum.pools.1.threshold");
    let twice = with(r#"[{name = "a", threshold = 0.2, weight = 1.0}, {name = "a", threshold = 0.5, weight = 1.0}]"#);
    assert_eq!(invalid_key(twice.unwrap_err()), "train.env.0.curriculum.pools.1.name");
    let negative = with(r#"[{name = "a", threshold = 0.2, weight = -1.0}]"#);
    assert_eq!(invalid_key(negative.unwrap_err()), "train.env.0.curriculum.pools.0.weight");
    assert_eq!(invalid_key(with("[]").unwrap_err()), "train.env.0.curriculum.pools");
}

#[test]
fn env_names_cannot_be_paths() {
    for bad in ["../../../x", "a/b", "..", ""] {
        let err = rl_with(&["--orchestrator.train.env.0.name", bad]).unwrap_err();
        assert_eq!(invalid_key(err), "orchestrator.train.env.0.name", "{bad:?}");
    }
    let err = rl_with(&["--run.name", "../up"]).unwrap_err();
    assert_eq!(invalid_key(err), "run.name");
    assert!(rl_with(&["--orchestrator.train.env.0.name", "rt-2"]).is_ok());
    // `rl env-server` writes its resolved config under the env's name too.
    let f = Files::new();
    let cfg = f.write("env.toml", "[env]\nid = \"reverse-text\"\n");
    for bad in ["../../x", "a/b", ".."] {
        let err = load_args::<rl_configs::EnvServerConfig>(&["@", cfg.as_str(), "--env.name", bad]).unwrap_err();
        assert_eq!(invalid_key(err), "env.name", "{bad:?}");
    }
    let err = load_args::<rl_configs::EnvServerConfig>(&["@", cfg.as_str(), "--env.id", "../x"]).unwrap_err();
    assert_eq!(invalid_key(err), "env.id");
    assert!(load_args::<rl_configs::EnvServerConfig>(&["@", cfg.as_str(), "--env.name", "rt-2"]).is_ok());
}

#[test]
fn a_custom_env_server_command_names_a_program_and_excludes_an_address() {
    let f = Files::new();
    let with = |env: &str| {
        let path = f.write(
            "env.toml",
            &format!("max_steps = 5\n[model]\npath = \"m/tiny\"\n[[orchestrator.train.env]]\n{env}\n"),
        );
        load_args::<RlConfig>(&["@", path.as_str()]).map(|l| l.config)
    };
    let c = with("id = \"word-count\"\ncommand = [\"./my-env\", \"--verbose\"]").unwrap();
    let part = &c.parts().env_servers[0];
    assert_eq!(part.command.as_deref(), Some(&[String::from("./my-env"), String::from("--verbose")][..]));
    assert_eq!(part.config.env.id, "word-count", "the binary gets the same env-server config");
    assert_eq!(invalid_key(with("id = \"w\"\ncommand = []").unwrap_err()), "orchestrator.train.env.0.command");
    assert_eq!(
        invalid_key(with("id = \"w\"\ncommand = [\"./e\"]\naddress = \"127.0.0.1:1\"").unwrap_err()),
        "orchestrator.train.env.0.command"
    );
}

#[test]
fn checkpoints_keep_the_last_three_by_default_and_none_keeps_all_through_resolved_configs() {
    let mut c = rl_with(&["--ckpt.interval", "2"]).unwrap();
    assert_eq!(c.trainer.ckpt.as_ref().unwrap().keep_last, Some(rl_configs::DEFAULT_KEEP_LAST));
    c = rl_with(&["--ckpt.interval", "2", "--ckpt.keep-last", "None"]).unwrap();
    let ckpt = c.orchestrator.ckpt.unwrap();
    assert_eq!(ckpt.keep_last, None);
    // What a child process reads back from the launcher's resolved JSON.
    let back: rl_configs::CkptConfig = serde_json::from_value(serde_json::to_value(&ckpt).unwrap()).unwrap();
    assert_eq!(back.keep_last, None, "keep all survives the resolved config");
}

#[test]
fn sampling_extra_cannot_name_fields_the_client_sets() {
    let err = rl_with(&["--orchestrator.train.sampling.extra", r#"{"min_p": 0.1, "n": 4}"#]).unwrap_err();
    assert!(invalid_key(err).ends_with("sampling.extra.n"));
    rl_with(&["--orchestrator.train.sampling.extra", r#"{"min_p": 0.1}"#]).unwrap();
}

#[test]
fn the_embedded_server_loads_weights_from_the_run_only_and_its_keys_reach_the_orchestrator() {
    let c = rl_with(&[
        "--inference.port",
        "0",
        "--inference.api-key-env",
        "MY_KEY",
        "--inference.admin-key-env",
        "MY_ADMIN",
        "--output-dir",
        "/tmp/o",
        "--run.name",
        "r",
    ])
    .unwrap();
    let parts = c.parts();
    let inference = parts.inference.unwrap();
    assert_eq!(inference.weight_roots, [std::path::PathBuf::from("/tmp/o/r/broadcasts")]);
    assert_eq!(parts.orchestrator.model.api_key_env.as_deref(), Some("MY_KEY"));
    assert_eq!(parts.orchestrator.model.admin_key_env.as_deref(), Some("MY_ADMIN"));
    // The policy samples the plain distribution (prime-rl's `--generation-config vllm`) unless set.
    assert_eq!(inference.generation_config, Some(rl_configs::GenerationConfigSource::Vllm));
    let auto = rl_with(&["--inference.port", "0", "--inference.generation-config", "auto"]).unwrap();
    assert_eq!(auto.parts().inference.unwrap().generation_config, Some(rl_configs::GenerationConfigSource::Auto));
}

#[test]
fn a_wandb_section_needs_a_project_and_an_interpreter() {
    let err = rl_with(&["--wandb", r#"{"mode": "offline"}"#]).unwrap_err();
    assert_eq!(invalid_key(err), "wandb.project");
    let err = rl_with(&["--wandb", r#"{"project": "p", "python": []}"#]).unwrap_err();
    assert_eq!(invalid_key(err), "wandb.python");
    let c = rl_with(&["--wandb", r#"{"project": "p", "mode": "offline"}"#]).unwrap();
    assert_eq!(c.wandb.unwrap().mode, rl_configs::WandbMode::Offline);
}

#[test]
fn rft_fields_are_checked() {
    let with = |algos: &str| rl_with(&["--orchestrator.algorithms", algos]);
    let c = with(r#"["grpo", {"id": "rft", "top": 2, "min_reward": 0.5}]"#).unwrap();
    assert!(matches!(
        &c.orchestrator.algorithms[1],
        rl_configs::AlgorithmConfig::Builtin(rl_configs::BuiltinAlgorithm::Rft(rl_configs::algorithms::RftConfig { top: 2, weight, .. })) if *weight == 1.0
    ));
    assert_eq!(invalid_key(with(r#"[{"id": "rft", "top": 0}]"#).unwrap_err()), "orchestrator.algorithms.0.top");
    assert_eq!(invalid_key(with(r#"[{"id": "rft", "weight": -1}]"#).unwrap_err()), "orchestrator.algorithms.0.weight");
}

#[test]
fn vllms_lora_route_needs_adapters_an_external_server_and_its_own_name() {
    let lora = ["--orchestrator.model.lora-name", "policy-lora"];
    let err = rl_with(&lora).unwrap_err().to_string();
    assert!(err.contains("orchestrator.model.lora_name") && err.contains("[trainer.lora]"), "{err}");
    let with_adapters = [&lora[..], &["--trainer.lora.rank", "8"]].concat();
    let c = rl_with(&with_adapters).unwrap();
    assert_eq!(c.orchestrator.model.lora_name.as_deref(), Some("policy-lora"));
    let embedded = [&with_adapters[..], &["--inference.port", "8123"]].concat();
    let err = rl_with(&embedded).unwrap_err();
    assert!(err.to_string().contains("embedded [inference]"), "{err}");
    let same = [&with_adapters[..], &["--orchestrator.model.name", "policy-lora"]].concat();
    assert_eq!(invalid_key(rl_with(&same).unwrap_err()), "orchestrator.model.lora_name");
}

#[test]
fn an_eval_env_interval_of_zero_is_refused_naming_the_env() {
    let f = Files::new();
    let rl = f.write("rl.toml", MINIMAL_RL);
    let eval = f.write(
        "eval.toml",
        "[orchestrator.eval]\ninterval = 2\n[[orchestrator.eval.env]]\nid = \"reverse-text\"\n\
         [[orchestrator.eval.env]]\nid = \"reverse-text\"\nname = \"large\"\n",
    );
    let args = ["@", rl.as_str(), "@", eval.as_str(), "--orchestrator.eval.env.1.interval"];
    let ok = load_args::<RlConfig>(&[&args[..], &["100"]].concat()).expect("an env's own interval");
    assert_eq!(ok.config.orchestrator.eval.unwrap().env[1].interval, Some(100));
    let err = load_args::<RlConfig>(&[&args[..], &["0"]].concat()).unwrap_err();
    assert_eq!(invalid_key(err), "orchestrator.eval.env.1.interval");
}

/// A key the schema dropped because it changed nothing is refused with the reason, from a file
/// or the command line.
#[test]
fn removed_keys_say_why() {
    let err = load_args::<SftConfig>(&["--micro-batch-tokens", "4096"]).unwrap_err();
    assert!(matches!(&err, ConfigError::Removed { key, .. } if key == "micro_batch_tokens"), "{err}");
    assert!(err.to_string().contains("never changed a step") && err.to_string().contains("delete it"), "{err}");
    let f = Files::new();
    let file = f.write("rl.toml", &format!("{MINIMAL_RL}\n[trainer]\nmicro_batch_tokens = 8192\n"));
    let err = load_args::<RlConfig>(&["@", &file]).unwrap_err();
    let ConfigError::Removed { key, origin, .. } = &err else { panic!("{err}") };
    assert_eq!((key.as_str(), origin.as_str()), ("trainer.micro_batch_tokens", file.as_str()));
}
