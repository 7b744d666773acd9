//! The shipped recipes' plumbing, shrunk to seconds: what `scripts/reverse-text.sh`,
//! `scripts/alphabet-sort.sh`, `scripts/wiki-nav.sh` and `scripts/debate.sh` run — `rl model init`, `rl sft @ configs/<recipe>/sft.toml`, then
//! `rl rl @ configs/<recipe>/rl.toml` from the SFT model — with the real configs and a few steps,
//! checking that the greedy held-out evaluation runs before RL and at the end. (The learning
//! targets take minutes and are measured by running the scripts; see docs/recipes.md.)

use rl_run::RunDir;
use rl_run::{MetricsRow, read_jsonl};

use crate::{rl, stderr, stdout};

/// Runs a recipe's three commands under a temp dir (with `variant`'s `sft_V.toml` and `rl_V.toml`
/// layered, as `scripts/run-recipe.sh --variant V` does); returns the RL run's metrics rows.
fn recipe(
    dir: &str,
    variant: Option<&str>,
    init_extra: &[&str],
    sft_extra: &[&str],
    rl_extra: &[&str],
) -> Vec<MetricsRow> {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().to_str().unwrap();
    let base = tmp.path().join("tiny");
    let mut args = vec!["model", "init", "--out", base.to_str().unwrap(), "--seed", "4"];
    args.extend(init_extra);
    let o = rl(&args);
    assert!(o.status.success(), "model init: {}", stderr(&o));
    let sft_cfg = format!("configs/{dir}/sft.toml");
    let sft_layer = variant.map(|v| format!("configs/{dir}/sft_{v}.toml"));
    let mut args = vec!["sft", "@", &sft_cfg];
    if let Some(layer) = &sft_layer {
        args.extend(["@", layer]);
    }
    args.extend(["--output-dir", out, "--model.path", base.to_str().unwrap()]);
    args.extend(["--run.name", "sft", "--max-steps", "3", "--batch-size", "4", "--val.num-examples", "4"]);
    args.extend(["--scheduler.warmup-steps", "1"]);
    args.extend(sft_extra);
    let o = rl(&args);
    assert!(o.status.success(), "sft: {}", stderr(&o));
    let sft_model = tmp.path().join("sft").join("model");
    let rl_cfg = format!("configs/{dir}/rl.toml");
    let rl_layer = variant.map(|v| format!("configs/{dir}/rl_{v}.toml"));
    let mut args = vec!["rl", "@", &rl_cfg];
    if let Some(layer) = &rl_layer {
        args.extend(["@", layer]);
    }
    args.extend(["--output-dir", out, "--model.path", sft_model.to_str().unwrap()]);
    args.extend([
        "--run.name",
        "rl",
        "--max-steps",
        "2",
        "--orchestrator.batch-size",
        "8",
        "--orchestrator.group-size",
        "4",
    ]);
    args.extend(["--orchestrator.eval.num-examples", "2", "--orchestrator.eval.interval", "2"]);
    args.extend(rl_extra);
    let o = rl(&args);
    assert!(o.status.success(), "rl:\nstdout:\n{}\nstderr:\n{}", stdout(&o), stderr(&o));
    let run = RunDir::new(tmp.path().join("rl"));
    assert!(run.model().join("config.json").exists(), "the RL run exports its model");
    read_jsonl(&run.metrics()).unwrap()
}

/// The eval metrics of a row (`eval/<env>/...`), which must exist.
fn eval_mean(row: &MetricsRow, env: &str) -> f64 {
    let key = format!("eval/{env}/reward/mean");
    row.keyed.get(&key).and_then(serde_json::Value::as_f64).unwrap_or_else(|| panic!("no {key} at step {}", row.step))
}

fn check(rows: &[MetricsRow], env: &str) {
    assert_eq!(rows.iter().map(|r| r.step).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert!(rows[0].rollouts.is_none(), "step 0 is the evaluation before RL");
    for row in [&rows[0], &rows[2]] {
        let mean = eval_mean(row, env);
        assert!((0.0..=1.0).contains(&mean), "greedy eval reward {mean}");
        assert_eq!(row.keyed[&format!("eval/{env}/examples")], 2);
    }
    // A recipe with refill rounds adds the kept refill groups (of 4) to the planned 8 rollouts.
    let kept = rows[1].keyed.get("refill/groups_kept").and_then(serde_json::Value::as_u64).unwrap_or(0);
    assert_eq!(rows[1].rollouts.as_ref().map(|r| r.rollouts), Some(8 + 4 * kept));
}

#[test]
fn the_reverse_text_recipe_runs_sft_then_rl_with_greedy_evals() {
    let rows = recipe("reverse_text", None, &[], &[], &["--orchestrator.train.sampling.max-completion-tokens", "16"]);
    check(&rows, "reverse-text");
}

#[test]
fn the_alphabet_sort_recipe_runs_sft_then_multi_turn_rl_with_greedy_evals() {
    // scripts/alphabet-sort.sh: a BPE trained on the task's text; the 15-minute recipe it runs by
    // default (`--bpe-pieces attached --init-std 0.05 --variant fast`: 8 episodes a step, RL
    // batches of 128), the 30-minute one (`--variant base`) and `--variant exact` (SFT data in
    // FIRST / LAST groups balanced by greedy exact match).
    for (variant, pieces) in [(None, "isolated"), (Some("fast"), "attached"), (Some("exact"), "attached")] {
        let mut rl_extra =
            vec!["--orchestrator.train.sampling.max-completion-tokens", "24", "--trainer.scheduler.warmup-steps", "1"];
        if variant == Some("fast") {
            // Its second greedy eval, the 512 held-out episodes, at the start and the end: 2 here.
            rl_extra.extend(["--orchestrator.eval.env.1.num-examples", "2"]);
        }
        let mut init = vec!["--tokenizer-task", "alphabet-sort", "--bpe-pieces", pieces];
        if variant == Some("fast") {
            // The 15-minute recipe's initial weights are drawn at std 0.05.
            init.extend(["--init-std", "0.05"]);
        }
        let rows = recipe(
            "alphabet_sort",
            variant,
            &init,
            // The recipe generates 40,000-64,000 episodes; three steps need few.
            &["--seq-len", "512", "--data.num-examples", "64"],
            &rl_extra,
        );
        check(&rows, "alphabet-sort");
        assert!(rows[1].keyed.contains_key("refill/planned_reward"), "the recipe's refill round is on");
        if variant == Some("fast") {
            for row in [&rows[0], &rows[2]] {
                assert_eq!(row.keyed["eval/alphabet-sort-512/examples"], 2, "step {}", row.step);
            }
        }
    }
}

#[test]
fn the_wiki_nav_recipe_runs_with_the_tools_and_the_text_harness() {
    // scripts/wiki-nav.sh: a BPE trained on the task's text; --text layers the text harness.
    for variant in [None, Some("text")] {
        let rows = recipe(
            "wiki_nav",
            variant,
            &["--tokenizer-task", "wiki-nav"],
            &["--data.num-examples", "64"],
            &["--orchestrator.train.sampling.max-completion-tokens", "24", "--trainer.scheduler.warmup-steps", "1"],
        );
        check(&rows, "wiki-nav");
        assert!(
            rows[2].keyed.contains_key("eval/wiki-nav/metric/reached"),
            "{:?}",
            rows[2].keyed.keys().collect::<Vec<_>>()
        );
    }
}

#[test]
fn the_debate_recipe_runs_self_play_with_per_member_metrics() {
    let rows = recipe(
        "debate",
        None,
        &[],
        &["--data.num-examples", "64"],
        &["--orchestrator.train.sampling.max-completion-tokens", "24", "--trainer.scheduler.warmup-steps", "1"],
    );
    assert_eq!(rows.iter().map(|r| r.step).collect::<Vec<_>>(), vec![0, 1, 2]);
    let has = |row: &MetricsRow, key: &str| {
        assert!(
            row.keyed.contains_key(key),
            "no {key} at step {}: {:?}",
            row.step,
            row.keyed.keys().collect::<Vec<_>>()
        )
    };
    for row in [&rows[0], &rows[2]] {
        assert_eq!(row.keyed["eval/debate/examples"], 2);
        for m in ["accuracy/debater_a", "accuracy/debater_b", "decided", "agree"] {
            has(row, &format!("eval/debate/metric/{m}"));
        }
    }
    // 8 debates of 2 debaters (the recipe's verdict is the grader's: no judge member): each
    // member's reward and RAE baseline, the debaters' accuracy and the decided fraction.
    assert_eq!(rows[1].rollouts.as_ref().map(|r| r.rollouts), Some(16));
    for m in ["debater_a", "debater_b"] {
        has(&rows[1], &format!("reward/member/debate/{m}"));
        has(&rows[1], &format!("algorithm/debate/rae/baseline/{m}"));
        has(&rows[1], &format!("algorithm/debate/rae/advantage/{m}"));
        has(&rows[1], &format!("env/debate/metric/accuracy/{m}"));
        has(&rows[2], &format!("eval/debate/reward/member/{m}"));
    }
    assert!(!rows[2].keyed.keys().any(|k| k.contains("pass@")), "members' traces are not attempts");
    has(&rows[1], "env/debate/metric/decided");
}
