//! `cargo xtask bench gpu`: the GPU benchmark of issue #15, run with the CUDA `rl` binary that
//! `cargo xtask build-cuda` links (`target/cuda/dist/rl`) on a Qwen3-0.6B-shaped model with random
//! weights (`rl model init --preset qwen3-0.6b`):
//!
//! - trainer tokens/s at 16k-token rows: `rl sft` on one 16k-token sample per step (the same
//!   forward, backward and AdamW an RL step runs; bf16 compute over f32 master weights), median
//!   over the steps after the first;
//! - decode tokens/s at batch 1 and 64: `rl inference` answering greedy completions with
//!   `ignore_eos`, all requests at once, completion tokens over wall time;
//! - mismatch KL between trainer and inference in bf16: a short on-policy `rl rl` run on
//!   reverse-text with both on the device, the trainer's mean `mismatch_kl`.
//!
//! Printed next to prime-rl's published 11,896 tokens/s (Qwen3-0.6B RL at 16k on one H100).
//! `--device cpu --preset tiny --tokens 1024 --rl target/release/rl` runs the same plumbing on a
//! CPU machine.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

/// prime-rl's reported trainer throughput for Qwen3-0.6B RL at 16k on one H100 (11.1% MFU).
const PRIME_RL_TOKENS_PER_S: f64 = 11_896.0;

struct Options {
    rl: PathBuf,
    device: String,
    dtype: String,
    preset: String,
    tokens: usize,
    /// Measure the PyTorch reference (off with `--no-reference`).
    reference: bool,
    /// Stop after the trainer (`--trainer-only`: an A/B of a trainer change in a minute or two).
    trainer_only: bool,
}

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let root = crate::workspace::project_root();
    let mut o = Options {
        rl: root.join("target/cuda/dist/rl"),
        device: String::from("cuda"),
        dtype: String::from("bf16"),
        preset: String::from("qwen3-0.6b"),
        tokens: 16_384,
        reference: true,
        trainer_only: false,
    };
    let mut it = args.iter().filter(|a| a.as_str() != "gpu");
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--rl" => o.rl = PathBuf::from(value()?),
            "--device" => o.device = value()?.clone(),
            "--dtype" => o.dtype = value()?.clone(),
            "--preset" => o.preset = value()?.clone(),
            "--tokens" => o.tokens = value()?.parse().context("--tokens takes a number")?,
            "--no-reference" => o.reference = false,
            "--trainer-only" => o.trainer_only = true,
            other => bail!(
                "unknown option {other} (--rl PATH, --device, --dtype, --preset, --tokens N, --no-reference, --trainer-only)"
            ),
        }
    }
    if !o.rl.exists() {
        bail!("{} does not exist: build it with `cargo xtask build-cuda` (or pass --rl)", o.rl.display());
    }
    if o.tokens < 256 {
        bail!("--tokens must be at least 256");
    }
    Ok(o)
}

fn run_ok(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn jsonl(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Text of `n` characters the char-level tokenizer of `rl model init` covers (one token each).
fn letters(n: usize, salt: usize) -> String {
    (0..n).map(|i| if (i + salt) % 7 == 6 { ' ' } else { char::from(b'a' + ((i * 13 + salt) % 26) as u8) }).collect()
}

/// The trainer's figures: tokens/s and, as medians like it, where a step's time went.
struct Trainer {
    tokens_per_s: f64,
    forward_s: f64,
    backward_s: f64,
    optimizer_s: f64,
}

impl Trainer {
    /// The step's split, for the printed table.
    fn split(&self, tokens: usize) -> String {
        let step = tokens as f64 / self.tokens_per_s.max(1e-9);
        // Medians of each phase need not sum to the median step: the rest is at least 0.
        let rest = (step - self.forward_s - self.backward_s - self.optimizer_s).max(0.0);
        format!(
            "a step {step:.2} s: forward + loss {:.2} s, backward {:.2} s, optimizer {:.2} s, the rest {rest:.2} s",
            self.forward_s, self.backward_s, self.optimizer_s
        )
    }
}

/// Trainer tokens/s on rows of one `tokens`-token sample.
fn trainer(o: &Options, model: &Path, work: &Path) -> anyhow::Result<Trainer> {
    let data = work.join("long.jsonl");
    let rows: Vec<String> = (0..8)
        .map(|i| json!({"prompt": letters(32, i), "completion": letters(o.tokens - 96, i + 1)}).to_string())
        .collect();
    std::fs::write(&data, rows.join("\n") + "\n").with_context(|| format!("cannot write {}", data.display()))?;
    let steps = "6";
    let tokens = o.tokens.to_string();
    let mut cmd = Command::new(&o.rl);
    cmd.args(["sft", "--data.type", "jsonl", "--data.path"])
        .arg(&data)
        .args(["--model.path"])
        .arg(model)
        .args(["--device", &o.device, "--dtype", &o.dtype, "--batch-size", "1", "--seq-len", &tokens])
        .args(["--max-steps", steps, "--run.name", "gpu-train", "--clean"])
        .arg("--output-dir")
        .arg(work);
    run_ok(&mut cmd, "rl sft (trainer throughput)")?;
    let rows = jsonl(&work.join("gpu-train/metrics.jsonl"))?;
    let timed: Vec<&Value> = rows.iter().filter(|r| r["step"].as_u64().is_some_and(|s| s > 1)).collect();
    let of = |key: &str| median(timed.iter().filter_map(|r| r[key].as_f64()).collect());
    if timed.is_empty() {
        bail!("rl sft wrote no step rows to {}", work.join("gpu-train/metrics.jsonl").display());
    }
    Ok(Trainer {
        tokens_per_s: of("tokens_per_s"),
        forward_s: of("time/forward_s"),
        backward_s: of("time/backward_s"),
        optimizer_s: of("time/optimizer_s"),
    })
}

/// The same trainer step in PyTorch + transformers on this machine's GPU (the python3 on PATH must
/// have torch with CUDA and transformers, as the GPU machines' images do; none is installed).
fn torch_reference(o: &Options, model: &Path) -> anyhow::Result<Value> {
    if o.device != "cuda" {
        bail!("only on CUDA");
    }
    let script = crate::workspace::project_root().join("scripts/bench_torch_train.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg("gpu")
        .arg(model)
        .args([o.tokens.to_string(), String::from("6")])
        .output()
        .context("cannot run python3")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{} failed: {}", script.display(), err.lines().last().unwrap_or(""));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().context("the reference printed nothing")?;
    serde_json::from_str(line).context("the reference printed no JSON")
}

/// A running `rl inference`, stopped on drop.
struct Server {
    child: Child,
    address: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(o: &Options, model: &Path, work: &Path) -> anyhow::Result<Server> {
    let mut child = Command::new(&o.rl)
        .args(["inference", "--model.path"])
        .arg(model)
        .args(["--device", &o.device, "--dtype", &o.dtype, "--port", "0", "--max-batch-size", "64"])
        .arg("--output-dir")
        .arg(work)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(work.join("inference.log")).context("cannot create inference.log")?)
        .spawn()
        .context("cannot start rl inference")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut server = Server { child, address: String::new() };
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v["event"] == "listening"
        {
            server.address = v["address"].as_str().unwrap_or_default().to_owned();
            return Ok(server);
        }
    }
    bail!("rl inference exited before listening")
}

/// POSTs `body` to `path` (HTTP/1.1, one request per connection); returns the JSON answer.
fn post(address: &str, path: &str, body: &Value) -> anyhow::Result<Value> {
    let mut stream = TcpStream::connect(address).with_context(|| format!("cannot connect to {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(1800)))?;
    let body = body.to_string();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").context("no HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{path} answered {}", head.lines().next().unwrap_or(""));
    }
    serde_json::from_str(body).context("the answer is not JSON")
}

/// Decode tokens/s of `batch` greedy completions of `new` tokens after 64-token prompts, sent at once.
fn decode(server: &Server, model_name: &str, batch: usize, new: usize) -> anyhow::Result<f64> {
    let start = Instant::now();
    let handles: Vec<_> = (0..batch)
        .map(|i| {
            let address = server.address.clone();
            let body = json!({"model": model_name, "prompt": letters(64, i), "max_tokens": new,
                              "temperature": 0.0, "ignore_eos": true});
            std::thread::spawn(move || post(&address, "/v1/completions", &body))
        })
        .collect();
    let mut tokens = 0u64;
    for h in handles {
        let v = h.join().map_err(|_| anyhow::anyhow!("a request thread panicked"))??;
        tokens += v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    }
    Ok(tokens as f64 / start.elapsed().as_secs_f64())
}

/// Mean trainer-vs-inference mismatch KL of a short on-policy run with both on the device.
fn mismatch_kl(o: &Options, model: &Path, work: &Path) -> anyhow::Result<f64> {
    let mut cmd = Command::new(&o.rl);
    cmd.args(["rl", "@", "configs/bench/gpu_kl.toml", "--model.path"])
        .arg(model)
        .args(["--trainer.device", &o.device, "--trainer.dtype", &o.dtype])
        .args(["--inference.device", &o.device, "--inference.dtype", &o.dtype, "--clean"])
        .arg("--output-dir")
        .arg(work)
        .current_dir(crate::workspace::project_root())
        .stdout(Stdio::null());
    run_ok(&mut cmd, "rl rl (mismatch KL)")?;
    let rows = jsonl(&work.join("gpu-kl/trainer/metrics.jsonl"))?;
    let kls: Vec<f64> = rows
        .iter()
        .filter(|r| r["rl_tokens"].as_u64().is_some_and(|n| n > 0))
        .filter_map(|r| r["mismatch_kl"].as_f64())
        .filter(|k| k.is_finite())
        .collect();
    if kls.is_empty() {
        bail!("the run's trainer trained no token, so it measured no mismatch_kl");
    }
    Ok(kls.iter().sum::<f64>() / kls.len() as f64)
}

pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let o = parse(args)?;
    let work = crate::workspace::project_root().join("target/bench/gpu");
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let model = work.join(&o.preset);
    let mut init = Command::new(&o.rl);
    init.args(["model", "init", "--preset", &o.preset, "--seed", "0", "--force", "--out"]).arg(&model);
    run_ok(&mut init, "rl model init")?;
    let name = o.preset.clone();

    let trained = trainer(&o, &model, &work)?;
    let (train, split) = (trained.tokens_per_s, trained.split(o.tokens));
    crate::workspace::eprintln_flush(&format!("bench gpu: trainer {train:.0} tokens/s; {split}"));
    if o.trainer_only {
        let text = format!(
            "\nGPU benchmark, trainer only: {} ({} {}), {}\n  trainer, {}-token rows: {train:.0} tokens/s\n    {split} (medians)\n",
            o.preset,
            o.device,
            o.dtype,
            o.rl.display(),
            o.tokens,
        );
        super::reference::print_out(&text);
        return Ok(());
    }
    let reference = if o.reference { torch_reference(&o, &model) } else { Err(anyhow::anyhow!("--no-reference")) };
    let said = match &reference {
        Ok(v) => v.to_string(),
        Err(e) => format!("not measured: {e:#}"),
    };
    crate::workspace::eprintln_flush(&format!("bench gpu: PyTorch reference {said}"));
    let server = serve(&o, &model, &work)?;
    let _ = decode(&server, &name, 1, 8)?;
    let b1 = decode(&server, &name, 1, 256)?;
    crate::workspace::eprintln_flush(&format!("bench gpu: decode batch 1 {b1:.0} tokens/s"));
    let b64 = decode(&server, &name, 64, 128)?;
    crate::workspace::eprintln_flush(&format!("bench gpu: decode batch 64 {b64:.0} tokens/s"));
    drop(server);
    let kl = mismatch_kl(&o, &model, &work)?;

    let reference = match reference {
        Ok(v) => format!(
            "  PyTorch {} + transformers, same GPU ({}), bf16 autocast, sdpa: {:.0} tokens/s, peak {} GB; ours / PyTorch {:.2}x\n",
            v["torch"].as_str().unwrap_or("?"),
            v["device"].as_str().unwrap_or("?"),
            v["tokens_per_s"].as_f64().unwrap_or(0.0),
            v["peak_gpu_gb"],
            train / v["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
        ),
        Err(e) => format!("  PyTorch reference not measured: {e:#}\n"),
    };
    let text = format!(
        "\nGPU benchmark: {} ({} {}), {}\n  trainer, {}-token rows: {train:.0} tokens/s (prime-rl, Qwen3-0.6B RL at 16k on one H100: {PRIME_RL_TOKENS_PER_S:.0}; ratio {:.2}x)\n    {split} (medians)\n  decode, batch 1: {b1:.0} tokens/s; batch 64: {b64:.0} tokens/s\n  mismatch KL (trainer vs inference, on-policy): {kl:.2e} (target < 1e-3)\n",
        o.preset,
        o.device,
        o.dtype,
        o.rl.display(),
        o.tokens,
        train / PRIME_RL_TOKENS_PER_S,
    );
    super::reference::print_out(&(text + &reference));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        let rl = env!("CARGO_MANIFEST_PATH");
        ["gpu", "--rl", rl].iter().chain(list).map(|s| String::from(*s)).collect()
    }

    #[test]
    fn every_accepted_option_does_something_and_others_are_refused() {
        let o = parse(&args(&[])).unwrap();
        assert!(o.reference && !o.trainer_only && o.tokens == 16_384 && o.device == "cuda");
        let o = parse(&args(&["--no-reference", "--trainer-only", "--tokens", "1024", "--device", "cpu"])).unwrap();
        assert!(!o.reference && o.trainer_only && o.tokens == 1024 && o.device == "cpu");
        let err = parse(&args(&["--quick"])).err().unwrap().to_string();
        assert!(err.contains("unknown option --quick") && err.contains("--trainer-only"), "{err}");
        assert!(parse(&args(&["--tokens", "100"])).is_err(), "below 256 tokens");
        let missing = parse(&["gpu", "--rl", "/nonexistent/rl"].map(String::from)).err().unwrap().to_string();
        assert!(missing.contains("build-cuda"), "{missing}");
    }
}
