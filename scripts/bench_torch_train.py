#!/usr/bin/env python3
"""PyTorch reference for `cargo xtask bench train-step`: the same Qwen3 presets (HF Qwen3ForCausalLM,
f32, CPU, 2 threads), forward + backward + AdamW on 4 samples per micro-batch (512 or 2048 tokens in
all), one JSON line per case with tokens/s. Needs torch and transformers (PyPI); not part of CI.

Usage: python3 scripts/bench_torch_train.py
"""
import json
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

torch.set_num_threads(2)
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
