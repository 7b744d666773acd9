#!/usr/bin/env python3
"""HF transformers reference for `cargo xtask bench generate`: decode tokens/s of `generate` (greedy,
KV cache) on the same Qwen3 presets (random weights, f32, CPU, 2 threads) after 64-token prompts,
at batch 1 (128 new tokens) and batch 32 (32 new tokens), and for 4 prompts of 256 tokens x 8
samples each (32 new tokens). Decode time = generate(N) - generate(1),
so the prompt's prefill is not counted (as in our benchmark). Prints one JSON line per case.

With the argument `qwen3-0.6b`: Qwen3-0.6B's shapes (random weights), 32 new tokens after 64-token
prompts at batch 1, 8 and 32 (the best of two runs): in f32, in f32 with the weights rounded to bf16 (as
a bf16 checkpoint loaded in f32), in bf16, and that checkpoint in f32 with PEFT LoRA adapters
(r=16, every projection) unmerged and merged.

Usage: python3 scripts/bench_hf_generate.py [qwen3-0.6b]
"""
import json
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

torch.set_num_threads(2)
PRESETS = {"tiny": (128, 4, 4, 2, 384), "small": (256, 6, 8, 4, 768)}


def timed(model, ids, new):
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def qwen3_0_6b():
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      rope_theta=1_000_000.0, tie_word_embeddings=True, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(cfg).float().eval()
    # f32; f32 with the weights rounded to bf16 (a checkpoint stored in bf16, computed in f32); the
    # same weights in bf16 (beside `rl`'s bf16-packed weights); then that checkpoint in f32 with
    # PEFT's LoRA r=16 on every projection (B random, not zero), unmerged and merged.
    for weights in ("f32", "ckpt-bf16", "bf16", "lora", "lora-merged"):
        if weights == "ckpt-bf16":
            model = model.to(torch.bfloat16).to(torch.float32)
        elif weights == "bf16":
            model = model.to(torch.bfloat16)
        elif weights == "lora":
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, init_lora_weights=False,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                              "down_proj"])
            model = get_peft_model(model.to(torch.float32), lora).eval()
        elif weights == "lora-merged":
            model = model.merge_and_unload().eval()
        for batch in (1, 8, 32):
            ids = torch.stack([(torch.arange(64) * 7 + b) % 100 + 8 for b in range(batch)])
            timed(model, ids, 2)
            prefill = min(timed(model, ids, 1) for _ in range(2))
            total = min(timed(model, ids, 32) for _ in range(2))
            tps = batch * 31 / max(total - prefill, 1e-9)
            print(json.dumps({"bench": "decode-0.6b", "preset": "qwen3-0.6b", "weights": weights, "batch": batch,
                              "tokens_per_s": round(tps, 2), "torch": torch.__version__}), flush=True)


if sys.argv[1:] == ["qwen3-0.6b"]:
    qwen3_0_6b()
    sys.exit(0)

for name, (hidden, layers, heads, kv, inter) in PRESETS.items():
    cfg = Qwen3Config(vocab_size=128, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=32, max_position_embeddings=2048,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(cfg).float().eval()
    for batch, new in ((1, 128), (32, 32), ("4x8", 32)):
        if batch == "4x8":
            # GRPO-shaped: 4 prompts of 256 tokens, 8 samples each (what `num_return_sequences`
            # expands the input to; greedy, so decoding is the only work timed).
            prompts = torch.stack([(torch.arange(256) * 7 + p) % 100 + 8 for p in range(4)])
            ids = prompts.repeat_interleave(8, dim=0)
        else:
            ids = torch.stack([(torch.arange(64) * 7 + b) % 100 + 8 for b in range(batch)])
        timed(model, ids, 4)
        # Minimums over five runs each: the decode time is a difference of two timings, so noise
        # in either one would swing the figure (a single noisy prefill halved or doubled it).
        prefill = min(timed(model, ids, 1) for _ in range(5))
        total = min(timed(model, ids, new) for _ in range(5))
        tps = ids.shape[0] * (new - 1) / max(total - prefill, 1e-9)
        print(json.dumps({"bench": "decode", "preset": name, "batch": batch, "tokens_per_s": round(tps, 1),
                          "torch": torch.__version__}), flush=True)
