"""Environments for the rl post-training stack, written in Python.

An environment is a dataset of tasks, how a task becomes a prompt, what the environment answers
between model turns (optionally tools), and a rubric of reward functions. The `rl env-server`
(env id `python`) hosts it: it runs the episodes against the model, builds the token-level traces
and serves the gRPC protocol, and calls into this package over a pipe (`rl_env.worker`).

    import rl_env

    def load_environment(**args):
        rows = [{"question": "2+2?", "answer": "4"}]
        def correct(completion, answer):
            return float(rl_env.last_reply(completion).strip() == answer)
        return rl_env.SingleTurnEnv(dataset=rows, system_prompt="Answer briefly.",
                                    rubric=rl_env.Rubric([correct]))
"""

from .data import DatasetError, load_dataset, load_jsonl
from .env import EnvError, Environment, EnvReply, MultiTurnEnv, SingleTurnEnv, State, ToolEnv
from .messages import Message, Messages, last_reply, parse_tag
from .models import Model
from .rubric import RewardError, Rubric
from .tools import tool_schema

__all__ = [
    "DatasetError",
    "EnvError",
    "EnvReply",
    "Environment",
    "Message",
    "Messages",
    "Model",
    "MultiTurnEnv",
    "RewardError",
    "Rubric",
    "SingleTurnEnv",
    "State",
    "ToolEnv",
    "last_reply",
    "load_dataset",
    "load_jsonl",
    "parse_tag",
    "tool_schema",
]
