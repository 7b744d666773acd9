#!/usr/bin/env python3
"""PyTorch reference for `cargo xtask bench train-step`: the same Qwen3 presets (HF Qwen3ForCausalLM,
f32, CPU, 2 threads), forward + backward + AdamW on 4 samples per micro-batch (512 or 2048 tokens in
all), one JSON line per case with tokens/s. Needs torch and transformers (PyPI); not part of CI.

With the argument `qwen3-0.6b`: Qwen3-0.6B's shapes (random weights), a full step and a PEFT LoRA
step (r = 16, alpha 32, every projection) on one 512-token row of 4 samples, each with its peak
resident memory (`cargo xtask bench train-0.6b`).

With `gpu MODEL_DIR TOKENS STEPS`: the reference of `cargo xtask bench gpu` on the same GPU: the
model directory `rl model init` wrote, loaded by transformers (sdpa attention), f32 weights and
AdamW state with bf16 autocast (as `rl sft --dtype bf16`), one TOKENS-token row per step, the
median tokens/s of the steps after the first and the peak GPU memory.

Usage: python3 scripts/bench_torch_train.py [qwen3-0.6b | gpu MODEL_DIR TOKENS STEPS]
"""
import json
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

torch.set_num_threads(2)


def peak_rss_mb():
    """Peak resident set since the last reset (VmHWM), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def qwen3_0_6b():
    from peft import LoraConfig, get_peft_model
    for mode in ("full", "lora"):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                          num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                          rope_theta=1_000_000.0, tie_word_embeddings=True, attn_implementation="sdpa")
        model = Qwen3ForCausalLM(cfg).float()
        if mode == "lora":
            targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
            model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
        tokens = 512
        ids = (torch.arange(tokens) * 13 % 100 + 8).view(4, tokens // 4)

        def step():
            logits = model(input_ids=ids).logits
            logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            (-logp.mean()).backward()
            opt.step()
            opt.zero_grad()

        step()
        start = time.perf_counter()
        reps = 2
        for _ in range(reps):
            step()
        tps = tokens * reps / (time.perf_counter() - start)
        print(json.dumps({"bench": "train-0.6b", "preset": "qwen3-0.6b", "mode": mode, "tokens": tokens,
                          "tokens_per_s": round(tps, 2), "peak_rss_mb": round(peak_rss_mb()),
                          "torch": torch.__version__}), flush=True)
        del model, opt, params


def gpu(path, tokens, steps):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    ids = (torch.arange(tokens, device="cuda") * 13 % 26 + 3).view(1, tokens)
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-logp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    after = sorted(times[1:])
    print(json.dumps({"bench": "gpu", "tokens": tokens, "tokens_per_s": round(tokens / after[len(after) // 2], 1),
                      "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2), "torch": torch.__version__,
                      "device": torch.cuda.get_device_name()}), flush=True)


if sys.argv[1:2] == ["gpu"]:
    gpu(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    sys.exit(0)

if sys.argv[1:] == ["qwen3-0.6b"]:
    qwen3_0_6b()
    sys.exit(0)

PRESETS = {"tiny": (128, 4, 4, 2, 384), "small": (256, 6, 8, 4, 768)}

for name, (hidden, layers, heads, kv, inter) in PRESETS.items():
    cfg = Qwen3Config(vocab_size=128, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=32, max_position_embeddings=2048,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(cfg).float()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    for tokens in (512, 2048):
        ids = (torch.arange(tokens) * 13 % 100 + 8).view(4, tokens // 4)

        def step():
            logits = model(ids).logits
            logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            loss = -logp.mean()
            loss.backward()
            opt.step()
            opt.zero_grad()

        step()
        # The best of three timed windows, as the Rust benchmark does.
        reps = 2 if tokens > 1000 else 6
        tps = 0.0
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(reps):
                step()
            tps = max(tps, tokens * reps / (time.perf_counter() - start))
        print(json.dumps({"bench": "train-step", "preset": name, "tokens": tokens, "tokens_per_s": round(tps, 1),
                          "torch": torch.__version__}), flush=True)
