//! LoRA adapters against HF PEFT: `scripts/check_peft.py` (PEFT loads an adapter `rl sft` wrote
//! and computes `rl inference`'s log-probabilities of base + adapter; `rl model merge` equals
//! PEFT's `merge_and_unload`) in the benchmark references' venv (torch, transformers, peft).

use anyhow::{Context, bail};

/// Runs the PEFT check with the workspace's debug `rl`.
pub(crate) fn check() -> anyhow::Result<()> {
    let root = crate::workspace::project_root();
    crate::workspace::build_rl_as_tested()?;
    let python = crate::bench::reference_python()?;
    let status = crate::venv::command(&python)
        .arg(root.join("scripts/check_peft.py"))
        .arg(root.join("target/debug/rl"))
        .current_dir(&root)
        .env_remove("PYTHONPATH")
        .status()
        .context("cannot run scripts/check_peft.py")?;
    if !status.success() {
        bail!("the PEFT check failed ({status})");
    }
    Ok(())
}
