#!/usr/bin/env python3
"""Checks that a LoRA adapter trained by `rl` is a PEFT adapter computing the same function.

1. `rl model init` (tiny), then `rl sft` with `[lora]` for a few steps: `<run>/adapter` holds
   adapter_config.json + adapter_model.safetensors (every projection adapted, rank 8, trained
   with adapter dropout 0.1, which PEFT reads as `lora_dropout`).
2. HF PEFT loads it (`PeftModel.from_pretrained(base, adapter)`); its log-probabilities of every
   token of a sequence equal those of `rl inference` serving the base with the adapter loaded
   through `/update_weights`, within 1e-4.
3. `rl model merge` writes a model transformers loads with the same log-probabilities, and so does
   PEFT's own `merge_and_unload()`.

Needs torch, transformers and peft (PyPI); `cargo xtask bench`'s venv has them. Usage:
    python3 scripts/check_peft.py [path/to/rl]
"""
import json
import subprocess
import sys
import tempfile
import urllib.request

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

RL = sys.argv[1] if len(sys.argv) > 1 else "target/debug/rl"
TOL = 1e-4


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def hf_logprobs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def worst(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def main():
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = f"{tmp}/tiny"
        subprocess.run([RL, "model", "init", "--out", base_dir, "--seed", "11"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([RL, "sft", "@", "configs/reverse_text/sft.toml", "--output-dir", tmp, "--model.path", base_dir,
                        "--max-steps", "8", "--batch-size", "8", "--optim.lr", "0.01", "--lora.rank", "8",
                        "--lora.alpha", "16", "--lora.dropout", "0.1", "--scheduler.warmup-steps", "1"], check=True, stdout=subprocess.DEVNULL)
        adapter = f"{tmp}/reverse-text-sft/adapter"
        print("adapter config:", json.load(open(f"{adapter}/adapter_config.json")))

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        peft_model = PeftModel.from_pretrained(base, adapter).eval()
        n = sum(p.numel() for name, p in peft_model.named_parameters() if "lora_" in name)
        print(f"PEFT loaded {n} adapter parameters")
        if peft_model.peft_config["default"].lora_dropout != 0.1:
            ok = False
            print("MISMATCH: PEFT reads lora_dropout", peft_model.peft_config["default"].lora_dropout)
        ids = [1, 40, 50, 60, 70, 2, 33, 12, 9, 14, 80, 5]
        theirs = hf_logprobs(peft_model, ids)
        plain = hf_logprobs(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), ids)
        if worst(theirs, plain) < 1e-3:
            ok = False
            print("MISMATCH: the adapter changes nothing (was it trained?)")

        server = subprocess.Popen([RL, "inference", "--model.path", base_dir, "--port", "0", "--log.level", "warn"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            url = json.loads(server.stdout.readline())["base_url"].removesuffix("/v1")
            post(url, "/update_weights", {"weight_dir": adapter})
            scored = post(url, "/v1/completions", {"prompt": ids, "max_tokens": 0, "prompt_logprobs": 0})
            ours = [scored["prompt_logprobs"][i][str(ids[i])]["logprob"] for i in range(1, len(ids))]
        finally:
            server.terminate()
            server.wait()
        diff = worst(ours, theirs)
        print(f"rl inference (base + adapter) vs PEFT: max |logprob diff| {diff:.2e} over {len(ours)} tokens")
        ok &= diff < TOL

        merged_dir = f"{tmp}/merged"
        subprocess.run([RL, "model", "merge", "--base", base_dir, "--adapter", adapter, "--out", merged_dir],
                       check=True, stdout=subprocess.DEVNULL)
        merged = hf_logprobs(AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32), ids)
        diff = worst(merged, theirs)
        print(f"rl model merge (loaded by transformers) vs PEFT: max |logprob diff| {diff:.2e}")
        ok &= diff < TOL
        unloaded = hf_logprobs(peft_model.merge_and_unload(), ids)
        diff = worst(unloaded, merged)
        print(f"PEFT merge_and_unload vs rl model merge: max |logprob diff| {diff:.2e}")
        ok &= diff < TOL
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
