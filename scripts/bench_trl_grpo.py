#!/usr/bin/env python3
"""TRL reference for `cargo xtask bench rl-step`: GRPO steps of TRL's GRPOTrainer on the fixed
workload our benchmark runs through `rl rl` — the tiny model written by `rl model init` (same
weights, tokenizer and chat template), 8 reverse-text prompts x 8 samples per step, up to 32
completion tokens at temperature 1, reward = difflib ratio of the tagged answer against the
reversed text (0 without tags, as rl-envs scores it), beta = 0,
on-policy (one optimizer step per generation), AdamW at lr 3e-4, CPU f32, 2 threads.
Prints one JSON line: mean seconds per step (steps after the first two), peak RSS, mean prompt
tokens. Needs torch, transformers, trl (PyPI); not part of CI.

Usage: python3 scripts/bench_trl_grpo.py MODEL_DIR [STEPS]
"""
import difflib
import json
import random
import re
import resource
import sys
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

torch.set_num_threads(2)
MODEL = sys.argv[1]
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 8
SYSTEM = "Reverse the text character-by-character. Put your answer in <reversed_text> tags."
WORDS = "the cat sat on a mat and ran far from its home to see old red sun over blue hill".split()


def text(rng):
    out = ""
    while len(out) < 12:
        out += rng.choice(WORDS) + " "
    return out[: rng.randint(4, 12)].strip() or "abc"


rng = random.Random(0)
rows = []
for _ in range(8 * (STEPS + 1)):
    t = text(rng)
    rows.append({"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}], "answer": t[::-1]})


def reward(completions, answer, **_):
    out = []
    for c, a in zip(completions, answer):
        body = c[0]["content"] if isinstance(c, list) else c
        # As rl-envs' reverse-text: the first complete tag pair, stripped; 0 without one.
        m = re.search(r"<reversed_text>(.*?)</reversed_text>", body, re.S)
        out.append(difflib.SequenceMatcher(None, m.group(1).strip(), a).ratio() if m else 0.0)
    return out


class Timer(TrainerCallback):
    def __init__(self):
        self.marks = []

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.append(time.perf_counter())


tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)


def n_tokens(messages):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)  # transformers >= 5 returns a BatchEncoding


prompt_tokens = [n_tokens(r["prompt"]) for r in rows[:8]]
args = GRPOConfig(
    output_dir="/tmp/trl-bench",
    per_device_train_batch_size=64,
    num_generations=8,
    max_completion_length=32,
    temperature=1.0,
    beta=0.0,
    learning_rate=3e-4,
    num_iterations=1,
    max_steps=STEPS,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    bf16=False,
    seed=0,
    dataloader_num_workers=0,
)
timer = Timer()
trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows),
                      processing_class=tok, callbacks=[timer])
start = time.perf_counter()
trainer.train()
marks = [start] + timer.marks
steps = [b - a for a, b in zip(marks, marks[1:])][2:]
print(json.dumps({
    "bench": "rl-step",
    "impl": "trl",
    "seconds_per_step": sum(steps) / len(steps),
    "steps_timed": len(steps),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens),
    "trl": __import__("trl").__version__,
    "torch": torch.__version__,
}), flush=True)
