"""A tool-use environment: arithmetic questions, a `calculate` tool, and two reward functions.

rl env-server --env.id python --env.args.file python/rl-env/examples/calculator.py
"""

import ast
import operator
import random

import rl_env

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expression: str) -> str:
    """Evaluates an arithmetic expression with +, - and * on integers.

    Args:
        expression: The expression, e.g. "12 * (3 + 4)".
    """

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"unsupported expression: {expression!r}")

    return str(walk(ast.parse(expression, mode="eval")))


def load_environment(num_examples=200, seed=0, max_turns=4):
    rng = random.Random(seed)
    rows = []
    for _ in range(num_examples):
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
        rows.append(
            {
                "question": f"What is ({a} + {b}) * {c}? Use the calculator, then answer with the number only.",
                "answer": str((a + b) * c),
            }
        )

    def correct(completion, answer):
        return float(rl_env.last_reply(completion).strip() == answer)

    def used_tool(completion):
        return float(any(m.get("role") == "tool" for m in completion))

    def tool_calls(state, completion):
        return sum(len(m.get("tool_calls") or []) for m in completion)

    rubric = rl_env.Rubric([correct, used_tool], weights=[1.0, 0.2])
    rubric.add_metric(tool_calls)
    return rl_env.ToolEnv(
        dataset=rows,
        eval_fraction=0.1,
        seed=seed,
        tools=[calculate],
        max_turns=max_turns,
        system_prompt="You are a careful calculator user.",
        rubric=rubric,
        env_id="calculator",
    )
