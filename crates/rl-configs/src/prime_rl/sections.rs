//! prime-rl's sections outside the orchestrator: `[monitors]`, the trainer's `model`, `optim` and
//! `loss` spellings, the SFT `[data]` keys our top level holds, and `[inference.server]` /
//! `[inference.vllm]`.

use serde_json::{Map, Value, json};

use super::shared::Notes;
use crate::deprecated::join;
use crate::error::{ConfigError, Result};

/// `[monitors]`: `wandb` is our `[wandb]`; `file` (metrics.jsonl) is always written here.
pub(super) fn monitors(root: &mut Value, notes: &mut Notes<'_>) -> Result<()> {
    let Value::Object(top) = root else { return Ok(()) };
    let Some(monitors) = top.remove("monitors") else { return Ok(()) };
    let Value::Object(monitors) = monitors else {
        return Err(ConfigError::invalid("monitors", "must be a table (`[monitors.wandb]`)"));
    };
    for (name, value) in monitors {
        let key = format!("monitors.{name}");
        match name.as_str() {
            "wandb" => {
                let Value::Object(mut wandb) = value else {
                    return Err(ConfigError::invalid(key, "must be a table"));
                };
                match wandb.remove("offline") {
                    Some(Value::Bool(true)) => {
                        wandb.insert(String::from("mode"), json!("offline"));
                        notes.push(format!("{key}.offline"), "wandb.mode");
                    }
                    Some(Value::Bool(false)) | None => {}
                    Some(_) => return Err(ConfigError::invalid(format!("{key}.offline"), "must be true or false")),
                }
                if top.contains_key("wandb") {
                    return Err(ConfigError::invalid(key, "and `[wandb]` are the same section: set one"));
                }
                top.insert(String::from("wandb"), Value::Object(wandb));
                notes.push(key, "wandb");
            }
            "file" => {
                let path = value.get("path").and_then(Value::as_str).unwrap_or("metrics.jsonl");
                if path != "metrics.jsonl" {
                    return Err(ConfigError::invalid(
                        format!("{key}.path"),
                        format!(
                            "metrics go to `<run dir>/metrics.jsonl` here (and the trainer's to `trainer/metrics.jsonl`); `{path}` is not supported"
                        ),
                    ));
                }
                notes.said(key, String::from("`<run dir>/metrics.jsonl`, always written"));
            }
            _ => {
                return Err(ConfigError::invalid(
                    key,
                    "is a prime-rl monitor with no counterpart here: `[wandb]` and `[tensorboard]` are",
                ));
            }
        }
    }
    Ok(())
}

/// prime-rl's SFT `[data]` table (`type = "sft"`) holds keys our top level holds: `seq_len` (tokens
/// per packed row), `loss_mask` and `seed` move there, and its `batch_size` (packed rows a step)
/// is our `batch_rows`; its default `shuffle`, `micro_batch_size` and `num_workers` are how this
/// trainer works anyway.
pub(super) fn sft_data(root: &mut Value, notes: &mut Notes<'_>) -> Result<()> {
    let Value::Object(top) = root else { return Ok(()) };
    let Some(Value::Object(data)) = top.get_mut("data") else { return Ok(()) };
    if data.get("type").and_then(Value::as_str) == Some("sft") {
        data.remove("type");
        notes.said(String::from("data.type = \"sft\""), String::from("a dataset by `data.name`"));
    }
    // A dataset by name (prime-rl's, or ours of type `hf`) has no `seed` of its own; our task
    // generator's `seed` (`type = "task"`) is its own key, not prime-rl's.
    let by_name = match data.get("type").and_then(Value::as_str) {
        Some(t) => t == "sft" || t == "hf",
        None => data.contains_key("name"),
    };
    // prime-rl's `batch_size` counts packed rows of `seq_len` tokens a step: our `batch_rows`.
    let mut moved = Vec::new();
    for (field, ours) in
        [("seq_len", "seq_len"), ("loss_mask", "loss_mask"), ("seed", "seed"), ("batch_size", "batch_rows")]
    {
        if field == "seed" && !by_name {
            continue;
        }
        if let Some(value) = data.remove(field) {
            moved.push((field, ours, value));
        }
    }
    for (field, default) in [("shuffle", json!(true)), ("micro_batch_size", json!(1)), ("num_workers", json!(1))] {
        match data.remove(field) {
            Some(v) if v == default => {
                notes.said(format!("data.{field} = {v}"), String::from("what this trainer does anyway"))
            }
            Some(v) => {
                let why = match field {
                    "shuffle" => "is not supported: examples are drawn in a seeded shuffled order (`seed`)",
                    "micro_batch_size" => "is not supported: each packed row is its own forward and backward here",
                    _ => "is not supported: data is read in-process",
                };
                return Err(ConfigError::invalid(format!("data.{field}"), format!("= {v} {why}")));
            }
            None => {}
        }
    }
    for (field, ours, value) in moved {
        if top.contains_key(ours) {
            return Err(ConfigError::invalid(
                format!("data.{field}"),
                format!("and `{ours}` are the same key: set one"),
            ));
        }
        top.insert(ours.to_owned(), value);
        notes.push(format!("data.{field}"), ours);
    }
    Ok(())
}
/// prime-rl's `[inference.server]` (`host`, `port`) and `[inference.vllm]` (the engine's settings
/// that this engine has too: `model`, `max_model_len`, `dtype`, `seed`, `tool_call_parser`,
/// `reasoning_parser`, `generation_config`); vLLM's other engine settings have no counterpart and
/// are refused.
pub(super) fn inference(section: &mut Map<String, Value>, at: &str, notes: &mut Notes<'_>) -> Result<()> {
    let mut moved = Vec::new();
    if let Some(server) = section.remove("server") {
        let Value::Object(server) = server else {
            return Err(ConfigError::invalid(join(at, "server"), "must be a table"));
        };
        for (field, value) in server {
            let key = join(at, &format!("server.{field}"));
            if !matches!(field.as_str(), "host" | "port") {
                return Err(ConfigError::invalid(key, "has no counterpart here (`host` and `port` do)"));
            }
            moved.push((key, field, value));
        }
    }
    if let Some(vllm) = section.remove("vllm") {
        let Value::Object(vllm) = vllm else { return Err(ConfigError::invalid(join(at, "vllm"), "must be a table")) };
        for (field, value) in vllm {
            let key = join(at, &format!("vllm.{field}"));
            let value = match field.as_str() {
                "dtype" => match value.as_str() {
                    Some("auto") => {
                        notes.said(
                            key,
                            String::from(
                                "the default `dtype` (f32; a bf16 checkpoint's weights are kept in bf16, exactly)",
                            ),
                        );
                        continue;
                    }
                    Some("bfloat16" | "bf16") => json!("bf16"),
                    Some("float16" | "half" | "f16") => json!("f16"),
                    Some("float32" | "float" | "f32") => json!("f32"),
                    _ => return Err(ConfigError::invalid(key, "expected auto, bfloat16, float16 or float32")),
                },
                "reasoning_parser" if value == json!("auto") => {
                    notes.said(key, String::from("the default `reasoning_parser = \"none\"` (RL reads token ids)"));
                    continue;
                }
                "max_model_len" | "seed" | "tool_call_parser" | "reasoning_parser" | "generation_config" => value,
                "model" => {
                    moved.push((key, String::from("model"), json!({ "name": value })));
                    continue;
                }
                _ => {
                    return Err(ConfigError::invalid(
                        key,
                        "is a vLLM engine setting with no counterpart in `rl inference` (to serve the policy with \
                         vLLM itself, see docs/guide-vllm.md)",
                    ));
                }
            };
            moved.push((key, field, value));
        }
    }
    for (key, field, value) in moved {
        if field == "model" {
            let model = section.entry("model").or_insert_with(|| json!({}));
            if let (Some(model), Value::Object(given)) = (model.as_object_mut(), value) {
                for (k, v) in given {
                    if model.get(&k).is_some_and(|old| *old != v) {
                        return Err(ConfigError::invalid(
                            key,
                            format!("and `{}` differ: set one", join(at, "model.name")),
                        ));
                    }
                    model.insert(k, v);
                }
            }
            notes.push(key, &join(at, "model.name"));
            continue;
        }
        if section.get(&field).is_some_and(|old| *old != value) {
            return Err(ConfigError::invalid(key, format!("and `{}` differ: set one", join(at, &field))));
        }
        section.insert(field.clone(), value);
        notes.push(key, &join(at, &field));
    }
    Ok(())
}

/// prime-rl's trainer `model` keys that tune PyTorch itself.
const TORCH_MODEL_KEYS: &[&str] = &[
    "ac",
    "ac_offloading",
    "compile",
    "fsdp_cpu_offload",
    "optim_cpu_offload",
    "full_offload",
    "reshard_after_forward",
    "dp_replicate",
    "ep",
    "cp",
    "cp_style",
    "optimization_dtype",
    "reduce_dtype",
    "moe_router_dtype",
    "fused_lm_head_token_chunk_size",
    "quantization",
];

/// prime-rl's trainer spellings in the trainer's table `at`: `model.lora` is our `lora`; its
/// `model.impl` / `model.attn` = "auto" is the one implementation here; AdamW's `betas1` /
/// `betas2` are our `betas`, `max_norm = None` our 0 (no clipping); the default loss's
/// `dppo_mask_low` / `dppo_mask_high` our `mask_low` / `mask_high`.
pub(super) fn trainer(section: &mut Map<String, Value>, at: &str, notes: &mut Notes<'_>) -> Result<()> {
    if let Some(Value::Object(model)) = section.get_mut("model") {
        let model_at = join(at, "model");
        for field in ["impl", "attn"] {
            match model.remove(field) {
                Some(v) if v == json!("auto") => {
                    notes.said(
                        join(&model_at, &format!("{field} = \"auto\"")),
                        String::from("the one implementation here"),
                    );
                }
                Some(v) => {
                    return Err(ConfigError::invalid(
                        join(&model_at, field),
                        format!("= {v} has no counterpart: this trainer has one implementation (`auto`)"),
                    ));
                }
                None => {}
            }
        }
        if let Some(field) = model.keys().find(|k| TORCH_MODEL_KEYS.contains(&k.as_str())) {
            return Err(ConfigError::invalid(
                join(&model_at, field),
                "is a setting of prime-rl's PyTorch trainer (activation checkpointing, compilation, FSDP, \
                 parallelism, precision) with no counterpart here: this trainer's fused kernels keep what \
                 their backward needs and run on one device; remove it",
            ));
        }
        let lora = model.remove("lora");
        if model.is_empty() {
            section.remove("model");
        }
        if let Some(lora) = lora {
            let (old, new) = (join(&model_at, "lora"), join(at, "lora"));
            if section.contains_key("lora") {
                return Err(ConfigError::invalid(old, format!("and `{new}` are the same section: set one")));
            }
            section.insert(String::from("lora"), lora);
            notes.push(old, &new);
        }
    }
    if let Some(Value::Object(optim)) = section.get_mut("optim") {
        let optim_at = join(at, "optim");
        let (b1, b2) = (optim.remove("betas1"), optim.remove("betas2"));
        if b1.is_some() || b2.is_some() {
            let betas = json!([b1.unwrap_or(json!(0.9)), b2.unwrap_or(json!(0.999))]);
            optim.insert(String::from("betas"), betas);
            notes.push(join(&optim_at, "betas1/betas2"), &join(&optim_at, "betas"));
        }
        if optim.get("max_norm").is_some_and(Value::is_null) {
            optim.insert(String::from("max_norm"), json!(0.0));
            notes.said(
                join(&optim_at, "max_norm = None"),
                format!("`{}` = 0 (no clipping)", join(&optim_at, "max_norm")),
            );
        }
    }
    if let Some(Value::Object(loss)) = section.get_mut("loss") {
        let loss_at = join(at, "loss");
        match loss.remove("type") {
            Some(t) if t == json!("default") => {}
            Some(t) => {
                return Err(ConfigError::invalid(
                    join(&loss_at, "type"),
                    format!("= {t}: only prime-rl's `default` loss is here (docs/configuration.md, the loss)"),
                ));
            }
            None => {}
        }
        for (old, new) in [("dppo_mask_low", "mask_low"), ("dppo_mask_high", "mask_high")] {
            if let Some(v) = loss.remove(old) {
                loss.insert(new.to_owned(), v);
                notes.push(join(&loss_at, old), &join(&loss_at, new));
            }
        }
    }
    Ok(())
}

/// prime-rl's `orchestrator.model`: its `client` (`base_url`, one or a list; `api_key_var`;
/// `headers`) is our model's endpoint fields; its `lora` (`name`, else prime-rl's `r{rank}-a{alpha}`,
/// rank and alpha those of the trainer's adapter) our `lora_name`; `trust_remote_code = false` is
/// what this loader does (it runs no model code).
pub(super) fn orchestrator_model(
    model: &mut Map<String, Value>,
    at: &str,
    trainer_lora: Option<&Value>,
    notes: &mut Notes<'_>,
) -> Result<()> {
    match model.remove("trust_remote_code") {
        Some(Value::Bool(false)) | None => {}
        Some(v) => {
            return Err(ConfigError::invalid(
                join(at, "trust_remote_code"),
                format!("= {v}: no model code is run here; the architectures are built in"),
            ));
        }
    }
    if let Some(client) = model.remove("client") {
        let Value::Object(client) = client else {
            return Err(ConfigError::invalid(join(at, "client"), "must be a table"));
        };
        for (field, value) in client {
            let ours = match field.as_str() {
                "base_url" => "base_url",
                "api_key_var" => "api_key_env",
                "headers" => "headers",
                _ => {
                    return Err(ConfigError::invalid(
                        join(at, &format!("client.{field}")),
                        "has no counterpart here (`base_url`, `api_key_var` and `headers` do)",
                    ));
                }
            };
            let key = join(at, &format!("client.{field}"));
            if model.get(ours).is_some_and(|old| *old != value) {
                return Err(ConfigError::invalid(key, format!("and `{}` differ: set one", join(at, ours))));
            }
            model.insert(ours.to_owned(), value);
            notes.push(key, &join(at, ours));
        }
    }
    if let Some(lora) = model.remove("lora") {
        let key = join(at, "lora");
        let Value::Object(lora) = lora else { return Err(ConfigError::invalid(key, "must be a table")) };
        let from_trainer = |f: &str| trainer_lora.and_then(|l| l.get(f)).cloned();
        for field in ["rank", "alpha"] {
            if let (Some(given), Some(trainer)) = (lora.get(field), from_trainer(field))
                && *given != trainer
            {
                return Err(ConfigError::invalid(
                    join(&key, field),
                    format!("= {given}, but the trainer's adapter has {trainer}: they are one adapter"),
                ));
            }
        }
        let name = match lora.get("name") {
            Some(name) => name.clone(),
            None => {
                let part =
                    |f: &str, default: Value| lora.get(f).cloned().or_else(|| from_trainer(f)).unwrap_or(default);
                let text = |v: Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
                json!(format!("r{}-a{}", text(part("rank", json!(16))), text(part("alpha", json!(32.0)))))
            }
        };
        if let Some(field) = lora.keys().find(|k| !matches!(k.as_str(), "name" | "rank" | "alpha")) {
            return Err(ConfigError::invalid(join(&key, field), "is not a key of prime-rl's orchestrator LoRA"));
        }
        model.insert(String::from("lora_name"), name);
        notes.push(key, &join(at, "lora_name"));
    }
    Ok(())
}

/// prime-rl's `log.json_logging` is our `log.json`, its `ckpt.output_dir` our `ckpt.dir`.
pub(super) fn log_and_ckpt_keys(section: &mut Map<String, Value>, at: &str, notes: &mut Notes<'_>) {
    for (table, old, new) in [("log", "json_logging", "json"), ("ckpt", "output_dir", "dir")] {
        let Some(Value::Object(t)) = section.get_mut(table) else { continue };
        if let Some(v) = t.remove(old) {
            t.insert(new.to_owned(), v);
            notes.push(join(at, &format!("{table}.{old}")), &join(at, &format!("{table}.{new}")));
        }
    }
}

/// prime-rl's `[weight_broadcast]`: `filesystem` is how weights reach the server here (files in
/// the run directory); NCCL and NIXL are refused.
pub(super) fn weight_broadcast(top: &mut Map<String, Value>, notes: &mut Notes<'_>) -> Result<()> {
    let Some(wb) = top.remove("weight_broadcast") else { return Ok(()) };
    match wb.get("type").and_then(Value::as_str) {
        Some("filesystem") if wb.as_object().is_some_and(|m| m.len() == 1) => {
            notes.said(
                String::from("weight_broadcast"),
                String::from("how weights reach the server here (files in the run directory)"),
            );
            Ok(())
        }
        _ => Err(ConfigError::invalid(
            "weight_broadcast",
            format!(
                "= {wb}: weights are broadcast through files here (`type = \"filesystem\"`); NCCL and NIXL are not supported"
            ),
        )),
    }
}
