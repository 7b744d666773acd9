//! `rl sft`: supervised fine-tuning on a built-in task generator (the RL tasks' own format) or a
//! JSONL file (`sft_data.rs`: messages or prompt/completion rows); writes `<run>/model` as an
//! HF-format directory.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use rayon::prelude::*;
use rl_configs::{SftConfig, SftDataConfig};
use rl_run::RunDir;
use rl_trainer::{SftEnd, SftExample, SftGroup, SftTrainer, tokenize};

use crate::sft_data::SftConversation;

/// Drops training examples that would train nothing within `seq_len` tokens (their trained part
/// lies beyond it), warning with counts; fails when none is left. Returns the kept examples and a
/// note for the start line.
fn fit_to_seq_len(train: Vec<SftExample>, seq_len: usize) -> anyhow::Result<(Vec<SftExample>, String)> {
    let fit = rl_trainer::fit(&train, seq_len);
    if fit.untrainable == train.len() {
        bail!(
            "none of the {} training examples has a trained token within seq_len = {seq_len} (the longest has {} \
             tokens): raise `seq_len` or shorten the data",
            train.len(),
            fit.longest
        );
    }
    if fit.truncated == 0 {
        return Ok((train, String::new()));
    }
    tracing::warn!(
        "{} of {} training examples are longer than seq_len = {seq_len} (the longest has {} tokens) and are \
         truncated; {} of them have no trained token left and are dropped",
        fit.truncated,
        train.len(),
        fit.longest,
        fit.untrainable
    );
    let kept: Vec<SftExample> =
        train.into_iter().filter(|ex| rl_trainer::fit(std::slice::from_ref(ex), seq_len).untrainable == 0).collect();
    Ok((kept, format!(" ({} truncated to seq_len, {} dropped)", fit.truncated, fit.untrainable)))
}

/// Runs SFT to the end and saves the model.
pub(crate) fn sft(_command: &str, config: &SftConfig) -> anyhow::Result<()> {
    crate::logging::init(&config.log);
    let run_dir = config.run_dir();
    let run = RunDir::new(&run_dir);
    // Held to the end: a second launch on this run directory fails instead of sharing it.
    let _lock = crate::run_lock::lock_run(&run)?;
    prepare_run_dir(&run_dir, config)?;
    // The resolved config next to the run's output (what tracking sends as the run's config).
    rl_run::write_json_atomic(&run.config(rl_run::ConfigPart::Sft), &rl_configs::to_json(config))?;
    let mut trainer = SftTrainer::new(config).context("cannot start SFT")?;
    let (tok, template) = trainer.tokenizer()?;
    let data = conversations(config)?;
    // On every core, in order: the allocator (mimalloc, `rl_kernels::LargeBlockCache`) gives
    // each thread its own heap, so the tokenizer's many small blocks do not serialize.
    let encode = |cs: &[SftConversation]| -> anyhow::Result<Vec<SftExample>> {
        cs.par_iter()
            .map(|c| {
                tokenize(&tok, &template, &c.messages, &c.tools, c.first_trained, &config.loss_mask)
                    .map_err(anyhow::Error::from)
            })
            .collect()
    };
    let val = encode(&data.val)?;
    let mut train = Vec::new();
    let mut fit_notes = String::new();
    for group in &data.groups {
        let examples = encode(&group.train)?;
        let trained: usize = examples.iter().map(|e| e.mask.iter().filter(|m| **m).count()).sum();
        if trained == 0 {
            bail!("no trainable tokens: check `loss_mask` (which roles are trained) against the data");
        }
        let (examples, fit_note) = fit_to_seq_len(examples, config.seq_len as usize)?;
        fit_notes.push_str(&fit_note);
        train.push(SftGroup { name: group.name.clone(), train: examples, val: encode(&group.val)? });
    }
    let mut out = std::io::stdout().lock();
    let groups = match train.as_slice() {
        [_] => String::new(),
        many => format!(
            " in {} groups ({})",
            many.len(),
            many.iter().map(|g| format!("{}: {}", g.name, g.train.len())).collect::<Vec<_>>().join(", ")
        ),
    };
    writeln!(
        out,
        "sft: {} training / {} validation conversations{groups}{fit_notes}, run dir {}",
        train.iter().map(|g| g.train.len()).sum::<usize>(),
        val.len(),
        run_dir.display()
    )?;
    drop(out);
    let mut board = match &config.tensorboard {
        Some(t) => {
            let dir = t.dir.clone().unwrap_or_else(|| run.tensorboard());
            Some(
                crate::tensorboard::EventWriter::create(&dir)
                    .with_context(|| format!("cannot write in {}", dir.display()))?,
            )
        }
        None => None,
    };
    let mut sidecar = match config.wandb.as_ref().filter(|w| w.mode != rl_configs::WandbMode::Disabled) {
        Some(w) => Some(crate::tracking::start(&run, w, &run.log("wandb"))?),
        None => None,
    };
    let max = config.max_steps;
    crate::interrupt::watch()?;
    let trained = trainer.run(&train, &val, crate::interrupt::flag(), |r| {
        if let Some(b) = board.as_mut() {
            let row = serde_json::json!({"loss": r.loss, "val_loss": r.val_loss, "grad_norm": r.grad_norm, "lr": r.lr,
                "tokens_per_s": r.tokens_per_s});
            if let Err(e) = b.scalars(r.step, &row, "") {
                tracing::warn!("cannot write a TensorBoard event: {e}");
            }
        }
        let mut out = std::io::stdout().lock();
        let val = r.val_loss.map(|v| format!(" | val_loss {v:.4}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "step {}/{max} | loss {:.4}{val} | lr {:.2e} | grad_norm {:.3} | {:.0} tok/s",
            r.step, r.loss, r.lr, r.grad_norm, r.tokens_per_s
        );
        if !r.reweighed.is_empty() {
            let groups: Vec<String> = r
                .reweighed
                .iter()
                .map(|w| {
                    let exact = w.exact.map(|e| format!(" exact {e:.3}")).unwrap_or_default();
                    format!("{} loss {:.4}{exact} share {:.2}", w.name, w.val_loss, w.share)
                })
                .collect();
            let _ = writeln!(out, "  data groups re-weighed: {}", groups.join(" | "));
        }
        // Redraw at validation steps (cheap) so the picture follows a long run.
        if r.val_loss.is_some()
            && let Err(e) = crate::plot::sft_curves(&run)
        {
            tracing::warn!("could not draw the run's curves: {e:#}");
        }
    });
    // The sidecar sends what was written, whether training finished or failed.
    if let Some(child) = sidecar.as_mut() {
        let ended = crate::tracking::finish(child);
        let failed = child.try_wait().ok().flatten().is_some_and(|s| !s.success());
        if !ended || failed {
            let log = run.log("wandb");
            writeln!(
                std::io::stderr().lock(),
                "warning: the W&B sidecar failed or did not finish; see {}",
                log.display()
            )?;
        }
    }
    let end = trained?;
    crate::plot::sft_curves(&run)?;
    let model_dir = run.model();
    trainer.save_model(&model_dir)?;
    if let SftEnd::Interrupted { step, checkpoint } = end {
        let kept = match checkpoint {
            Some(c) => format!("its checkpoint is {}; continue with the same command and --resume", c.display()),
            None => String::from("no checkpoint was written ([ckpt] is not set), so a rerun starts over"),
        };
        bail!("interrupted after step {step}/{max}: the model of that step is in {}; {kept}", model_dir.display());
    }
    if trainer.save_adapter(&run.adapter())? {
        writeln!(std::io::stdout().lock(), "sft: wrote the LoRA adapter (PEFT format) to {}", run.adapter().display())?;
    }
    writeln!(std::io::stdout().lock(), "sft: wrote the fine-tuned model to {}", model_dir.display())?;
    Ok(())
}

/// A fresh run refuses a non-empty directory unless `clean` (which deletes it) or `resume`.
pub(crate) fn prepare_run_dir(run_dir: &Path, config: &SftConfig) -> anyhow::Result<()> {
    // A dry run's resolved configs are not a run: the real run with the same name may start.
    if RunDir::new(run_dir).has_run_output() && config.resume.is_none() {
        if !config.clean {
            bail!(
                "run directory {} is not empty: pass --clean to delete it, --resume to continue, or choose another --run.name",
                run_dir.display()
            );
        }
        if !run_dir.starts_with(&config.output_dir) {
            bail!("refusing to delete {}: it is not under output_dir", run_dir.display());
        }
        RunDir::new(run_dir).clear().with_context(|| format!("cannot clean {}", run_dir.display()))?;
    }
    std::fs::create_dir_all(run_dir).with_context(|| format!("cannot create {}", run_dir.display()))
}

/// One group of the SFT data as conversations: its training examples and held-out ones for its
/// share (`data.balance`).
struct ConversationGroup {
    name: String,
    train: Vec<SftConversation>,
    val: Vec<SftConversation>,
}

/// The training data in groups (one without `data.groups`) and the validation conversations.
struct Conversations {
    groups: Vec<ConversationGroup>,
    val: Vec<SftConversation>,
}

/// A group's name: its args as `key=value` pairs (strings unquoted), or `group<i>` for none.
/// One group of `all` but its last `val_n` conversations, which validate.
fn held_out(mut all: Vec<SftConversation>, val_n: usize, what: &str) -> anyhow::Result<Conversations> {
    if all.len() <= val_n {
        bail!("{what} has {} conversations; need more than the {val_n} held out for validation", all.len());
    }
    let val = all.split_off(all.len() - val_n);
    Ok(Conversations {
        groups: vec![ConversationGroup { name: String::from("all"), train: all, val: Vec::new() }],
        val,
    })
}

fn group_name(i: usize, group: &rl_configs::Table) -> String {
    if group.is_empty() {
        return format!("group{i}");
    }
    let value = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    group.iter().map(|(k, v)| format!("{k}={}", value(v))).collect::<Vec<_>>().join(",")
}

fn conversations(config: &SftConfig) -> anyhow::Result<Conversations> {
    let val_n = config.val.as_ref().map_or(0, |v| v.num_examples as usize);
    match &config.data {
        SftDataConfig::Task { task, num_examples, seed, args, groups, balance } => {
            let generate = |overrides: &rl_configs::Table, n: usize, test_n: usize, seed: u64| {
                let mut a: serde_json::Map<String, serde_json::Value> = args.clone().into_iter().collect();
                a.extend(overrides.clone());
                a.insert(String::from("num_examples"), serde_json::json!(n));
                a.insert(String::from("test_examples"), serde_json::json!(test_n));
                a.insert(String::from("seed"), serde_json::json!(seed));
                let convert = |split: &str| -> anyhow::Result<Vec<SftConversation>> {
                    let demos = rl_envs::demonstrations(task.env_id(), &a, split)?;
                    let tools: Vec<serde_json::Value> = demos.tools.iter().map(rl_serve::ToolSpec::to_json).collect();
                    Ok(demos
                        .conversations
                        .into_iter()
                        .map(|c| SftConversation {
                            messages: c.iter().map(crate::sft_data::template_message).collect(),
                            first_trained: 0,
                            tools: tools.clone(),
                        })
                        .collect())
                };
                anyhow::Ok((convert("train")?, convert("test")?))
            };
            let n = *num_examples as usize;
            if groups.is_empty() {
                let (train, val) = generate(&rl_configs::Table::new(), n, val_n, *seed)?;
                return Ok(Conversations {
                    groups: vec![ConversationGroup { name: String::from("all"), train, val: Vec::new() }],
                    val,
                });
            }
            // The validation set is the ungrouped data's, so its loss compares with runs without groups.
            let (_, val) = generate(&rl_configs::Table::new(), 1, val_n, *seed)?;
            let held_out = balance.as_ref().map_or(0, |b| b.num_examples as usize);
            let per_group = n.div_ceil(groups.len());
            let groups = groups
                .iter()
                .enumerate()
                .map(|(i, overrides)| {
                    // Each group its own seed, so no two groups hold the same episodes with other args.
                    let (train, val) = generate(overrides, per_group, held_out, seed.wrapping_add(i as u64 + 1))
                        .with_context(|| format!("data.groups[{i}]"))?;
                    Ok(ConversationGroup { name: group_name(i, overrides), train, val })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Ok(Conversations { groups, val })
        }
        SftDataConfig::Jsonl { path } => {
            held_out(crate::sft_data::read_file(path)?, val_n, &path.display().to_string())
        }
        SftDataConfig::Hf { name, subsets, splits, val_split } => {
            let read = |splits: &[String]| -> anyhow::Result<Vec<SftConversation>> {
                crate::sft_data::conversations(rl_data::load(name, subsets, splits)?)
            };
            let train = read(splits).context("data")?;
            let Some(val_split) = val_split else {
                return held_out(train, val_n, &format!("dataset `{name}`"));
            };
            let mut val = read(std::slice::from_ref(val_split)).context("data.val_split")?;
            if val.len() < val_n {
                bail!(
                    "data.val_split `{val_split}` of `{name}` has {} conversations; val.num_examples is {val_n}",
                    val.len()
                );
            }
            val.truncate(val_n);
            Ok(Conversations {
                groups: vec![ConversationGroup { name: String::from("all"), train, val: Vec::new() }],
                val,
            })
        }
    }
}
