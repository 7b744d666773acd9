"""The pipe protocol end to end: a worker process started like the env server starts it."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
SRC = os.path.join(HERE, "..", "src")


class Worker:
    def __init__(self, *args):
        env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rl_env.worker", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.ready = json.loads(self.proc.stdout.readline())
        self.next_id = 0

    def call(self, method, params):
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"id": self.next_id, "method": method, "params": params}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        assert answer["id"] == self.next_id, answer
        return answer

    def close(self):
        self.proc.stdin.close()
        code = self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


def user_file(source):
    f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    f.write(textwrap.dedent(source))
    f.close()
    return f.name


class WorkerTests(unittest.TestCase):
    def test_a_multi_turn_episode_and_its_scores(self):
        w = Worker("--file", os.path.join(EXAMPLES, "guess_number.py"), "--args", '{"num_examples": 4, "seed": 1}')
        self.addCleanup(w.close)
        self.assertEqual(w.ready["event"], "ready")
        env = w.ready["env"]
        self.assertEqual(env["id"], "guess-number")
        self.assertFalse(env["single_turn"])
        self.assertEqual([f["name"] for f in env["rubric"]], ["solved", "efficiency"])
        task = env["splits"]["train"][0]
        target = int(task["answer"])
        prompt = w.call("prompt", {"task": task})["result"]["messages"]
        messages = [*prompt, {"role": "assistant", "content": str(target - 1)}]
        r = w.call("env_response", {"task": task, "messages": messages, "state": {}, "turn": 1})["result"]
        self.assertEqual((r["done"], r["messages"][0]["content"]), (False, "Higher."))
        self.assertEqual(r["state"], {"guesses": 1}, "task fields are not sent back")
        messages += r["messages"] + [{"role": "assistant", "content": f"It is {target}"}]
        r = w.call("env_response", {"task": task, "messages": messages, "state": r["state"], "turn": 2})["result"]
        self.assertEqual(r["messages"][0]["content"], "Correct!")
        state = r["state"]
        messages += r["messages"]
        r = w.call("env_response", {"task": task, "messages": messages, "state": state, "turn": 2})["result"]
        self.assertTrue(r["done"])
        scores = w.call("score", {"task": task, "messages": messages, "state": state})["result"]["results"]
        self.assertEqual(scores, [{"value": 1.0}, {"value": 0.5}])
        named = w.call(
            "score", {"functions": ["efficiency", "nope"], "task": task, "messages": messages, "state": state}
        )
        self.assertEqual(named["result"]["results"], [{"value": 0.5}, {"error": "no reward function named 'nope'"}])
        self.assertEqual(env["prompts"]["train"][0], prompt, "prompts are formatted once, at load")

    def test_a_tool_env_that_also_replies_ends_when_its_reply_is_none(self):
        path = user_file('''
            import rl_env
            def lookup(key: str) -> str:
                """Looks a key up.

                Args:
                    key: The key.
                """
                return {"a": "42"}.get(key, "missing")
            class Quiz(rl_env.ToolEnv):
                def on_plain_reply(self, messages, state):
                    if "42" in messages[-1]["content"]:
                        return None
                    state["tries"] = state.get("tries", 0) + 1
                    return [{"role": "user", "content": "Not yet: try again."}]
            def load_environment():
                return Quiz(dataset=[{"question": "What is a?", "answer": "42"}], tools=[lookup], max_turns=6)
        ''')
        self.addCleanup(os.unlink, path)
        w = Worker("--file", path)
        self.addCleanup(w.close)
        task = w.ready["env"]["splits"]["train"][0]
        self.assertEqual([t["name"] for t in w.ready["env"]["tools"]], ["lookup"])
        messages = w.call("prompt", {"task": task})["result"]["messages"]
        call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "a"}'}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        r = w.call("env_response", {"task": task, "messages": messages, "state": {}, "turn": 1})["result"]
        self.assertEqual((r["done"], r["messages"]), (False, [{"role": "tool", "tool_call_id": "c1", "content": "42"}]))
        messages += r["messages"] + [{"role": "assistant", "content": "I do not know."}]
        r = w.call("env_response", {"task": task, "messages": messages, "state": r["state"], "turn": 2})["result"]
        self.assertEqual((r["done"], r["messages"][0]["content"]), (False, "Not yet: try again."))
        self.assertEqual(r["state"], {"tries": 1})
        messages += r["messages"] + [{"role": "assistant", "content": "It is 42."}]
        r = w.call("env_response", {"task": task, "messages": messages, "state": r["state"], "turn": 3})["result"]
        self.assertEqual((r["done"], r["messages"]), (True, []), "returning None ends the episode")

    def test_prints_go_to_stderr_and_failures_are_per_request(self):
        path = user_file("""
            import rl_env
            print("hello from load")
            def load_environment():
                def loud(completion):
                    print("scoring!")
                    return 1
                def broken(completion):
                    return "x"
                class Env(rl_env.SingleTurnEnv):
                    def format_prompt(self, row):
                        if row.get("bad"):
                            raise ValueError("cannot format")
                        return super().format_prompt(row)
                return Env(dataset=[{"question": "q"}], rubric=rl_env.Rubric([loud, broken]))
        """)
        self.addCleanup(os.unlink, path)
        w = Worker("--file", path)
        self.assertEqual(w.ready["event"], "ready")
        task = {"question": "q"}
        loud, broken = w.call("score", {"task": task, "messages": []})["result"]["results"]
        self.assertEqual(loud, {"value": 1.0})
        self.assertIn("broken returned str 'x'", broken["error"])
        err = w.call("prompt", {"task": {"question": "q", "bad": True}})["error"]
        self.assertEqual(err, {"kind": "env", "message": "prompt: ValueError: cannot format"})
        self.assertEqual(w.call("unknown", {})["error"]["kind"], "bad_request")
        self.assertEqual(w.call("ping", {})["result"], {}, "still serving")
        w.proc.stdin.close()
        self.assertEqual(w.proc.wait(timeout=10), 0)
        stderr = w.proc.stderr.read()
        self.assertIn("hello from load", stderr)
        self.assertIn("scoring!", stderr)
        w.proc.stdout.close()
        w.proc.stderr.close()

    def test_a_load_failure_is_one_error_line(self):
        path = user_file("def load_environment(size):\n    raise RuntimeError(f'no data of size {size}')\n")
        self.addCleanup(os.unlink, path)
        w = Worker("--file", path, "--args", '{"size": 3}')
        self.assertEqual(w.ready, {"event": "error", "message": "RuntimeError: no data of size 3"})
        self.assertEqual(w.close(), 1)


if __name__ == "__main__":
    unittest.main()
