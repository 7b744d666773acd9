//! Weight broadcasts (`<run>/broadcasts/step_N/{model.safetensors, STABLE}`) and trainer
//! checkpoints (`<run>/checkpoints/step_N/trainer/`), each written so a reader never sees half a file.

use std::path::{Path, PathBuf};

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::optim::Optimizer;

/// `<run>/broadcasts/step_N`.
pub fn broadcast_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("broadcasts").join(format!("step_{step}"))
}

/// Writes the weights of `step`, then the `STABLE` marker that tells readers they are complete.
pub fn write_broadcast(run_dir: &Path, step: u64, tensors: &[(String, Tensor)]) -> Result<PathBuf> {
    let dir = broadcast_dir(run_dir, step);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    rl_model::write_safetensors(&dir.join("model.safetensors"), tensors)?;
    std::fs::write(dir.join("STABLE"), b"").map_err(|e| Error::io(dir.join("STABLE"), e))?;
    Ok(dir)
}

/// Removes broadcasts older than `step - 2`, except those of checkpoint steps.
pub fn clean_broadcasts(run_dir: &Path, step: u64, ckpt_interval: Option<u64>) -> Result<()> {
    for (s, dir) in numbered_dirs(&run_dir.join("broadcasts"))? {
        let kept_for_ckpt = ckpt_interval.is_some_and(|i| s > 0 && s % i == 0);
        if s + 2 < step && !kept_for_ckpt {
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
    }
    Ok(())
}

/// `step_N` subdirectories of `dir`, sorted by N.
pub fn numbered_dirs(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(out) };
    for entry in entries.flatten() {
        if let Some(n) = entry.file_name().to_str().and_then(|n| n.strip_prefix("step_")).and_then(|n| n.parse().ok()) {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// `<run>/checkpoints/step_N/trainer`.
pub fn checkpoint_dir(run_dir: &Path, step: u64) -> PathBuf {
    run_dir.join("checkpoints").join(format!("step_{step}")).join("trainer")
}

/// Writes a trainer checkpoint (weights, optimizer, progress) via a temp dir and a rename; keeps
/// only the newest `keep_last` checkpoints when set.
pub fn write_checkpoint(
    run_dir: &Path,
    step: u64,
    tensors: &[(String, Tensor)],
    opt: &Optimizer,
    keep_last: Option<u32>,
) -> Result<PathBuf> {
    let dir = checkpoint_dir(run_dir, step);
    let parent = dir.parent().expect("checkpoint dirs have a parent");
    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    let tmp = parent.join(format!(".trainer.tmp.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    rl_model::write_safetensors(&tmp.join("model.safetensors"), tensors)?;
    opt.save(&tmp)?;
    let progress = serde_json::json!({"step": step});
    std::fs::write(tmp.join("progress.json"), progress.to_string()).map_err(|e| Error::io(&tmp, e))?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    }
    std::fs::rename(&tmp, &dir).map_err(|e| Error::io(&dir, e))?;
    if let Some(keep) = keep_last {
        let all = numbered_dirs(&run_dir.join("checkpoints"))?;
        let trainer_ckpts: Vec<_> = all.into_iter().filter(|(_, d)| d.join("trainer").exists()).collect();
        let excess = trainer_ckpts.len().saturating_sub(keep as usize);
        for (_, d) in trainer_ckpts.into_iter().take(excess) {
            std::fs::remove_dir_all(d.join("trainer")).map_err(|e| Error::io(&d, e))?;
        }
    }
    Ok(dir)
}

/// The checkpoint to resume from: `step`, or the latest one.
pub fn find_checkpoint(run_dir: &Path, step: Option<u64>) -> Result<(u64, PathBuf)> {
    let root = run_dir.join("checkpoints");
    match step {
        Some(s) => {
            let dir = checkpoint_dir(run_dir, s);
            if dir.join("progress.json").exists() {
                Ok((s, dir))
            } else {
                Err(Error::Checkpoint { path: dir, message: String::from("does not exist (or is incomplete)") })
            }
        }
        None => numbered_dirs(&root)?
            .into_iter()
            .rev()
            .map(|(s, d)| (s, d.join("trainer")))
            .find(|(_, d)| d.join("progress.json").exists())
            .ok_or_else(|| Error::Checkpoint {
                path: root,
                message: String::from("no trainer checkpoint to resume from"),
            }),
    }
}
