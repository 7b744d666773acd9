"""A multi-turn environment without tools: guess a number; the environment answers higher/lower.

rl env-server --env.id python --env.args.file python/rl-env/examples/guess_number.py
"""

import random
import re

import rl_env


class GuessNumber(rl_env.MultiTurnEnv):
    def is_completed(self, messages, state):
        return state.get("solved", False)

    async def env_response(self, messages, state):
        target = int(state["answer"])
        match = re.search(r"-?\d+", rl_env.last_reply(messages))
        if match is None:
            return [{"role": "user", "content": "Answer with a number."}]
        guess = int(match.group())
        state["guesses"] = state.get("guesses", 0) + 1
        if guess == target:
            state["solved"] = True
            return [{"role": "user", "content": "Correct!"}], state
        return [{"role": "user", "content": "Higher." if guess < target else "Lower."}], state


def load_environment(num_examples=100, high=100, seed=0, max_turns=8):
    rng = random.Random(seed)
    rows = [
        {
            "question": f"I picked a number from 1 to {high}. Guess it; answer with the number only.",
            "answer": str(rng.randint(1, high)),
        }
        for _ in range(num_examples)
    ]

    def solved(state):
        return float(state.get("solved", False))

    def efficiency(state):
        return 1.0 / state["guesses"] if state.get("solved") else 0.0

    return GuessNumber(
        dataset=rows,
        eval_fraction=0.1,
        max_turns=max_turns,
        env_id="guess-number",
        rubric=rl_env.Rubric([solved, efficiency], weights=[1.0, 0.5]),
    )
