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
            let m = r.json(0.0);
            let f = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "step {} | loss {:.4} | mismatch_kl {:.2e} | grad_norm {:.3} | lr {:.2e} | {:.0} tok/s",
                r.step,
                f("loss"),
                f("mismatch_kl"),
                r.grad_norm,
                r.lr,
                f("tokens_per_s")
            );
        })
        .context("training failed")?;
    Ok(())
}
