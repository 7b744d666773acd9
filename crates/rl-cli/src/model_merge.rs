//! `rl model merge`: a LoRA adapter directory (PEFT's format, ours or PEFT's own) merged into its
//! base model, written as an HF-format model directory every command (and transformers) loads.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};

pub(crate) const USAGE: &str = "rl model merge --adapter DIR --out DIR [--base DIR] [--force]";

pub(crate) const HELP: &str = "Merges a LoRA adapter into its base model: every adapted projection W becomes
W + alpha / r * B A, written with the base's config and tokenizer files.

  --adapter DIR  the adapter directory (adapter_config.json + adapter_model.safetensors), e.g.
                 <run>/adapter of a LoRA run
  --base DIR     the base model directory (HF format), or a hub id in the local Hugging Face hub
                 cache; default: the adapter's `base_model_name_or_path`, a directory or a hub id
                 found in that cache (nothing is downloaded)
  --out DIR      the merged model directory to create (refused if it exists, unless --force)
  --force        replace an existing directory";

/// Runs `rl model merge` with the arguments after `merge`.
pub(crate) fn merge(args: &[String]) -> anyhow::Result<()> {
    let (mut base, mut adapter, mut out, mut force) = (None, None, None, false);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> anyhow::Result<PathBuf> {
            it.next().map(PathBuf::from).with_context(|| format!("`{name}` needs a value; usage: {USAGE}"))
        };
        match arg.as_str() {
            "--base" => base = Some(value("--base")?),
            "--adapter" => adapter = Some(value("--adapter")?),
            "--out" => out = Some(value("--out")?),
            "--force" => force = true,
            other => bail!("unexpected argument `{other}`; usage: {USAGE}"),
        }
    }
    let need = |v: Option<PathBuf>, name: &str| v.with_context(|| format!("`{name} DIR` is required; usage: {USAGE}"));
    let (adapter, out) = (need(adapter, "--adapter")?, need(out, "--out")?);
    if out.exists() && !force {
        bail!("{} exists; pass --force to replace it", out.display());
    }
    if !rl_model::is_adapter_dir(&adapter) {
        bail!("{} is not an adapter directory: it has no {}", adapter.display(), rl_model::ADAPTER_CONFIG);
    }
    let base = match base {
        Some(base) => {
            let given = base.to_string_lossy();
            rl_data::cached_model(&given).with_context(|| format!("--base {given}"))?.unwrap_or(base)
        }
        None => rl_model::adapter_base_dir(&adapter)?,
    };
    let cfg = rl_model::read_config(&base)?;
    let cpu = candle_core::Device::Cpu;
    let (lora, adapters) = rl_model::read_adapter_dir(&cfg, &adapter, &cpu)?;
    let merged = rl_model::merge_adapters(&cfg, &lora, &rl_model::read_weights(&base, &cpu)?, &adapters)?;
    let mut tensors: Vec<_> = merged.into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    rl_model::write_model_dir(&out, &cfg, &tensors, &base)?;
    writeln!(
        std::io::stdout().lock(),
        "merged the rank-{} adapter on {} into {}",
        lora.shape.rank,
        lora.targets().iter().map(|p| p.module()).collect::<Vec<_>>().join(", "),
        out.display()
    )?;
    Ok(())
}
