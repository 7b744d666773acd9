//! Property: for generated valid configs, loading the TOML a config serializes to gives it back.

use std::collections::BTreeMap;
use std::path::PathBuf;

use proptest::prelude::*;
use rl_configs::algorithms::{
    Baseline, Credit, EchoConfig, EchoRole, GrpoConfig, OpdConfig, RaeConfig, RewardScaling, RftConfig,
};
use rl_configs::{
    AlgorithmConfig, BuiltinAlgorithm, CkptConfig, CurriculumConfig, DifficultyPool, InferenceConfig, ModelConfig,
    ModelEndpointConfig, OptimConfig, RlConfig, SamplingConfig, SamplingOverride, SchedulerConfig, Table, Temperature,
    TrainEnvConfig,
};
use serde_json::json;

use crate::{Files, load_args};

fn ratio() -> impl Strategy<Value = f64> {
    (1u32..=200).prop_map(|x| f64::from(x) / 100.0)
}

fn text() -> impl Strategy<Value = String> {
    "[a-z<>/ _-]{1,8}"
}

fn args() -> impl Strategy<Value = Table> {
    let value = prop_oneof![
        (-1000i64..1000).prop_map(|i| json!(i)),
        any::<bool>().prop_map(|b| json!(b)),
        text().prop_map(|s| json!(s)),
        ratio().prop_map(|f| json!(f)),
        prop::collection::vec(0i64..9, 0..3).prop_map(|v| json!(v)),
    ];
    prop::collection::btree_map("[a-z_]{1,6}", value, 0..4)
}

fn sampling() -> impl Strategy<Value = SamplingConfig> {
    (
        // Training rollouts are sampled at a temperature > 0.
        (1u32..=200).prop_map(|x| Temperature::new(f64::from(x) / 100.0).unwrap()),
        (1u32..=100).prop_map(|x| f64::from(x) / 100.0),
        prop::option::of(prop_oneof![Just(-1i64), 1i64..50]),
        prop::option::of(1u32..4096),
        prop::collection::vec(text(), 0..3),
        prop::option::of(0u64..1_000_000),
    )
        .prop_map(|(temperature, top_p, top_k, max_completion_tokens, stop, seed)| SamplingConfig {
            temperature,
            top_p,
            top_k,
            max_completion_tokens,
            stop,
            seed,
            extra: Table::new(),
        })
}

fn sampling_override() -> impl Strategy<Value = SamplingOverride> {
    (
        prop::option::of((1u32..=200).prop_map(|x| Temperature::new(f64::from(x) / 100.0).unwrap())),
        prop::option::of(1u32..512),
    )
        .prop_map(|(temperature, max_completion_tokens)| SamplingOverride {
            temperature,
            max_completion_tokens,
            ..Default::default()
        })
}

fn algorithm() -> impl Strategy<Value = AlgorithmConfig> {
    prop_oneof![
        Just(AlgorithmConfig::from_id("grpo")),
        Just(AlgorithmConfig::Builtin(BuiltinAlgorithm::Grpo(GrpoConfig {
            scale_rewards: RewardScaling::Group,
            credit: Credit::Turn,
            turn_discount: 0.5,
            best_of: 1,
            best_of_steps: None,
            baseline: Baseline::Greedy,
        }))),
        Just(AlgorithmConfig::from_id("max_rl")),
        Just(AlgorithmConfig::from_id("rl")),
        (1u32..4, ratio()).prop_map(|(top, min_reward)| AlgorithmConfig::Builtin(BuiltinAlgorithm::Rft(RftConfig {
            top,
            min_reward,
            weight: 0.5
        }))),
        (ratio(), prop::sample::subsequence(vec![EchoRole::Tool, EchoRole::User], 1..=2))
            .prop_map(|(alpha, roles)| AlgorithmConfig::Builtin(BuiltinAlgorithm::Echo(EchoConfig { alpha, roles }))),
        (1u32..64).prop_map(|max_concurrent| AlgorithmConfig::Builtin(BuiltinAlgorithm::Opd(OpdConfig {
            model: String::from("ref"),
            max_concurrent
        }))),
        ((0u32..100).prop_map(|m| f64::from(m) / 100.0), any::<bool>()).prop_map(|(momentum, drop_judge)| {
            AlgorithmConfig::Builtin(BuiltinAlgorithm::Rae(RaeConfig { momentum, drop_judge }))
        }),
        // `id` is the tag of the table, so it cannot also be a field.
        ("env_[a-z]{1,6}", args()).prop_map(|(id, mut fields)| {
            fields.remove("id");
            AlgorithmConfig::EnvOwned { id, fields }
        }),
    ]
}

fn algorithms() -> impl Strategy<Value = Vec<AlgorithmConfig>> {
    prop::collection::vec(algorithm(), 1..4).prop_map(|mut v| {
        let mut seen = std::collections::BTreeSet::new();
        v.retain(|a| seen.insert(a.id().to_owned()));
        v
    })
}

fn env(index: usize) -> impl Strategy<Value = TrainEnvConfig> {
    (
        prop::sample::select(vec!["reverse-text", "alphabet-sort", "wiki-nav"]),
        args(),
        prop::option::of(prop::sample::select(vec![1u32, 2, 4])),
        ratio(),
        sampling_override(),
        prop::option::of(algorithms()),
        prop_oneof![
            Just(CurriculumConfig::Uniform {}),
            (ratio(), 0.0f64..1.0).prop_map(|(unseen_weight, weight)| CurriculumConfig::DifficultyPool {
                pools: vec![
                    DifficultyPool { name: String::from("hard"), threshold: 0.3, weight },
                    DifficultyPool { name: String::from("rest"), threshold: 1.0, weight: 1.0 },
                ],
                unseen_weight,
            }),
        ],
    )
        .prop_map(move |(id, args, group_size, ratio, sampling, algorithms, curriculum)| TrainEnvConfig {
            name: Some(format!("env{index}")),
            args,
            group_size,
            ratio,
            sampling,
            algorithms,
            curriculum,
            ..TrainEnvConfig::new(id)
        })
}

fn optim() -> impl Strategy<Value = OptimConfig> {
    prop_oneof![
        ((1u32..1000).prop_map(|x| f64::from(x) * 1e-5), prop_oneof![ratio(), Just(0.0)]).prop_map(|(lr, max_norm)| {
            OptimConfig::Adamw { lr, weight_decay: 0.01, betas: [0.9, 0.95], eps: 1e-8, max_norm }
        }),
        (1u32..1000, any::<bool>()).prop_map(|(x, nesterov)| OptimConfig::Sgd {
            lr: f64::from(x) * 1e-4,
            momentum: 0.9,
            nesterov,
            weight_decay: 0.0,
            max_norm: 1.0
        }),
    ]
}

fn scheduler() -> impl Strategy<Value = SchedulerConfig> {
    prop_oneof![
        (0u64..5).prop_map(|warmup_steps| SchedulerConfig::Constant { warmup_steps }),
        (0u64..5, prop::option::of(1u64..50)).prop_map(|(warmup_steps, decay_steps)| SchedulerConfig::Linear {
            warmup_steps,
            decay_steps,
            min_lr: 0.0
        }),
        (0u64..5).prop_map(|warmup_steps| SchedulerConfig::Cosine { warmup_steps, min_lr: 0.0 }),
    ]
}

prop_compose! {
    fn rl_config()(
        envs in (1usize..4).prop_flat_map(|n| (0..n).map(env).collect::<Vec<_>>()),
        sampling in sampling(),
        algorithms in algorithms(),
        optim in optim(),
        scheduler in scheduler(),
        max_steps in 5u64..100,
        groups in 1u32..8,
        embedded in any::<bool>(),
        port in 1024u16..60000,
        ckpt in prop::option::of(1u64..20),
        seq_len in 64u32..4096,
    ) -> RlConfig {
        let mut c = RlConfig {
            model: Some(ModelConfig { path: Some(PathBuf::from("models/tiny")), name: None }),
            max_steps: Some(max_steps),
            ..RlConfig::default()
        };
        c.trainer.max_steps = Some(max_steps);
        c.orchestrator.max_steps = Some(max_steps);
        c.trainer.model.path = Some(PathBuf::from("models/tiny"));
        c.orchestrator.model.path = Some(PathBuf::from("models/tiny"));
        c.trainer.model.seq_len = seq_len;
        c.orchestrator.seq_len = seq_len;
        c.trainer.optim = optim;
        c.trainer.scheduler = scheduler;
        c.orchestrator.train.env = envs;
        c.orchestrator.train.sampling = sampling;
        c.orchestrator.algorithms = algorithms;
        c.orchestrator.batch_size = 4 * groups;
        c.orchestrator.models = BTreeMap::from([(String::from("ref"), ModelEndpointConfig {
            base_url: String::from("http://127.0.0.1:9000/v1"),
            name: String::from("ref-model"),
            tokens: true,
            timeout_s: 30.0,
            api_key_env: None,
            headers: Default::default(),
        })]);
        if embedded {
            c.inference = Some(InferenceConfig { port, model: ModelConfig { path: Some(PathBuf::from("models/tiny")), name: None }, ..Default::default() });
        }
        if let Some(interval) = ckpt {
            let ckpt = CkptConfig { interval, ..Default::default() };
            c.ckpt = Some(ckpt.clone());
            c.trainer.ckpt = Some(ckpt.clone());
            c.orchestrator.ckpt = Some(ckpt);
        }
        c
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn loading_the_serialized_config_gives_it_back(mut config in rl_config()) {
        config.resolve().unwrap();
        config.validate().unwrap();
        let text = toml::to_string(&config).unwrap();
        let f = Files::new();
        let path = f.write("config.toml", &text);
        let loaded = load_args::<RlConfig>(&["@", &path]).unwrap();
        prop_assert!(loaded.warnings.is_empty());
        prop_assert_eq!(loaded.config, config, "TOML was:\n{}", text);
    }
}
