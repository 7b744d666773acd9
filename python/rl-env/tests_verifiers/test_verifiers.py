"""verifiers v1 environments against this stack, tested with the real packages from PyPI.

Run by `cargo xtask ci` (step `verifiers`) in a venv holding verifiers, with `RL_BIN` naming the
`rl` binary. An `rl inference` server with a tiny random model serves every test; the tasksets
are the small ones in `tasksets/` (an installable distribution, `rlt-tasksets`), written for
these tests.
"""

import asyncio
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import typing
import unittest
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
RL = os.environ.get("RL_BIN", str(ROOT / "target/debug/rl"))

# The tasksets are installed into the test venv (`pip install -e tasksets`) as a user installs
# theirs: every process finds them by import name, nothing points at this directory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import verifiers.v1 as vf  # noqa: E402
from renderers import create_renderer  # noqa: E402
from renderers.base import load_tokenizer  # noqa: E402
from renderers.client import generate  # noqa: E402

from rl_env import verifiers_host  # noqa: E402

WORK = None
MODEL = None
SERVER = None
BASE_URL = None


def setUpModule():
    global WORK, MODEL, SERVER, BASE_URL
    WORK = pathlib.Path(tempfile.mkdtemp(prefix="rl-verifiers-"))
    MODEL = WORK / "tiny"
    subprocess.run([RL, "model", "init", "--out", str(MODEL), "--preset", "tiny"], check=True, capture_output=True)
    SERVER = subprocess.Popen(
        [RL, "inference", "--model.path", str(MODEL), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = json.loads(SERVER.stdout.readline())
    BASE_URL = line["base_url"]


def tearDownModule():
    SERVER.terminate()
    SERVER.wait(timeout=30)
    shutil.rmtree(WORK, ignore_errors=True)


def post(path, body):
    request = urllib.request.Request(
        BASE_URL.removesuffix("/v1") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def engine_logprobs(tokens, prompt_len):
    """The engine's own log-probabilities of `tokens[prompt_len:]` (prompt_logprobs: unscaled, so at
    temperature 1 only, as vLLM's)."""
    out = post("/v1/completions", {"prompt": tokens, "max_tokens": 1, "prompt_logprobs": 0})
    rows = out["prompt_logprobs"]
    return [rows[i][str(tokens[i])]["logprob"] for i in range(prompt_len, len(tokens))]


def env_config(taskset, harness="null", taskset_args=None, **agent):
    return {
        "taskset": {"id": taskset, **(taskset_args or {})},
        "agent": {"harness": {"id": harness}, "runtime": {"type": "subprocess"}, **agent},
    }


def actor(temperature=1.0, max_tokens=8, base_url=None):
    return {
        "base_url": base_url or BASE_URL,
        "model": MODEL.name,
        "timeout_s": 60,
        "sampling": {"temperature": temperature, "max_tokens": max_tokens},
    }


def run_episodes(env_dict, count, act=None, renderer=None, split_select=None):
    """`count` episodes through the host's own path (env.run_slot); (vf episodes, wire traces)."""
    config = {"env": env_dict, "splits": {"train": split_select or {}}, "tokenizer": str(MODEL), "renderer": renderer}
    env, _, splits = verifiers_host.load(config)
    host = verifiers_host.VerifiersHost(env, splits, config, out=None)

    async def go():
        async with env.serving():
            episodes = []
            for i in range(count):
                (slot,) = env.slots(splits["train"][i])
                episodes.append(await env.run_slot(slot, host.context(act or actor())))
            return episodes

    episodes = asyncio.run(go())
    return episodes, [verifiers_host.episode_json(e) for e in episodes]


class GenerateContract(unittest.TestCase):
    """`renderers` (verifiers' train client) calls `/inference/v1/generate` as it calls vLLM."""

    def test_renderer_generate_against_the_engine(self):
        renderer = create_renderer(load_tokenizer(str(MODEL)), None)
        messages = [{"role": "user", "content": "Reverse: abc"}]
        rendered = renderer.render(messages, add_generation_prompt=True)
        ours = post("/tokenize", {"messages": messages})["tokens"]
        self.assertEqual(rendered.token_ids, ours, "the renderer and the server render the same prompt")
        from openai import AsyncOpenAI

        async def call():
            client = AsyncOpenAI(base_url=BASE_URL, api_key="none")
            try:
                return await generate(
                    client=client,
                    renderer=renderer,
                    messages=messages,
                    model=MODEL.name,
                    sampling_params={"temperature": 1.0, "max_tokens": 12, "seed": 3},
                )
            finally:
                await client.close()

        result = asyncio.run(call())
        self.assertEqual(result["prompt_ids"], ours)
        self.assertEqual(len(result["completion_logprobs"]), len(result["completion_ids"]))
        self.assertIn(result["finish_reason"], ("stop", "length"))
        want = engine_logprobs(ours + result["completion_ids"], len(ours))
        for got, ref in zip(result["completion_logprobs"], want):
            self.assertAlmostEqual(got, ref, delta=1e-4)
        stops = renderer.get_stop_token_ids()
        if result["finish_reason"] == "stop":
            self.assertIn(result["completion_ids"][-1], stops)


class HostTraces(unittest.TestCase):
    """What the host hands the server: the engine's tokens and logprobs, verifiers' own rewards."""

    def check_tokens(self, episodes, traces, temperature):
        for episode, wire in zip(episodes, traces):
            for vf_trace, trace in zip([t for t in episode.traces if t.agent.trainable], wire):
                self.assertEqual(trace["errors"], [], trace["errors"])
                self.assertEqual(trace["sampling_temperature"], temperature)
                nodes = trace["nodes"]
                self.assertEqual(len(nodes), len(vf_trace.nodes))
                for branch in vf_trace.branches:
                    tokens = branch.token_ids
                    mask = branch.sampled_mask
                    first = mask.index(True)
                    want = engine_logprobs(tokens, first)
                    # `Branch.logprobs` is spread over every token (0.0 off the sampled ones).
                    got = [lp for lp, m in zip(branch.logprobs[first:], mask[first:]) if m]
                    sampled = [w for w, m in zip(want, mask[first:]) if m]
                    self.assertEqual(len(got), len(sampled))
                    for a, b in zip(got, sampled):
                        self.assertAlmostEqual(a, b, delta=1e-4)
                # The wire nodes are verifiers' nodes, token for token.
                for node, vf_node in zip(nodes, vf_trace.nodes):
                    self.assertEqual(node["token_ids"], list(vf_node.token_ids))
                    self.assertEqual(node["mask"], list(vf_node.mask))
                    self.assertEqual(node["parent"], -1 if vf_node.parent is None else vf_node.parent)

    def test_single_turn_tokens_are_the_engines_and_rewards_are_task_score(self):
        # At T = 1: the engine's prompt_logprobs (unscaled, as vLLM's) are the sampling logprobs.
        episodes, traces = run_episodes(env_config("rlt_reverse", max_turns=1), 3, actor(temperature=1.0))
        self.check_tokens(episodes, traces, 1.0)
        for episode, (trace,) in zip(episodes, traces):
            vf_trace = episode.traces[0]
            # Scored again by verifiers' own Task.score on the same completion: the same rewards.
            task = vf.task_type("rlt_reverse")(episode.task.data)
            rescored = vf_trace.model_copy(deep=True)
            rescored.rewards.clear()
            asyncio.run(task.score(rescored))
            want = {k: {"score": r.score, "weight": r.weight} for k, r in rescored.rewards.items()}
            self.assertEqual(trace["rewards"], want)
            self.assertAlmostEqual(trace["reward"], sum(r["score"] * r["weight"] for r in want.values()))
            self.assertIn("reply_chars", trace["metrics"])

    def test_the_trace_records_the_temperature_the_engine_used(self):
        _, traces = run_episodes(env_config("rlt_reverse", max_turns=1), 1, actor(temperature=0.6))
        (trace,) = traces[0]
        self.assertEqual((trace["errors"], trace["sampling_temperature"]), ([], 0.6))

    def test_multi_turn_user_sim_keeps_the_assistant_trace(self):
        env = {
            "id": "user-sim",
            "taskset": {"id": "rlt_reverse"},
            "assistant": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
            "user": {"runtime": {"type": "subprocess"}, "max_turns": 2},
        }
        episodes, traces = run_episodes(env, 1)
        self.assertEqual(len(episodes[0].traces), 2, "the assistant's and the user's")
        (trace,) = traces[0]
        self.assertEqual(trace["member_id"], "", "one trainable seat: its traces are attempts, not members")
        self.assertGreaterEqual(trace["num_turns"], 2)
        self.check_tokens(episodes, traces, 1.0)

    def test_best_of_n_attempts_are_each_a_trace(self):
        env = {"id": "best-of-n", "n": 3, **env_config("rlt_reverse", max_turns=1)}
        episodes, traces = run_episodes(env, 2)
        self.assertEqual([len(t) for t in traces], [3, 3])
        self.check_tokens(episodes, traces, 1.0)
        for episode_traces in traces:
            self.assertEqual({t["member_id"] for t in episode_traces}, {""})
            top = max(t["reward"] for t in episode_traces)
            # verifiers' finalize() compares the siblings: its metrics come with each trace.
            self.assertEqual(
                [t["metrics"]["best"] for t in episode_traces], [float(t["reward"] == top) for t in episode_traces]
            )
            self.assertEqual({t["metrics"]["pass_at_n"] for t in episode_traces}, {float(top >= 1.0)})


class ScriptedEngine:
    """A stand-in for the engine that plays a tool-using policy (the tiny random model never calls
    tools): it answers `/inference/v1/generate` in vLLM's shape with the tokens of a tool call on
    the first turn and of the looked-up code once the tool's result is in the prompt."""

    def __init__(self):
        import http.server
        import threading

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(MODEL))
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = tok.decode(body["token_ids"])
                result = re.search(r"<tool_response>\s*(\S+)", prompt)
                if result:
                    text = result.group(1)
                else:
                    word = re.search(r"code of '(\w+)'", prompt).group(1)
                    text = f'<tool_call>\n{{"name": "lookup", "arguments": {{"word": "{word}"}}}}\n</tool_call>'
                ids = [*tok.encode(text, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
                engine.requests.append(body)
                reply = {
                    "request_id": "scripted",
                    "prompt_token_ids": body["token_ids"],
                    "choices": [
                        {
                            "index": 0,
                            "token_ids": ids,
                            "finish_reason": "stop",
                            "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": -0.5} for i in ids]},
                        }
                    ],
                }
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.send_response(404)
                self.end_headers()

        self.tokenizer = tok
        self.requests = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()


class ToolCalls(unittest.TestCase):
    """A tool call, its result and the answer become trace nodes with roles, calls and call ids."""

    def test_a_tool_round_trip_is_converted_whole(self):
        # verifiers' two tool scopes: a server per rollout, and one the taskset shares; the renderer
        # given, or chosen by the host from the model's template.
        for shared, renderer in ((False, None), (True, {"name": "default", "tool_parser": "qwen3"})):
            with self.subTest(shared_tools=shared, renderer=renderer):
                self.round_trip({"shared_tools": shared}, renderer)

    def test_the_host_picks_the_tool_parser_of_the_models_template(self):
        # The test model is a local checkpoint renderers has no entry for; its Qwen-style template
        # renders Hermes `<tool_call>` blocks.
        self.assertEqual(verifiers_host.default_renderer(str(MODEL)), {"name": "default", "tool_parser": "qwen3"})
        self.assertIsNone(verifiers_host.default_renderer("Qwen/Qwen3-0.6B"), "a model renderers knows keeps its own")
        snapshot = "/home/u/.cache/huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots/c0ffee"
        self.assertEqual(verifiers_host.renderer_model_name(snapshot), "Qwen/Qwen3-0.6B")
        self.assertEqual(verifiers_host.renderer_model_name(str(MODEL)), str(MODEL))

    def round_trip(self, taskset_args, renderer):
        engine = ScriptedEngine()
        try:
            env = env_config("rlt_lookup", taskset_args=taskset_args, max_turns=3)
            _, traces = run_episodes(env, 1, actor(base_url=engine.base_url), renderer=renderer)
        finally:
            engine.close()
        (trace,) = traces[0]
        self.assertEqual(trace["errors"], [], trace["errors"])
        self.assertEqual([t["name"] for t in trace["tools"]], ["lookup"])
        first_prompt = engine.tokenizer.decode(engine.requests[0]["token_ids"])
        self.assertIn('"name": "lookup"', first_prompt, "the tool schema is rendered into the prompt")
        roles = [(n["role"], n["sampled"]) for n in trace["nodes"]]
        self.assertEqual(roles.count(("assistant", True)), 2, roles)
        self.assertIn(("tool", False), roles)
        call_node = next(n for n in trace["nodes"] if n.get("tool_calls") and n["sampled"])
        (call,) = call_node["tool_calls"]
        self.assertEqual((call["name"], call_node["finish_reason"]), ("lookup", "tool_calls"))
        tool_node = next(n for n in trace["nodes"] if n["role"] == "tool")
        self.assertEqual(tool_node["tool_call_id"], call["id"])
        self.assertEqual(trace["rewards"]["answered"]["score"], 1.0, trace["rewards"])
        self.assertEqual(trace["rewards"]["used_tool"]["score"], 1.0)
        self.assertEqual(trace["num_turns"], 2)
        # The template re-renders the first reply with one more token than was sampled (the newline
        # after `<|im_end|>`), so the second turn forks a branch, as verifiers records it; each
        # sampled node carries the scripted tokens' logprobs.
        sampled = [n for n in trace["nodes"] if n["sampled"]]
        for n in sampled:
            self.assertEqual(len(n["logprobs"]), sum(n["mask"]))
            self.assertTrue(all(lp == -0.5 for lp in n["logprobs"]))
        self.assertEqual(len(engine.requests), 2)


class Splits(unittest.TestCase):
    """Which tasks each split holds: verifiers' selections, and an infinite taskset's first tasks."""

    def test_an_infinite_taskset_takes_its_first_tasks_unless_a_selection_bounds_it(self):
        env = env_config("rlt_endless", max_turns=1)
        config = {"env": env, "splits": {"train": {}, "test": {"skip": 2, "limit": 3}}, "infinite_tasks": 5}
        _, _, splits = verifiers_host.load(config)
        prompts = {name: [t.data.prompt for t in tasks] for name, tasks in splits.items()}
        self.assertEqual(len(prompts["train"]), 5)
        self.assertEqual(prompts["test"], prompts["train"][2:5], "the taskset's own order")
        with self.assertRaisesRegex(ValueError, "split 'train': the taskset is infinite"):
            verifiers_host.load({"env": env, "splits": {"train": {"skip": 2}}})

    def test_an_infinite_taskset_trains_through_the_env_server(self):
        # The env args' `infinite_tasks`, through `rl env-server`'s own start: a split of that size.
        config = WORK / "endless.toml"
        config.write_text(
            '[env]\nid = "verifiers"\n[env.args]\n'
            f"python = {json.dumps(sys.executable)}\ntokenizer = {json.dumps(str(MODEL))}\ninfinite_tasks = 7\n"
            'env = { taskset = { id = "rlt_endless" }, agent = { harness = { id = "null" }, '
            'runtime = { type = "subprocess" } } }\n'
        )
        server = subprocess.Popen(
            [RL, "env-server", "@", str(config), "--serve.port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = server.stdout.readline()
            self.assertTrue(line, server.stderr.read() if server.poll() is not None else "no listening line")
        finally:
            server.terminate()
            _, err = server.communicate(timeout=30)
        self.assertIn("its first 7 tasks", err)


class Failures(unittest.TestCase):
    """A broken environment is a clear error naming the cause, never a silent zero."""

    def test_a_raising_reward_is_an_env_error_on_the_trace(self):
        _, traces = run_episodes(env_config("rlt_broken", max_turns=1), 1)
        (trace,) = traces[0]
        kinds = [e["kind"] for e in trace["errors"]]
        self.assertEqual(kinds, ["env"], trace["errors"])
        self.assertIn("the scorer broke", trace["errors"][0]["message"])
        self.assertEqual(trace["rewards"], {})

    def test_an_unreachable_endpoint_is_a_retryable_infrastructure_error(self):
        _, traces = run_episodes(env_config("rlt_reverse", max_turns=1), 1, actor(base_url="http://127.0.0.1:9/v1"))
        (trace,) = traces[0]
        self.assertTrue(trace["errors"], trace)
        self.assertEqual(trace["errors"][0]["kind"], "infrastructure", trace["errors"])

    def test_a_missing_taskset_stops_the_env_server_naming_it(self):
        config = WORK / "env.toml"
        config.write_text(
            '[env]\nid = "verifiers"\n[env.args]\n'
            f"python = {json.dumps(sys.executable)}\ntokenizer = {json.dumps(str(MODEL))}\n"
            'env = { taskset = { id = "no_such_taskset_anywhere" } }\n'
        )
        out = subprocess.run([RL, "env-server", "@", str(config)], capture_output=True, text=True, timeout=300)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("no_such_taskset_anywhere", out.stderr)
        self.assertIn("not found", out.stderr)


class StructuredJudge(unittest.TestCase):
    """A verifiers `Judge` with a pydantic `schema` (structured outputs through the OpenAI SDK's
    `beta.chat.completions.parse`, as verifiers' rubric judge grades) served by `rl inference`."""

    def test_a_schema_judge_gets_a_parsed_verdict(self):
        from typing import Literal

        from pydantic import BaseModel, Field

        class Verdict(BaseModel):
            verdict: Literal["correct", "wrong"]
            confidence: int = Field(ge=0, le=9)

        class VerdictJudge(vf.Judge[Verdict]):
            prompt = "Question: {question}\nResponse: {response}\nIs the response correct?"
            schema = Verdict

        # The tiny random model would spend its tokens on JSON's optional whitespace; a real judge
        # writes compact JSON.
        spaces = post("/tokenize", {"prompt": " \n\t"})["tokens"]
        config = vf.JudgeConfig(
            base_url=BASE_URL,
            api_key_var="RL_TEST_NO_KEY",
            model=MODEL.name,
            sampling={"temperature": 1.0, "max_tokens": 120, "logit_bias": {str(t): -100 for t in spaces}},
        )
        for _ in range(3):
            result = asyncio.run(VerdictJudge(config).evaluate(question="2 + 2?", response="4"))
            self.assertIsInstance(result.parsed, Verdict, result.text)
            self.assertEqual(Verdict.model_validate_json(result.text), result.parsed)


class CompletionsScoring(unittest.TestCase):
    """The OpenAI SDK's legacy completions with `echo` and `logprobs`, as lm-evaluation-harness's
    `local-completions` model scores a continuation (`token_logprobs[ctxlen:-1]`)."""

    def test_echoed_logprobs_score_a_continuation(self):
        from openai import OpenAI

        client = OpenAI(base_url=BASE_URL, api_key="unused")
        context = post("/tokenize", {"prompt": "abc"})["tokens"]
        continuation = post("/tokenize", {"prompt": " def"})["tokens"]
        out = client.completions.create(
            model=MODEL.name, prompt=[context + continuation], echo=True, logprobs=1, max_tokens=1, temperature=0
        )
        (choice,) = out.choices
        self.assertTrue(choice.text.startswith("abc def"), choice.text)
        lps = choice.logprobs
        self.assertEqual(len(lps.token_logprobs), len(context) + len(continuation) + 1)
        self.assertEqual(len(lps.text_offset), len(lps.tokens))
        self.assertEqual(lps.text_offset[0], 0)
        scored = lps.token_logprobs[len(context) : -1]
        tops = lps.top_logprobs[len(context) : -1]
        self.assertEqual(len(scored), len(continuation))
        self.assertTrue(all(lp < 0 for lp in scored))
        is_greedy = all(lp == max(top.values()) for lp, top in zip(scored, tops, strict=True))
        self.assertIsInstance(is_greedy, bool)
        whole = post("/v1/completions", {"prompt": context + continuation, "max_tokens": 1, "prompt_logprobs": 0})
        rows = whole["prompt_logprobs"]
        ids = context + continuation
        want = [rows[i][str(ids[i])]["logprob"] for i in range(len(context), len(ids))]
        for got, expected in zip(scored, want, strict=True):
            self.assertAlmostEqual(got, expected, places=5)


class ResponsesApi(unittest.TestCase):
    """OpenAI's Responses API through the OpenAI SDK's own `client.responses` (as agent frameworks
    call a vLLM server): the chat route's reply, streamed events, structured output, tool calls."""

    def setUp(self):
        from openai import OpenAI

        self.client = OpenAI(base_url=BASE_URL, api_key="unused")
        # The tiny random model spends its tokens on JSON's optional spaces unless biased off them.
        spaces = post("/tokenize", {"prompt": " \n\t"})["tokens"]
        self.no_spaces = {"logit_bias": {str(t): -100 for t in spaces}}

    def test_a_response_is_the_chat_reply_streamed_or_not(self):
        ask = {"model": MODEL.name, "instructions": "Be brief.", "input": "Reverse: abc", "temperature": 0}
        r = self.client.responses.create(**ask, max_output_tokens=12)
        chat = self.client.chat.completions.create(
            model=MODEL.name,
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse: abc"}],
            temperature=0,
            max_tokens=12,
        )
        self.assertEqual(r.output_text, chat.choices[0].message.content)
        self.assertEqual((r.usage.input_tokens, r.usage.output_tokens), (chat.usage.prompt_tokens, 12))
        self.assertEqual(r.status, "incomplete" if chat.choices[0].finish_reason == "length" else "completed")
        with self.client.responses.stream(**ask, max_output_tokens=12) as stream:
            events = list(stream)
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        # A reply cut at the limit closes with `response.incomplete`, as OpenAI's does.
        self.assertEqual((events[0].type, events[-1].type), ("response.created", f"response.{r.status}"))
        self.assertEqual((deltas, events[-1].response.output_text), (r.output_text, r.output_text))

    def test_structured_output_and_a_tool_round_trip(self):
        import pydantic

        class Verdict(pydantic.BaseModel):
            answer: typing.Literal["yes", "no"]

        parsed = self.client.responses.parse(
            model=MODEL.name, input="Is 2 even?", text_format=Verdict, max_output_tokens=16, extra_body=self.no_spaces
        )
        self.assertIn(parsed.output_parsed.answer, ("yes", "no"))
        city = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
        tools = [{"type": "function", "name": "weather", "parameters": city, "strict": False}]
        r = self.client.responses.create(
            model=MODEL.name,
            input="Weather in Paris?",
            tools=tools,
            tool_choice={"type": "function", "name": "weather"},
            max_output_tokens=64,
            extra_body=self.no_spaces,
        )
        (call,) = [o for o in r.output if o.type == "function_call"]
        self.assertIn(json.loads(call.arguments)["city"], ("Paris", "Rome"))
        # The call and its output go back as input items, as an agent loop sends them.
        again = self.client.responses.create(
            model=MODEL.name,
            input=[
                {"role": "user", "content": "Weather in Paris?"},
                call.model_dump(exclude_none=True),
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            tools=tools,
            max_output_tokens=4,
        )
        self.assertGreater(again.usage.input_tokens, r.usage.input_tokens)


class VfEval(unittest.TestCase):
    """verifiers' own `vf-eval --client.type train` against `rl inference`, no proxy."""

    def test_vf_eval_with_the_train_client(self):
        out_dir = WORK / "vf-eval"
        vf_eval = pathlib.Path(sys.executable).parent / "vf-eval"
        run = subprocess.run(
            [
                str(vf_eval),
                "rlt_reverse",
                "-m",
                MODEL.name,
                "-n",
                "2",
                "-r",
                "2",
                "--client.type",
                "train",
                "--client.base-url",
                BASE_URL,
                "--client.api-key-var",
                "RL_TEST_NO_KEY",
                "--client.renderer-model-name",
                str(MODEL),
                "--env.agent.harness.id",
                "null",
                "--env.agent.runtime.type",
                "subprocess",
                "--sampling.max-tokens",
                "8",
                "-o",
                str(out_dir),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
        (traces_file,) = out_dir.glob("*/traces.jsonl")
        rows = [json.loads(line) for line in traces_file.read_text().splitlines() if line.strip()]
        self.assertEqual(len(rows), 4)
        for row in rows:
            trace = row if "nodes" in row else row["traces"][0]
            sampled = [n for n in trace["nodes"] if n.get("sampled")]
            self.assertTrue(sampled and all(n["token_ids"] and n["logprobs"] for n in sampled), "token-level traces")


# Every episode of verifiers' `subprocess` runtime starts a fresh interpreter for its harness program
# (~2.5 s of CPU importing `openai`), so the training tests run the smallest batches that still
# hold two groups: 8 episodes a run instead of the configs' 16 (and 4 per eval instead of 16).
SMALL_BATCH = ["--orchestrator.batch-size", "4", "--orchestrator.group-size", "2"]


class Training(unittest.TestCase):
    """`rl rl` trains each config of configs/verifiers for two steps."""

    def train(self, name, *extra, env_name="verifiers"):
        text = (ROOT / "configs/verifiers" / name).read_text()
        text = text.replace('python = "python3"', f"python = {json.dumps(sys.executable)}")
        config = WORK / name
        config.write_text(text)
        out = WORK / ("out-" + name)
        run = subprocess.run(
            [
                RL,
                "rl",
                "@",
                str(config),
                "--clean",
                "--model.path",
                str(MODEL),
                "--output-dir",
                str(out),
                *SMALL_BATCH,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=900,
            # A config with no `python` (prime-rl's sources) runs the host in the `python3` on PATH.
            env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")},
        )
        self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
        self.run_stderr = run.stderr
        run_name = re.search(r'^name = "(.*)"$', text, re.M).group(1)
        rows = [json.loads(line) for line in (out / run_name / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "rollouts" in r]  # besides the step-0 eval row, if any
        self.assertEqual([r["step"] for r in steps], [1, 2])
        self.assertTrue(all(f"env/{env_name}/reward" in r and r["rollouts"] > 0 for r in steps), rows)
        trainer = [json.loads(line) for line in (out / run_name / "trainer/metrics.jsonl").read_text().splitlines()]
        self.assertTrue(trainer and any(r["rl_tokens"] > 0 for r in trainer), trainer)
        for r in trainer:
            if r["rl_tokens"] > 0:
                self.assertLess(r["mismatch_kl"], 1e-3, r)
        return rows

    def test_single_turn_with_evals(self):
        rows = self.train("reverse_text.toml", "--orchestrator.eval.num-examples", "4")
        evals = [r for r in rows if "eval/verifiers/avg@1" in r]
        self.assertEqual(len(evals), 2, "at the start and after step 2")
        self.assertTrue(all(r["eval/verifiers/examples"] == 4 for r in evals), rows)
        # Per reward function and per metric, as the training rows have them.
        self.assertTrue(
            all("eval/verifiers/reward/reversal" in r and "eval/verifiers/metric/reply_chars" in r for r in evals),
            evals,
        )

    def test_prime_rl_sources(self):
        # prime-rl's spelling: train and eval sources, `[orchestrator.algo]`, `[monitors.file]`.
        rows = self.train("prime_rl_sources.toml", env_name="reverse")
        self.assertIn("orchestrator.train.source` (prime-rl's spelling)", self.run_stderr)
        evals = [r for r in rows if "eval/reverse-held-out/avg@1" in r]
        self.assertEqual(len(evals), 2, "prime-rl evaluates on start, and here after step 2")
        self.assertTrue(all(r["eval/reverse-held-out/examples"] == 16 for r in evals), "num_examples = -1: all")

    def test_prime_rl_eval_config(self):
        # prime-rl's `eval @ eval.toml` shape (the endpoint in `[eval.client]`, eval sources), run
        # by `rl eval`, which starts the source's env server itself.
        config = WORK / "prime-eval.toml"
        config.write_text(
            f"[model]\nname = {json.dumps(MODEL.name)}\npath = {json.dumps(str(MODEL))}\n"
            f"[eval]\nnum_examples = 4\n[eval.client]\nbase_url = [{json.dumps(BASE_URL)}]\n"
            '[[eval.source]]\nname = "reverse"\n[eval.source.env.taskset]\nid = "rlt_reverse"\n'
            '[eval.source.env.agent]\nharness = { id = "null" }\nruntime = { type = "subprocess" }\nmax_turns = 1\n'
            "[eval.sampling]\nmax_completion_tokens = 8\n"
        )
        out = WORK / "prime-eval"
        run = subprocess.run(
            [RL, "eval", "@", str(config), "--output-dir", str(out)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")},
        )
        self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
        self.assertIn("`eval.client` (prime-rl's spelling)", run.stderr)
        result = json.loads((out / "eval.json").read_text())
        self.assertEqual(result["eval/reverse/examples"], 4, result)
        self.assertIn("eval/reverse/avg@1", result)

    def test_tools(self):
        self.train("tool_lookup.toml")

    def test_multi_turn(self):
        self.train("user_sim.toml")

    def test_harness_chosen_by_config(self):
        self.train("harness_by_config.toml")


if __name__ == "__main__":
    unittest.main()
