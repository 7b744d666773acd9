#!/usr/bin/env python3
"""Checks that a model directory written by `rl model init` is a valid HF checkpoint.

Loads it with HF transformers (Qwen3ForCausalLM + its fast tokenizer and chat template) and
compares with the embedded inference server (`rl inference`) on the same directory:
  1. apply_chat_template(...) token ids == our server's prompt_token_ids;
  2. HF log-probabilities of every prompt token == our server's prompt_logprobs.

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


def main():
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = f"{tmp}/tiny"
        subprocess.run([RL, "model", "init", "--out", model_dir, "--preset", "tiny", "--seed", "7"], check=True)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(model_dir)
        print(f"HF loaded {type(model).__name__} with {sum(p.numel() for p in model.parameters())} parameters")

        server = subprocess.Popen([RL, "inference", "--model.path", model_dir, "--port", "0", "--log.level", "warn"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            base = json.loads(server.stdout.readline())["base_url"].removesuffix("/v1")
            messages = [{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": "Hello, world!"},
                        {"role": "assistant", "content": "!dlrow ,olleH"}, {"role": "user", "content": "Again: abc"}]
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
    print("OK: rl model directories load in HF transformers and compute the same model" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
