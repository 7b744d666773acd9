//! Loading semantics: file order, CLI precedence, key spelling, flags, lists, sections, deprecations.

use rl_configs::algorithms::{Baseline, EchoConfig, GrpoConfig};
use rl_configs::{
    AlgorithmConfig, BuiltinAlgorithm, ConfigError, OptimConfig, OrchestratorConfig, RlConfig, SchedulerConfig,
    SftConfig, TrainerConfig,
};
use serde_json::json;

use crate::{Files, MINIMAL_RL, load_args};

#[test]
fn later_files_win_and_tables_merge_deeply() {
    let f = Files::new();
    let a = f.write("a.toml", "batch_size = 8\n[train.sampling]\ntemperature = 0.5\nmax_completion_tokens = 10\n");
    let b = f.write("b.toml", "[train.sampling]\ntemperature = 0.9\n");
    let c = load_args::<OrchestratorConfig>(&["@", &a, "@", &b]).unwrap().config;
    assert_eq!(c.batch_size, 8);
    assert_eq!(c.train.sampling.temperature.value(), 0.9);
    assert_eq!(c.train.sampling.max_completion_tokens, Some(10));
}

#[test]
fn command_line_beats_files_in_either_spelling() {
    let f = Files::new();
    let a = f.write("a.toml", "[train.sampling]\ntemperature = 0.5\n");
    let c = load_args::<OrchestratorConfig>(&[
        "@",
        &a,
        "--train.sampling.temperature",
        "0.7",
        "--max-off-policy-steps",
        "3",
        "--group_size=2",
    ])
    .unwrap()
    .config;
    assert_eq!(c.train.sampling.temperature.value(), 0.7);
    assert_eq!(c.max_off_policy_steps, 3);
    assert_eq!(c.group_size, 2);
}

#[test]
fn flags_lists_and_json_values() {
    let c = load_args::<OrchestratorConfig>(&[
        "--no-filter-zero-advantages",
        "--train.sampling.stop",
        "</a>",
        "</b>",
        "--train.sampling.extra",
        r#"{"min_p": 0.1}"#,
        "--algorithms",
        r#"["grpo", {"id": "echo", "alpha": 0.5}]"#,
    ])
    .unwrap()
    .config;
    assert!(!c.filter_zero_advantages);
    assert_eq!(c.train.sampling.stop, ["</a>", "</b>"]);
    assert_eq!(c.train.sampling.extra.get("min_p"), Some(&json!(0.1)));
    assert_eq!(c.algorithms.len(), 2);
    assert!(
        matches!(&c.algorithms[1], AlgorithmConfig::Builtin(BuiltinAlgorithm::Echo(EchoConfig { alpha, .. })) if *alpha == 0.5)
    );
    let c = load_args::<OrchestratorConfig>(&["--algorithms", "grpo", "my_env_algo"]).unwrap().config;
    assert_eq!(c.algorithms.iter().map(AlgorithmConfig::id).collect::<Vec<_>>(), ["grpo", "my_env_algo"]);
}

#[test]
fn array_of_tables_is_indexed_on_the_command_line() {
    let f = Files::new();
    let a = f.write(
        "a.toml",
        "batch_size = 16\n[[train.env]]\nid = \"reverse-text\"\n[[train.env]]\nid = \"alphabet-sort\"\n",
    );
    let c =
        load_args::<OrchestratorConfig>(&["@", &a, "--train.env.1.group-size", "8", "--train.env.1.args.seed", "7"])
            .unwrap()
            .config;
    assert_eq!(c.train.env.len(), 2, "indexing must not replace the list");
    assert_eq!(c.train.env[0].group_size, Some(4), "resolved from orchestrator.group_size");
    assert_eq!(c.train.env[1].group_size, Some(8));
    assert_eq!(c.train.env[1].args.get("seed"), Some(&json!(7)));
    let err = load_args::<OrchestratorConfig>(&["@", &a, "--train.env.5.id", "x"]).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
}

#[test]
fn a_file_can_be_loaded_into_a_section() {
    let f = Files::new();
    let rl = f.write("rl.toml", MINIMAL_RL);
    let t = f.write("t.toml", "[optim]\nlr = 0.01\n[scheduler]\ntype = \"cosine\"\nwarmup_steps = 2\n");
    let c = load_args::<RlConfig>(&["@", &rl, "--trainer", "@", &t, "--dry-run-is-not-a-key"]);
    assert!(matches!(c, Err(ConfigError::UnknownKey { .. })));
    let c = load_args::<RlConfig>(&["@", &rl, "--trainer", "@", &t]).unwrap().config;
    assert_eq!(c.trainer.optim.lr(), 0.01);
    assert_eq!(c.trainer.scheduler, SchedulerConfig::Cosine { warmup_steps: 2, min_lr: 0.0 });
}

#[test]
fn a_file_after_a_flag_is_not_read_as_the_flags_value() {
    let f = Files::new();
    let rl = f.write("rl.toml", MINIMAL_RL);
    let layer = f.write("layer.toml", "max_steps = 3\n");
    let err = load_args::<RlConfig>(&["@", &rl, "--clean", "@", &layer]).unwrap_err();
    let ConfigError::Cli { arg, message } = &err else { panic!("{err}") };
    assert_eq!(arg, "--clean");
    assert!(message.contains("boolean, not a section") && message.contains("before `--clean`"), "{message}");
    let c = load_args::<RlConfig>(&["@", &rl, "@", &layer, "--clean"]).unwrap().config;
    assert_eq!((c.max_steps, c.clean), (Some(3), true));
}

#[test]
fn tagged_sections_keep_the_default_variant_when_type_is_omitted() {
    let c = load_args::<TrainerConfig>(&["--optim.lr", "0.5", "--optim.max-norm", "0"]).unwrap().config;
    assert!(matches!(c.optim, OptimConfig::Adamw { lr, .. } if lr == 0.5));
    assert_eq!(c.optim.max_norm(), None, "0 disables clipping");
    let c = load_args::<TrainerConfig>(&["--optim.type", "sgd", "--optim.momentum", "0.5"]).unwrap().config;
    assert!(matches!(c.optim, OptimConfig::Sgd { momentum, .. } if momentum == 0.5));
}

#[test]
fn bare_optional_section_enables_it_and_none_disables_it() {
    let f = Files::new();
    let rl = f.write("rl.toml", MINIMAL_RL);
    let c = load_args::<RlConfig>(&["@", &rl, "--resume", "--ckpt.interval", "5"]).unwrap().config;
    assert_eq!(c.trainer.resume, Some(Default::default()));
    assert_eq!(c.orchestrator.resume, Some(Default::default()));
    assert_eq!(c.trainer.ckpt.as_ref().map(|c| c.interval), Some(5));
    assert_eq!(c.orchestrator.ckpt.as_ref().map(|c| c.interval), Some(5));
    let with_none = f.write("n.toml", "[train.sampling]\nmax_completion_tokens = \"None\"\n");
    let c = load_args::<OrchestratorConfig>(&["--train.sampling.max-completion-tokens", "5", "@", &with_none])
        .unwrap()
        .config;
    assert_eq!(c.train.sampling.max_completion_tokens, None);
}

#[test]
fn deprecated_keys_translate_with_one_warning_each_from_files_and_command_line() {
    let f = Files::new();
    let old = f.write(
        "old.toml",
        "max_steps = 5\n[model]\npath = \"m\"\n[orchestrator]\nrollouts_per_example = 4\n[orchestrator.sampling]\nmax_tokens = 12\n[[orchestrator.env]]\nid = \"reverse-text\"\n",
    );
    let loaded = load_args::<RlConfig>(&["@", &old]).unwrap();
    assert_eq!(loaded.warnings.len(), 4, "{:?}", loaded.warnings);
    let c = loaded.config;
    assert_eq!(c.orchestrator.group_size, 4);
    assert_eq!(c.orchestrator.train.sampling.max_completion_tokens, Some(12));
    assert_eq!(c.orchestrator.train.env[0].id, "reverse-text");
    for w in &loaded.warnings {
        assert!(w.to_string().contains(&old), "warning names the file: {w}");
    }
    let loaded = load_args::<OrchestratorConfig>(&["--sampling.max-tokens", "9"]).unwrap();
    assert_eq!(loaded.config.train.sampling.max_completion_tokens, Some(9));
    assert_eq!(loaded.warnings.len(), 2);
}

#[test]
fn deprecated_and_new_key_with_different_values_is_an_error() {
    let f = Files::new();
    let both = f.write("both.toml", "[sampling]\ntemperature = 0.3\n[train.sampling]\ntemperature = 0.4\n");
    let err = load_args::<OrchestratorConfig>(&["@", &both]).unwrap_err();
    assert!(matches!(&err, ConfigError::DeprecatedConflict { old, .. } if old == "sampling"), "{err}");
    let same = f.write("same.toml", "[sampling]\ntemperature = 0.3\n[train.sampling]\ntemperature = 0.3\n");
    assert!(load_args::<OrchestratorConfig>(&["@", &same]).is_ok());
}

#[test]
fn unknown_keys_name_the_full_path_the_file_and_a_suggestion() {
    let f = Files::new();
    let bad = f.write("bad.toml", "[[train.env]]\nid = \"x\"\ngroup_sise = 4\n");
    match load_args::<OrchestratorConfig>(&["@", &bad]).unwrap_err() {
        ConfigError::UnknownKey { key, origin, suggestion, .. } => {
            assert_eq!(key, "train.env.0.group_sise");
            assert_eq!(origin, bad);
            assert_eq!(suggestion.as_deref(), Some("group_size"));
        }
        other => panic!("expected an unknown-key error, got {other}"),
    }
    let err = load_args::<OrchestratorConfig>(&["--algorithms", r#"[{"id": "echo", "alfa": 1}]"#]).unwrap_err();
    assert!(
        matches!(&err, ConfigError::UnknownKey { key, suggestion, .. } if key == "algorithms.0.alfa" && suggestion.as_deref() == Some("alpha")),
        "{err}"
    );
}

#[test]
fn wrong_types_say_what_was_expected_and_what_was_found() {
    let f = Files::new();
    let bad = f.write("bad.toml", "batch_size = \"lots\"\n");
    let err = load_args::<OrchestratorConfig>(&["@", &bad]).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ConfigError::WrongType { .. }), "{msg}");
    assert!(msg.contains("batch_size") && msg.contains("u32") && msg.contains("lots"), "{msg}");
    let err = load_args::<OrchestratorConfig>(&["--batch-size", "many"]).unwrap_err().to_string();
    assert!(err.contains("expected integer") && err.contains("many"), "{err}");
}

#[test]
fn toml_syntax_errors_name_the_file_and_line() {
    let f = Files::new();
    let bad = f.write("broken.toml", "a = 1\nb = [\n");
    let err = load_args::<OrchestratorConfig>(&["@", &bad]).unwrap_err().to_string();
    assert!(err.contains("broken.toml") && err.contains("line"), "{err}");
    let err = load_args::<OrchestratorConfig>(&["@", "/nonexistent/x.toml"]).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/x.toml"), "{err}");
}

#[test]
fn a_turn_discount_needs_turn_credit_and_a_value_in_zero_to_one() {
    let ok = load_args::<OrchestratorConfig>(&[
        "--algorithms",
        r#"[{"id": "grpo", "credit": "turn", "turn_discount": 0.0}]"#,
    ])
    .unwrap()
    .config;
    assert!(matches!(
        &ok.algorithms[0],
        AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo(GrpoConfig { turn_discount, .. })) if *turn_discount == 0.0
    ));
    let episode = load_args::<OrchestratorConfig>(&["--algorithms", r#"[{"id": "grpo", "turn_discount": 0.5}]"#])
        .unwrap_err()
        .to_string();
    assert!(episode.contains("algorithms.0.turn_discount") && episode.contains("credit = \"turn\""), "{episode}");
    let range = load_args::<OrchestratorConfig>(&[
        "--algorithms",
        r#"[{"id": "grpo", "credit": "turn", "turn_discount": 1.5}]"#,
    ])
    .unwrap_err()
    .to_string();
    assert!(range.contains("must be in [0, 1]") && range.contains("1.5"), "{range}");
}

#[test]
fn grpo_baseline_is_the_group_or_a_greedy_rollout_not_with_best_of() {
    let plain = load_args::<OrchestratorConfig>(&["--algorithms", r#"["grpo"]"#]).unwrap().config;
    assert!(matches!(
        &plain.algorithms[0],
        AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo(GrpoConfig { baseline: Baseline::Group, .. }))
    ));
    let greedy =
        load_args::<OrchestratorConfig>(&["--algorithms", r#"[{"id": "grpo", "baseline": "greedy"}]"#]).unwrap().config;
    assert!(matches!(
        &greedy.algorithms[0],
        AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo(GrpoConfig { baseline: Baseline::Greedy, .. }))
    ));
    let both =
        load_args::<OrchestratorConfig>(&["--algorithms", r#"[{"id": "grpo", "baseline": "greedy", "best_of": 2}]"#])
            .unwrap_err()
            .to_string();
    assert!(both.contains("algorithms.0.baseline") && both.contains("best_of"), "{both}");
    let typo = load_args::<OrchestratorConfig>(&["--algorithms", r#"[{"id": "grpo", "baseline": "mean"}]"#])
        .unwrap_err()
        .to_string();
    assert!(typo.contains("greedy") && typo.contains("group"), "{typo}");
}

#[test]
fn best_of_is_at_least_one_and_at_most_each_group() {
    let f = Files::new();
    // reverse-text uses the run's algorithms with the run's group of 8; alphabet-sort has its own
    // algorithms and a group of 4.
    let envs = f.write(
        "envs.toml",
        "batch_size = 16\ngroup_size = 8\n[[train.env]]\nid = \"reverse-text\"\n\
         [[train.env]]\nid = \"alphabet-sort\"\ngroup_size = 4\nalgorithms = [\"grpo\"]\n",
    );
    let grpo = |k: u32| format!(r#"[{{"id": "grpo", "best_of": {k}}}]"#);
    let ok = load_args::<OrchestratorConfig>(&["@", &envs, "--algorithms", &grpo(8)]).unwrap().config;
    assert!(matches!(
        &ok.algorithms[0],
        AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo(GrpoConfig { best_of: 8, .. }))
    ));
    let plain = load_args::<OrchestratorConfig>(&["--algorithms", r#"["grpo"]"#]).unwrap().config;
    assert!(
        matches!(&plain.algorithms[0], AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo(GrpoConfig { best_of: 1, .. }))),
        "the default is plain grpo"
    );
    let zero = load_args::<OrchestratorConfig>(&["--algorithms", &grpo(0)]).unwrap_err().to_string();
    assert!(zero.contains("algorithms.0.best_of") && zero.contains("at least 1"), "{zero}");
    let big = load_args::<OrchestratorConfig>(&["@", &envs, "--algorithms", &grpo(9)]).unwrap_err().to_string();
    assert!(big.contains("algorithms.0.best_of") && big.contains("group size of `reverse-text` (8)"), "{big}");
    let own =
        load_args::<OrchestratorConfig>(&["@", &envs, "--train.env.1.algorithms", &grpo(5)]).unwrap_err().to_string();
    assert!(own.contains("train.env.1.algorithms.0.best_of") && own.contains("(4)"), "{own}");
    let annealed =
        load_args::<OrchestratorConfig>(&["--algorithms", r#"[{"id": "grpo", "best_of": 4, "best_of_steps": 100}]"#])
            .unwrap()
            .config;
    assert!(matches!(
        &annealed.algorithms[0],
        AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo(GrpoConfig { best_of: 4, best_of_steps: Some(100), .. }))
    ));
    let useless = load_args::<OrchestratorConfig>(&["--algorithms", r#"[{"id": "grpo", "best_of_steps": 100}]"#])
        .unwrap_err()
        .to_string();
    assert!(useless.contains("algorithms.0.best_of_steps") && useless.contains("set `best_of` above 1"), "{useless}");
    let zero =
        load_args::<OrchestratorConfig>(&["--algorithms", r#"[{"id": "grpo", "best_of": 2, "best_of_steps": 0}]"#])
            .unwrap_err()
            .to_string();
    assert!(zero.contains("algorithms.0.best_of_steps") && zero.contains("at least 1"), "{zero}");
}

/// A model path the binary's lookup resolves (a hub id in the hub cache) becomes the directory
/// found in every part, served under the id; a path it keeps stays, and its refusal names the key.
#[test]
fn model_paths_resolve_before_they_propagate() {
    let f = Files::new();
    let file = f.write("rl.toml", MINIMAL_RL);
    let lookup = |p: &str| -> Result<Option<std::path::PathBuf>, String> {
        match p {
            "m/tiny" => Ok(Some(std::path::PathBuf::from("/cache/models--m--tiny/snapshots/c1"))),
            "m/broken" => Err(String::from("no `refs/main`")),
            _ => Ok(None),
        }
    };
    let args =
        |extra: &[&str]| -> Vec<String> { ["@", file.as_str()].iter().chain(extra).map(|s| s.to_string()).collect() };
    let cfg = rl_configs::load_resolving::<RlConfig>(&args(&[]), &lookup).unwrap().config;
    let want = Some(std::path::PathBuf::from("/cache/models--m--tiny/snapshots/c1"));
    assert_eq!(cfg.trainer.model.path, want);
    assert_eq!(cfg.orchestrator.model.path, want);
    assert_eq!(cfg.orchestrator.model.name.as_deref(), Some("m/tiny"), "served under the id");
    assert_eq!(cfg.trainer.model.name.as_deref(), Some("m/tiny"));
    assert_eq!(cfg.run_name(), "reverse-text--tiny", "a run directory, not a path");
    let named = rl_configs::load_resolving::<RlConfig>(&args(&["--model.name", "mine"]), &lookup).unwrap().config;
    assert_eq!((named.orchestrator.model.path, named.orchestrator.model.name.as_deref()), (want.clone(), Some("mine")));
    let kept = rl_configs::load_resolving::<RlConfig>(&args(&["--model.path", "local/dir"]), &lookup).unwrap().config;
    assert_eq!(kept.trainer.model.path, Some(std::path::PathBuf::from("local/dir")));
    // prime-rl's way: the hub id as the name, no path.
    let f2 = Files::new();
    let by_name = f2.write("rl.toml", &MINIMAL_RL.replace("path = \"m/tiny\"", "name = \"m/tiny\""));
    let cfg = rl_configs::load_resolving::<RlConfig>(&["@".to_owned(), by_name], &lookup).unwrap().config;
    assert_eq!((cfg.trainer.model.path, cfg.trainer.model.name.as_deref()), (want, Some("m/tiny")));
    let err = rl_configs::load_resolving::<RlConfig>(&args(&["--model.path", "m/broken"]), &lookup).unwrap_err();
    assert!(err.to_string().contains("model.path") && err.to_string().contains("refs/main"), "{err}");
}

/// PEFT's `target_modules = "all-linear"`, from a file or the command line, is every projection.
#[test]
fn lora_target_modules_take_peft_all_linear() {
    let all = load_args::<SftConfig>(&["--lora.target-modules", "all-linear"]).unwrap().config;
    assert_eq!(all.lora.unwrap().target_modules.len(), 7);
    let f = Files::new();
    let file = f.write("sft.toml", "[lora]\ntarget_modules = \"all-linear\"\n");
    assert_eq!(load_args::<SftConfig>(&["@", &file]).unwrap().config.lora.unwrap().target_modules.len(), 7);
    let two = load_args::<SftConfig>(&["--lora.target-modules", "q_proj", "v_proj"]).unwrap().config;
    assert_eq!(two.lora.unwrap().target_modules, ["q_proj", "v_proj"]);
    let err = load_args::<SftConfig>(&["--lora.target-modules", "everything"]).unwrap_err().to_string();
    assert!(err.contains("lora.target_modules") || err.contains("all-linear"), "{err}");
}

#[test]
fn a_prime_rl_config_loads_with_a_note_per_translation() {
    let f = Files::new();
    let prime = f.write(
        "prime.toml",
        r#"max_steps = 20
seq_len = 2048
[model]
path = "m"
[monitors.wandb]
project = "reverse-text"
group = "sweep"
offline = true
[orchestrator]
batch_size = 128
group_size = 16
[orchestrator.train.sampling]
max_completion_tokens = 128
[[orchestrator.train.source]]
name = "reverse-text"
[orchestrator.train.source.env.taskset]
id = "reverse-text"
[orchestrator.train.source.env.agent.harness]
id = "null"
[orchestrator.eval]
group_size = 2
[[orchestrator.eval.source]]
env = { taskset = { id = "reverse-text", split = "test" } }
[orchestrator.renderer]
name = "prime-qwen3"
[trainer.model.lora]
rank = 8
alpha = 16
"#,
    );
    let loaded = load_args::<RlConfig>(&["@", &prime]).unwrap();
    let notes: Vec<String> = loaded.warnings.iter().map(|w| format!("{}: {w}", w.label())).collect();
    assert!(notes.iter().all(|n| n.starts_with("note: ")), "{notes:?}");
    assert!(notes.iter().any(|n| n.contains("`orchestrator.train.source`") && n.contains(&prime)), "{notes:?}");
    let c = loaded.config;
    let wandb = c.wandb.unwrap();
    assert_eq!((wandb.group.as_deref(), wandb.mode), (Some("sweep"), rl_configs::WandbMode::Offline));
    assert_eq!(c.trainer.lora.map(|l| l.rank), Some(8));
    let train = &c.orchestrator.train.env[0];
    assert_eq!((train.id.as_str(), train.name.as_deref()), ("verifiers", Some("reverse-text")));
    assert_eq!(train.args["renderer"], json!({"name": "prime-qwen3"}));
    let eval = c.orchestrator.eval.unwrap();
    assert_eq!((eval.k, eval.eval_on_start, eval.interval), (2, true, 100));
    assert_eq!(eval.env[0].args["env"]["taskset"]["split"], json!("test"));
    assert_eq!(eval.env[0].args["renderer"], json!({"name": "prime-qwen3"}));
}

#[test]
fn sft_steps_are_sized_by_batch_size_or_batch_rows_and_resolve_to_one() {
    let f = Files::new();
    let rows = load_args::<SftConfig>(&["--batch-rows", "2"]).unwrap().config;
    assert_eq!((rows.batch_rows, rows.batch_size), (Some(2), None));
    // The resolved config loads back as it was (it states one way of sizing a step).
    let resolved = f.write("sft.json", &rl_configs::to_json(&rows).to_string());
    assert_eq!(load_args::<SftConfig>(&["@", &resolved]).unwrap().config, rows);
    let plain = load_args::<SftConfig>(&[]).unwrap().config;
    assert_eq!((plain.batch_rows, plain.batch_size), (None, Some(16)));
    let err = load_args::<SftConfig>(&["--batch-rows", "2", "--batch-size", "8"]).unwrap_err().to_string();
    assert!(err.contains("batch_rows") && err.contains("set one"), "{err}");
}
