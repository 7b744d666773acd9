//! Weight broadcasts (`<run>/broadcasts/step_N/{model.safetensors, STABLE}`) and trainer
//! checkpoints (`<run>/checkpoints/step_N/trainer/`), or with LoRA the adapters in PEFT's files,
//! each written so a reader never sees half a file.

use std::path::PathBuf;

use rl_run::RunDir;
use rl_run::{persist, steps_in, temp_path, write_atomic};

use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::weights::Trained;

/// Writes the weights (or adapters) of `step`, then the `STABLE` marker that tells readers they
/// are complete.
pub fn write_broadcast(run: &RunDir, step: u64, trained: &Trained<'_>) -> Result<PathBuf> {
    let dir = run.broadcast(step);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    trained.write_into(&dir)?;
    write_atomic(&run.broadcast_marker(step), b"")?;
    Ok(dir)
}

/// Removes broadcasts older than `step - 2`, except those of checkpoint steps.
pub fn clean_broadcasts(run: &RunDir, step: u64, ckpt_interval: Option<u64>) -> Result<()> {
    for (s, dir) in steps_in(&run.broadcasts()) {
        let kept_for_ckpt = ckpt_interval.is_some_and(|i| s > 0 && s % i == 0);
        if s + 2 < step && !kept_for_ckpt {
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
    }
    Ok(())
}

/// Writes a trainer checkpoint (weights, optimizer, progress) via a temp dir and a rename; keeps
/// only the newest `keep_last` checkpoints when set.
pub fn write_checkpoint(
    run: &RunDir,
    step: u64,
    trained: &Trained<'_>,
    opt: &Optimizer,
    keep_last: Option<u32>,
) -> Result<PathBuf> {
    let dir = run.trainer_checkpoint(step);
    let tmp = temp_path(&dir);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    trained.write_into(&tmp)?;
    opt.save(&tmp)?;
    let marker = tmp.join(run.trainer_checkpoint_marker(step).file_name().unwrap_or_default());
    std::fs::write(&marker, serde_json::json!({"step": step}).to_string()).map_err(|e| Error::io(&marker, e))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    }
    persist(&tmp, &dir)?;
    if let Some(keep) = keep_last {
        let trainer_ckpts: Vec<u64> =
            run.checkpoint_steps().into_iter().filter(|&s| run.trainer_checkpoint(s).exists()).collect();
        let excess = trainer_ckpts.len().saturating_sub(keep as usize);
        for s in trainer_ckpts.into_iter().take(excess) {
            let d = run.trainer_checkpoint(s);
            std::fs::remove_dir_all(&d).map_err(|e| Error::io(&d, e))?;
        }
    }
    Ok(dir)
}

/// The checkpoint to resume from: `step`, or the latest one.
pub fn find_checkpoint(run: &RunDir, step: Option<u64>) -> Result<(u64, PathBuf)> {
    match step {
        Some(s) if run.trainer_checkpoint_marker(s).exists() => Ok((s, run.trainer_checkpoint(s))),
        Some(s) => Err(Error::Checkpoint {
            path: run.trainer_checkpoint(s),
            message: String::from("does not exist (or is incomplete)"),
        }),
        None => run
            .checkpoint_steps()
            .into_iter()
            .rev()
            .find(|&s| run.trainer_checkpoint_marker(s).exists())
            .map(|s| (s, run.trainer_checkpoint(s)))
            .ok_or_else(|| Error::Checkpoint {
                path: run.checkpoints(),
                message: String::from("no trainer checkpoint to resume from"),
            }),
    }
}
