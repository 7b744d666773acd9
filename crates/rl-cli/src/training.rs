//! `rl trainer`: runs the RL trainer over the batches the orchestrator writes, printing one line
//! per step.

use std::io::Write;

use anyhow::Context;
use rl_configs::TrainerConfig;

/// Trains until `max_steps` (or until a batch does not arrive within `batch_timeout_s`).
pub(crate) fn trainer(_command: &str, config: &TrainerConfig) -> anyhow::Result<()> {
    crate::logging::init(&config.log);
    let mut trainer = rl_trainer::RlTrainer::new(config).context("cannot start the trainer")?;
    let TrainerConfig { output_dir, .. } = config;
    tracing::info!(step = trainer.step, run = %output_dir.display(), "trainer started");
    trainer
        .run(|r| {
            let m = r.row(0.0);
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "step {} | loss {:.4} | mismatch_kl {:.2e} | grad_norm {:.3} | lr {:.2e} | {:.0} tok/s{}",
                m.step,
                m.loss,
                m.mismatch_kl,
                m.grad_norm,
                m.lr,
                m.tokens_per_s,
                if m.optimizer_skipped { " | no token trained: optimizer step skipped" } else { "" }
            );
        })
        .context("training failed")?;
    Ok(())
}
