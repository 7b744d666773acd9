#!/usr/bin/env python3
"""Checks that `rl` computes the same models as HF transformers.

1. A directory written by `rl model init` (character-level tokenizer, and BPEs trained with
   `--tokenizer-task`, every kind of `--bpe-pieces`) is a valid HF checkpoint: transformers loads it
   (Qwen3ForCausalLM + its fast tokenizer and chat template) and, against the embedded inference
   server (`rl inference`) on the same directory, apply_chat_template(...) token ids == our
   prompt_token_ids and HF log-probabilities of every prompt token == our prompt_logprobs.
2. Every model family `rl` runs (Qwen3, Qwen2/Qwen2.5 with q/k/v biases, Llama 3 with and without
   `llama3` rope scaling and attention biases), made by transformers with random weights and saved
   with `save_pretrained`: our prompt logprobs match HF's, and greedy decoding gives the same tokens.

Needs torch and transformers (PyPI); not part of `cargo xtask ci`. Usage:
    python3 scripts/check_hf_compat.py [path/to/rl]
"""
import json
import subprocess
import sys
import tempfile
import urllib.request

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

RL = sys.argv[1] if len(sys.argv) > 1 else "target/debug/rl"


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def check_init(model_dir, extra):
    """Part 1 for one `rl model init` directory."""
    ok = True
    subprocess.run([RL, "model", "init", "--out", model_dir, "--preset", "tiny", "--seed", "7", *extra], check=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    print(f"HF loaded {type(model).__name__} with {sum(p.numel() for p in model.parameters())} parameters")

    server = subprocess.Popen([RL, "inference", "--model.path", model_dir, "--port", "0", "--log.level", "warn"],
                              stdout=subprocess.PIPE, text=True)
    try:
        base = json.loads(server.stdout.readline())["base_url"].removesuffix("/v1")
        messages = [{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": "Hello, world!"},
                    {"role": "assistant", "content": "!dlrow ,olleH"}, {"role": "user", "content": "Again: abc AdaLovelace, AlanTuring <answer>OK</answer>"}]
        ours = post(base, "/v1/chat/completions",
                    {"messages": messages, "max_completion_tokens": 1, "return_token_ids": True})["prompt_token_ids"]
        theirs = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(theirs, "keys"):  # transformers >= 5 returns a BatchEncoding
            theirs = theirs["input_ids"]
        if list(theirs) != ours:
            ok = False
            print("MISMATCH: chat template / tokenizer")
            print(" ours:  ", tok.decode(ours))
            print(" theirs:", tok.decode(theirs))
        else:
            print(f"chat template + tokenizer: identical {len(ours)} prompt tokens")

        scored = post(base, "/v1/completions", {"prompt": ours, "max_tokens": 0, "prompt_logprobs": 0})
        with torch.no_grad():
            logits = model(torch.tensor([ours])).logits[0]
        logp = torch.log_softmax(logits.double(), dim=-1)
        worst = 0.0
        for i in range(1, len(ours)):
            mine = scored["prompt_logprobs"][i][str(ours[i])]["logprob"]
            worst = max(worst, abs(mine - logp[i - 1, ours[i]].item()))
        print(f"prompt logprobs vs HF: max abs difference {worst:.2e} over {len(ours) - 1} tokens")
        if worst > 1e-4:
            ok = False
            print("MISMATCH: logprobs")
    finally:
        server.terminate()
        server.wait(timeout=20)
    return ok


def main():
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in [("tiny", []), ("tiny-bpe", ["--tokenizer-task", "alphabet-sort"]),
                            ("tiny-bpe-attached", ["--tokenizer-task", "alphabet-sort", "--bpe-pieces", "attached"]),
                            ("tiny-bpe-phrases", ["--tokenizer-task", "alphabet-sort", "--bpe-pieces", "phrases",
                                                  "--vocab-size", "768"])]:
            model_dir = f"{tmp}/{name}"
            ok = check_init(model_dir, extra) and ok
        model_dir = f"{tmp}/tiny"
        ok = check_families(tmp, model_dir) and ok
    print("OK: rl model directories load in HF transformers and compute the same model" if ok else "FAILED")
    sys.exit(0 if ok else 1)


def family_models(vocab):
    """(name, transformers config) of every family, small but with non-trivial logits."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    shape = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 initializer_range=0.2, rms_norm_eps=1e-6)
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    return [
        ("qwen3", Qwen3Config(**shape, head_dim=16, tie_word_embeddings=True)),
        ("qwen2 (q/k/v biases)", Qwen2Config(**shape, tie_word_embeddings=False)),
        ("llama", LlamaConfig(**shape, tie_word_embeddings=False)),
        ("llama + llama3 rope scaling + attention biases",
         LlamaConfig(**shape, attention_bias=True, rope_parameters=llama3, tie_word_embeddings=True)),
    ]


def check_families(tmp, tokenizer_dir):
    """Random models of each family made by transformers: same logprobs and greedy tokens in rl."""
    import shutil
    ok = True
    vocab = json.load(open(f"{tokenizer_dir}/config.json"))["vocab_size"]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    # ~70 tokens: beyond the llama3 case's original context (32), so its scaled bands matter.
    text = "The quick brown fox jumps over the lazy dog; then it reverses: god yzal eht revo spmuj."
    prompt = tok(text)["input_ids"]
    for i, (name, cfg) in enumerate(family_models(vocab)):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        with torch.no_grad():  # transformers initialises biases to 0: make them count
            for n, p in model.named_parameters():
                if n.endswith(".bias"):
                    p.normal_(0.0, 0.2)
        out = f"{tmp}/family{i}"
        model.save_pretrained(out)
        for f in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(f"{tokenizer_dir}/{f}", out)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].double(), dim=-1)
            # Plain argmax decoding (generate() would stop at, or with min_new_tokens mask, its
            # end-of-sequence ids; ours runs with ignore_eos, which does neither).
            seq = list(prompt)
            for _ in range(24):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            theirs = seq[len(prompt):]
        server = subprocess.Popen([RL, "inference", "--model.path", out, "--port", "0", "--log.level", "warn"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            base = json.loads(server.stdout.readline())["base_url"].removesuffix("/v1")
            scored = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "prompt_logprobs": 0})
            worst = max(abs(scored["prompt_logprobs"][j][str(prompt[j])]["logprob"] - logp[j - 1, prompt[j]].item())
                        for j in range(1, len(prompt)))
            greedy = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0,
                                                    "ignore_eos": True, "return_token_ids": True})
            ours = greedy["choices"][0]["token_ids"]
        finally:
            server.terminate()
            server.wait(timeout=20)
        same = ours == theirs
        print(f"{name:<48} prompt logprobs max |diff| {worst:.1e} over {len(prompt) - 1} tokens; "
              f"greedy: {'identical' if same else 'DIFFERENT'} {len(ours)} tokens")
        if worst > 1e-4 or not same:
            ok = False
            print(f"MISMATCH: {name}" + ("" if same else f"\n ours:   {ours}\n theirs: {theirs}"))
    return ok


if __name__ == "__main__":
    main()
