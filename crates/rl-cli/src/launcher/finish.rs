//! The ends of a run: which checkpoint `--resume` continues from, and the final model a finished
//! run leaves in `<run>/model` (and a LoRA run's adapter in `<run>/adapter`).

use std::io::Write;

use anyhow::{Context, bail};
use rl_configs::RlConfig;
use rl_run::RunDir;

/// The checkpoint step to resume from: `wanted`, or the latest step for which both the trainer
/// and the orchestrator finished a checkpoint. `interval` is the run's `[ckpt] interval`: with
/// one, a run that stopped before its first complete checkpoint is told to start over.
pub(crate) fn resume_step(run: &RunDir, wanted: Option<u64>, interval: Option<u64>) -> anyhow::Result<u64> {
    let complete = run.complete_checkpoints();
    if let Some(s) = wanted {
        if complete.contains(&s) {
            return Ok(s);
        }
        bail!(
            "cannot resume from step {s}: {} lacks a complete trainer or orchestrator checkpoint",
            run.checkpoint(s).display()
        );
    }
    let why = match interval {
        Some(n) => format!(
            "the run stopped before its first (one every {n} steps); start it again with --clean instead of --resume"
        ),
        None => String::from("set [ckpt] interval to write them"),
    };
    complete.last().copied().with_context(|| {
        format!(
            "cannot resume: no complete checkpoint (trainer and orchestrator) in {}: {why}",
            run.checkpoints().display()
        )
    })
}

/// Writes the last broadcast weights as an HF-format model directory at `<run>/model` (config and
/// tokenizer files from the starting model); a LoRA run's adapter goes to `<run>/adapter` as it
/// is (PEFT's format) and merged into the base as the model.
pub(crate) fn export_final_model(run: &RunDir, config: &RlConfig) -> anyhow::Result<()> {
    let src = config.trainer.model.path.clone().context("trainer.model.path is required")?;
    let (step, dir) = run
        .latest_broadcast()
        .with_context(|| format!("no complete weight broadcast to export in {}", run.broadcasts().display()))?;
    let cfg = rl_model::read_config(&src)?;
    let cpu = candle_core::Device::Cpu;
    let mut out = std::io::stdout().lock();
    let tensors = if rl_model::is_adapter_dir(&dir) {
        let (lora, adapters) = rl_model::read_adapter_dir(&cfg, &dir, &cpu)?;
        let mut list: Vec<_> = adapters.clone().into_iter().collect();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        let base_name = std::path::absolute(&src).unwrap_or_else(|_| src.clone());
        rl_model::write_adapter_dir(&run.adapter(), &lora, &base_name.to_string_lossy(), &list)?;
        writeln!(out, "LoRA adapter (after step {step}) written to {}", run.adapter().display())?;
        rl_model::merge_adapters(&cfg, &lora, &rl_model::read_weights(&src, &cpu)?, &adapters)?
    } else {
        rl_model::read_weights(&dir, &cpu)?
    };
    let mut tensors: Vec<_> = tensors.into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    rl_model::write_model_dir(&run.model(), &cfg, &tensors, &src)?;
    writeln!(out, "final model (after step {step}) written to {}", run.model().display())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resuming_without_a_complete_checkpoint_says_what_to_do() {
        let tmp = tempfile::tempdir().unwrap();
        let run = RunDir::new(tmp.path());
        let early = resume_step(&run, None, Some(50)).unwrap_err().to_string();
        assert!(early.contains("before its first (one every 50 steps)") && early.contains("--clean"), "{early}");
        let never = resume_step(&run, None, None).unwrap_err().to_string();
        assert!(never.contains("set [ckpt] interval"), "{never}");
        let named = resume_step(&run, Some(4), Some(2)).unwrap_err().to_string();
        assert!(named.contains("step_4") || named.contains("step 4"), "{named}");
    }
}
