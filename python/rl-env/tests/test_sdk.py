"""Unit tests of the SDK: datasets, tool schemas, rubrics (bad returns, exceptions, timeouts), prompts."""

import asyncio
import json
import math
import os
import tempfile
import unittest

import rl_env
from rl_env.runner import wanted_kwargs


def run(coro):
    return asyncio.run(coro)


class DatasetTests(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_jsonl_rows_and_blank_lines(self):
        path = self.write('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": "2"}\n')
        self.assertEqual([r["answer"] for r in rl_env.load_jsonl(path)], ["1", "2"])

    def test_bad_json_names_file_and_line(self):
        path = self.write('{"question": "a"}\n{"question": \n')
        with self.assertRaisesRegex(rl_env.DatasetError, rf"{path}:2: not valid JSON"):
            rl_env.load_jsonl(path)

    def test_a_row_that_is_not_an_object(self):
        path = self.write("[1, 2]\n")
        with self.assertRaisesRegex(rl_env.DatasetError, r":1: expected a JSON object, got list"):
            rl_env.load_jsonl(path)

    def test_a_row_missing_its_question_is_named(self):
        with self.assertRaisesRegex(rl_env.DatasetError, r"train row 1: has no 'question' field"):
            rl_env.SingleTurnEnv(dataset=[{"question": "q"}, {"prompt_text": "x"}])

    def test_eval_fraction_splits_deterministically(self):
        rows = [{"question": str(i)} for i in range(20)]
        a = rl_env.SingleTurnEnv(dataset=rows, eval_fraction=0.25, seed=3)
        b = rl_env.SingleTurnEnv(dataset=rows, eval_fraction=0.25, seed=3)
        self.assertEqual(len(a.splits["test"]), 5)
        self.assertEqual(len(a.splits["train"]), 15)
        self.assertEqual(a.splits, b.splits)

    def test_unknown_file_format(self):
        with self.assertRaisesRegex(rl_env.DatasetError, "unknown dataset format"):
            rl_env.load_dataset("data.csv")


class PromptTests(unittest.TestCase):
    def test_system_few_shot_and_question(self):
        shots = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
        env = rl_env.SingleTurnEnv(dataset=[{"q": "2+2"}], question_key="q", system_prompt="Add.", few_shot=shots)
        self.assertEqual(
            env.format_prompt(env.splits["train"][0]),
            [{"role": "system", "content": "Add."}, *shots, {"role": "user", "content": "2+2"}],
        )

    def test_a_prompt_field_is_used_as_is(self):
        prompt = [{"role": "user", "content": "hi"}]
        env = rl_env.SingleTurnEnv(dataset=[{"prompt": prompt}], system_prompt="ignored")
        self.assertEqual(env.format_prompt(env.splits["train"][0]), prompt)

    def test_single_turn_is_detected(self):
        self.assertTrue(rl_env.SingleTurnEnv(dataset=[{"question": "q"}]).single_turn())
        self.assertFalse(rl_env.ToolEnv(dataset=[{"question": "q"}], tools=[]).single_turn())


class ToolSchemaTests(unittest.TestCase):
    def test_types_required_and_docstring(self):
        def search(query: str, limit: int = 5, exact: bool = False) -> str:
            """Searches the index.

            Args:
                query: What to look for.
                limit: Most results.
            """
            return ""

        schema = rl_env.tool_schema(search)
        self.assertEqual(schema["name"], "search")
        self.assertEqual(schema["description"], "Searches the index.")
        props = schema["parameters"]["properties"]
        self.assertEqual(props["query"], {"type": "string", "description": "What to look for."})
        self.assertEqual(props["limit"], {"type": "integer", "description": "Most results."})
        self.assertEqual(props["exact"], {"type": "boolean"})
        self.assertEqual(schema["parameters"]["required"], ["query"])


class RubricTests(unittest.TestCase):
    def score(self, func, **kwargs):
        rubric = rl_env.Rubric([func], timeout_s=0.5)
        return run(rubric.score(func.__name__, kwargs))

    def test_only_the_named_arguments_are_passed(self):
        def f(completion, answer):
            return 1.0

        self.assertEqual(wanted_kwargs(f, {"completion": 1, "answer": 2, "state": 3}), {"completion": 1, "answer": 2})
        self.assertEqual(wanted_kwargs(lambda **kw: 0, {"a": 1}), {"a": 1})

    def test_bool_and_async(self):
        def exact(answer):
            return answer == "4"

        async def later(answer):
            await asyncio.sleep(0)
            return 0.5

        self.assertEqual(self.score(exact, answer="4"), 1.0)
        self.assertEqual(self.score(later, answer="4"), 0.5)

    def test_bad_returns_raise_reward_errors(self):
        def nan():
            return math.nan

        def text():
            return "high"

        def boom():
            raise KeyError("answer")

        with self.assertRaisesRegex(rl_env.RewardError, "nan returned a non-finite value"):
            self.score(nan)
        with self.assertRaisesRegex(rl_env.RewardError, "text returned str 'high', expected a number"):
            self.score(text)
        with self.assertRaisesRegex(rl_env.RewardError, "boom raised KeyError"):
            self.score(boom)

    def test_slow_functions_time_out(self):
        async def slow():
            await asyncio.sleep(10)

        def slow_sync():
            import time

            time.sleep(2)
            return 1.0

        with self.assertRaisesRegex(rl_env.RewardError, "slow did not return within 0.5 s"):
            self.score(slow)
        with self.assertRaisesRegex(rl_env.RewardError, "slow_sync did not return within 0.5 s"):
            self.score(slow_sync)

    def test_per_turn_functions_return_a_score_per_turn(self):
        def turns(completion):
            return [1.0, True, 0]

        async def later_turns():
            return (0.5, 0.25)

        def not_a_list():
            return 1.0

        def a_bad_turn():
            return [1.0, "x"]

        rubric = rl_env.Rubric()
        rubric.add_reward_func(turns, per_turn=True).add_reward_func(later_turns, 2.0, per_turn=True)
        rubric.add_reward_func(not_a_list, per_turn=True).add_reward_func(a_bad_turn, per_turn=True)
        self.assertEqual(rubric.describe()[0], {"name": "turns", "weight": 1.0, "per_turn": True})
        results = run(rubric.score_all(["turns", "later_turns", "not_a_list", "a_bad_turn"], {"completion": []}))
        self.assertEqual(results[:2], [([1.0, 1.0, 0.0], None), ([0.5, 0.25], None)])
        self.assertRegex(results[2][1], "not_a_list returned float 1.0, expected a list of numbers")
        self.assertRegex(results[3][1], "a_bad_turn turn 1 returned str 'x', expected a number")
        plain = rl_env.Rubric([turns])
        self.assertEqual(plain.describe(), [{"name": "turns", "weight": 1.0}], "per_turn only when asked")

    def test_duplicate_names_and_bad_weights(self):
        def f():
            return 0

        with self.assertRaisesRegex(ValueError, "two reward functions are named 'f'"):
            rl_env.Rubric([f, f])
        with self.assertRaisesRegex(ValueError, "2 weights"):
            rl_env.Rubric([f], weights=[1, 2])


class ToolEnvTests(unittest.TestCase):
    def env(self, **kwargs):
        def add(a: int, b: int) -> int:
            """Adds two integers."""
            return a + b

        async def hang() -> str:
            """Never returns."""
            await asyncio.sleep(60)

        return rl_env.ToolEnv(dataset=[{"question": "q"}], tools=[add, hang], tool_timeout_s=0.3, **kwargs)

    def call(self, name, arguments):
        return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}

    def test_results_and_errors_go_back_to_the_model(self):
        env = self.env()
        messages = [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    self.call("add", '{"a": 2, "b": 3}'),
                    self.call("nope", "{}"),
                    self.call("add", "{bad"),
                    self.call("add", '{"a": 1}'),
                ],
            }
        ]
        replies = run(env.env_response(messages, {}))
        self.assertEqual([r["content"] for r in replies[:1]], ["5"])
        self.assertIn("unknown tool 'nope'", replies[1]["content"])
        self.assertIn("bad arguments for add", replies[2]["content"])
        self.assertIn("TypeError", replies[3]["content"])
        self.assertTrue(all(r["role"] == "tool" and r["tool_call_id"] == "c1" for r in replies))

    def test_a_hanging_tool_is_an_env_error(self):
        env = self.env()
        messages = [{"role": "assistant", "content": "", "tool_calls": [self.call("hang", "{}")]}]
        with self.assertRaisesRegex(rl_env.EnvError, "tool hang did not return within 0.3 s"):
            run(env.env_response(messages, {}))

    def test_completed_when_the_model_calls_nothing(self):
        env = self.env()
        self.assertTrue(env.is_completed([{"role": "assistant", "content": "done"}], {}))
        self.assertFalse(
            env.is_completed([{"role": "assistant", "content": "", "tool_calls": [self.call("add", "{}")]}], {})
        )

    def test_a_plain_reply_ends_the_episode_unless_the_env_answers_it(self):
        class Retry(rl_env.ToolEnv):
            async def on_plain_reply(self, messages, state):
                return [{"role": "user", "content": "again"}]

        plain = [{"role": "assistant", "content": "done"}]
        retry = Retry(dataset=[{"question": "q"}], tools=[])
        self.assertFalse(retry.is_completed(plain, {}), "the env answers plain replies")
        self.assertEqual(run(retry.env_response(plain, {})), [{"role": "user", "content": "again"}])
        self.assertIsNone(run(self.env().env_response(plain, {})), "the default ends the episode")

    def test_described_tools(self):
        described = json.loads(json.dumps(self.env().describe()))
        self.assertEqual([t["name"] for t in described["tools"]], ["add", "hang"])
        self.assertFalse(described["single_turn"])


class ModelTests(unittest.TestCase):
    def test_an_unreachable_judge_is_named(self):
        import socket

        from rl_env import Model

        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        judge = Model(f"http://127.0.0.1:{port}/v1", "judge-model", timeout_s=5)
        with self.assertRaises(RuntimeError) as caught:
            asyncio.run(judge.chat([{"role": "user", "content": "hi"}]))
        message = str(caught.exception)
        self.assertIn(f"127.0.0.1:{port}", message)
        self.assertIn("judge-model", message)
        self.assertIn("unreachable", message)


if __name__ == "__main__":
    unittest.main()
