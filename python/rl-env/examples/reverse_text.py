"""reverse-text in Python: reverse a text character by character inside <reversed_text> tags.

The same task and rewards as the built-in Rust `reverse-text` (difflib ratio of the tagged answer to
the reversed text, and an optional format penalty that ramps with the training step), so the two
score identical replies identically.

    rl env-server --env.id python --env.args.file python/rl-env/examples/reverse_text.py
"""

import difflib
import random

import rl_env

SYSTEM_PROMPT = "Reverse the text character-by-character. Put your answer in <reversed_text> tags."

WORDS = (
    "the cat sat on a mat blue sky sun moon star tree leaf river stone bird fish rain snow wind fire gold "
    "red green old new big small fast slow dog ran home road hill sea ship map key door book pen cup tea"
).split()


def texts(rng, n, min_len, max_len):
    out = []
    for _ in range(n):
        target = rng.randint(min_len, max_len)
        text = ""
        while len(text) < target:
            text = (text + " " + rng.choice(WORDS)).strip()
        out.append(text[:target].strip() or text)
    return out


def outside_tags(reply):
    start, end = reply.find("<reversed_text>"), reply.find("</reversed_text>")
    if start >= 0 and end >= start:
        return (reply[:start] + reply[end + len("</reversed_text>") :]).strip()
    return reply.strip()


def load_environment(
    num_examples=1000, test_examples=100, min_len=5, max_len=20, seed=0, format_penalty=0.0, penalty_warmup_steps=0
):
    rng = random.Random(seed)

    def rows(n):
        return [{"question": t, "answer": t[::-1]} for t in texts(rng, n, min_len, max_len)]

    def lcs(completion, answer):
        parsed = rl_env.parse_tag(rl_env.last_reply(completion), "reversed_text")
        return 0.0 if parsed is None else difflib.SequenceMatcher(None, parsed, answer).ratio()

    def scale(training_context):
        step = (training_context or {}).get("step", 0)
        if penalty_warmup_steps == 0:
            return format_penalty
        return format_penalty * min(step / penalty_warmup_steps, 1.0)

    def format_penalty_fn(completion, training_context):
        return -scale(training_context) if outside_tags(rl_env.last_reply(completion)) else 0.0

    def format_penalty_scale(training_context):
        return scale(training_context)

    format_penalty_fn.__name__ = "format_penalty"
    rubric = rl_env.Rubric([lcs])
    if format_penalty > 0:
        rubric.add_reward_func(format_penalty_fn, 1.0)
        rubric.add_metric(format_penalty_scale)
    return rl_env.SingleTurnEnv(
        dataset=rows(num_examples),
        eval_dataset=rows(test_examples),
        system_prompt=SYSTEM_PROMPT,
        rubric=rubric,
        env_id="reverse-text-py",
    )
