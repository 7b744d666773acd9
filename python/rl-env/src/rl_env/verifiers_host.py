"""Hosts a verifiers v1 environment (`pip install verifiers`) for `rl env-server` (env id `verifiers`).

The server starts `python -m rl_env.verifiers_host --config JSON`; this process loads the
environment with verifiers' own loader (`resolve_env_config` + `load_environment`: the taskset,
its `Task` rewards, metrics and stops, the harness and runtime the config names), lists the tasks
of each split with verifiers' `select` views, enters `env.serving()` (shared tool servers, the
interception server) and answers `run` requests on the `rl_env.worker` line protocol. A `run` is
one episode through `env.run_slot`, the path verifiers' own env server takes (harness,
interception, tools, stop conditions, retries), with verifiers' train client pointed at the
policy's `/inference/v1/generate` and the policy's model directory as the renderer's tokenizer.
Each finished trace is turned into the server's trace format without loss of what training needs:
every node's token ids, mask and logprobs, the rewards with their weights, metrics, the stop
condition and errors (kind + message; the server decides what is retryable).
"""

import argparse
import asyncio
import hashlib
import json
import os
import re
import sys
import time
import traceback

from .worker import PROTOCOL_VERSION, BadRequest, LineServer, protocol_stdout, serve

# The first lines of a long error message (a harness's traceback) kept on a trace.
ERROR_HEAD_LINES = 3
ERROR_TAIL_LINES = 12
# Python exception names (verifiers' `Error.type`) by the server's error kind.
INFRASTRUCTURE = {"HarnessError", "SandboxError", "InterceptionError", "TunnelError", "ToolsetError", "ConnectionError"}
TIMEOUTS = {"TimeoutError", "CancelledError"}


def short(message, limit=4000):
    """A long message (a traceback) cut to its head and tail."""
    lines = (message or "").splitlines()
    if len(lines) > ERROR_HEAD_LINES + ERROR_TAIL_LINES:
        cut = len(lines) - ERROR_HEAD_LINES - ERROR_TAIL_LINES
        lines = [*lines[:ERROR_HEAD_LINES], f"[... {cut} lines ...]", *lines[-ERROR_TAIL_LINES:]]
    text = "\n".join(lines)
    return text if len(text) <= limit else text[: limit // 2] + " [...] " + text[-limit // 2 :]


def error_kind(error):
    """The server's kind for a verifiers `Error` record (type name + status code)."""
    name, status = error.type, error.status_code
    if name == "OverlongPromptError":
        return "overlong_prompt"
    if name == "ProviderError":
        # The endpoint refused the request itself (a bad parameter): asking again cannot help.
        if status is not None and 400 <= status < 500 and status not in (408, 429):
            return "bad_request"
        return "infrastructure"
    if name in INFRASTRUCTURE:
        return "infrastructure"
    if name in TIMEOUTS:
        return "timeout"
    return "env"


def wire_error(error, where):
    return {"kind": error_kind(error), "message": short(f"{where}{error.type}: {error.message}")}


def message_text(content):
    from verifiers.v1.types import content_text

    return content_text(content) if content is not None else ""


def prompt_messages(data):
    """A task's opening messages, as the harness gives them to the model."""
    messages = []
    if data.system_prompt:
        messages.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        for m in data.prompt:
            messages.append({"role": m.role, "content": message_text(getattr(m, "content", None))})
    return messages


def node_json(node, finish):
    message = node.message
    out = {
        "parent": -1 if node.parent is None else node.parent,
        "role": message.role,
        "content": message_text(getattr(message, "content", None)),
        "sampled": bool(node.sampled),
        "token_ids": list(node.token_ids),
        "mask": [bool(m) for m in node.mask],
        "logprobs": [float(x) for x in node.logprobs],
        "finish_reason": finish or "",
    }
    calls = getattr(message, "tool_calls", None) or []
    if calls:
        out["tool_calls"] = [{"id": c.id or "", "name": c.name, "arguments": c.arguments or ""} for c in calls]
    call_id = getattr(message, "tool_call_id", None)
    if call_id:
        out["tool_call_id"] = call_id
    return out


def trace_json(trace, episode_errors, member):
    """One verifiers trace in the server's trace format."""
    finish = {call.node: call.finish_reason for call in trace.calls if call.node is not None}
    nodes = [node_json(node, finish.get(i)) for i, node in enumerate(trace.nodes)]
    errors = [] if trace.ok else [wire_error(e, "") for e in trace.errors]
    if trace.is_timeout and not trace.ok and not errors:
        errors.append({"kind": "timeout", "message": "the trace timed out"})
    errors += episode_errors
    if not trace.ok and not errors:
        errors.append(
            {"kind": "env", "message": f"the trace ended unfinished (stop condition {trace.stop_condition!r})"}
        )
    temperatures = sorted({c.sampling.temperature for c in trace.calls if c.error is None and c.sampling is not None})
    temperature = None
    if len(temperatures) > 1 and None in temperatures:
        temperatures.remove(None)
    if len(temperatures) == 1:
        # A call that set none was sampled at the engine's default, 1.0 (vLLM's as ours).
        temperature = 1.0 if temperatures[0] is None else float(temperatures[0])
    elif len(temperatures) > 1:
        errors.append(
            {
                "kind": "env",
                "message": f"the turns were sampled at different temperatures {temperatures}; "
                "a trace is trained at one temperature",
            }
        )
    rewards = {
        k: {"score": float(r.score), "weight": float(r.weight)} for k, r in trace.rewards.items() if r is not None
    }
    metrics = {k: float(v) for k, v in trace.metrics.items() if v is not None}
    timing = trace.timing
    end = max(timing.scoring.end, timing.agent.end, timing.start)
    return {
        "id": trace.id,
        "member_id": member,
        "nodes": nodes,
        "tools": [
            {"name": t.name, "description": t.description or "", "parameters": t.parameters} for t in trace.tools
        ],
        "rewards": rewards,
        "reward": float(trace.reward) if rewards else 0.0,
        "metrics": metrics,
        "stop_condition": trace.stop_condition or "",
        "is_truncated": bool(trace.is_truncated),
        "errors": errors,
        "num_turns": int(trace.num_turns),
        "timing": {
            "total_s": max(end - timing.start, 0.0),
            "model_s": float(timing.agent.model.duration),
            "scoring_s": max(timing.scoring.end - timing.scoring.start, 0.0),
        },
        "sampling_temperature": temperature,
    }


def episode_json(episode):
    """The traces of an episode; an episode that failed before any trace still returns one."""
    episode_errors = [] if episode.ok else [wire_error(e, "episode: ") for e in episode.errors]
    traces = [t for t in episode.traces if t.agent.trainable]
    # Seats are members only when two or more train (a self-play pair); one trainable seat's
    # traces (best-of-n's attempts, the assistant beside a simulated user) are attempts at the
    # task, which evals score as avg@k and pass@k.
    named = len({t.agent.name for t in traces}) > 1
    out = [trace_json(t, episode_errors, t.agent.name if named else "") for t in traces]
    if not out:
        errors = episode_errors or [{"kind": "env", "message": "the episode produced no trainable trace"}]
        out.append({"id": episode.id, "nodes": [], "errors": errors, "stop_condition": "error"})
    return out


HUB_SNAPSHOT = re.compile(r"(?:^|/)models--(?P<repo>[^/]+)/snapshots/[^/]+/?$")

# The Hermes-style calls Qwen2.5/Qwen3 templates (and `rl model init`'s) render, which the
# `renderers` package parses with its `qwen3` tool parser.
PROBE_TOOL = {"type": "function", "function": {"name": "rl_probe", "parameters": {"type": "object"}}}
PROBE_CALL = {"type": "function", "function": {"name": "rl_probe", "arguments": {"x": 1}}}


def renderer_model_name(tokenizer):
    """The name verifiers resolves the policy's renderer and tokenizer by: a model in the Hugging
    Face hub cache by its hub id (`rl rl` hands over the cache's snapshot directory of
    `model.path = "Qwen/Qwen3-0.6B"`), which `renderers` maps to the model's own renderer; else the
    directory."""
    match = HUB_SNAPSHOT.search(str(tokenizer).replace(os.sep, "/"))
    return match["repo"].replace("--", "/", 1) if match else str(tokenizer)


def default_renderer(name):
    """A renderer config for a model `renderers` has no entry for (a fine-tune, a renamed or local
    checkpoint), which it would render with the bare chat template and no tool parsing, so a
    reply's tool calls stayed text and no tool ran: its own template, with the tool parser of the
    call format the template renders (Hermes `<tool_call>` blocks: `qwen3`). None: verifiers'
    own choice."""
    from renderers.base import MODEL_RENDERER_MAP, load_tokenizer

    if name in MODEL_RENDERER_MAP:
        return None
    try:
        tokenizer = load_tokenizer(name)
        messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]}]
        text = tokenizer.apply_chat_template(messages, tools=[PROBE_TOOL], tokenize=False)
    except Exception as e:  # a template that cannot render calls keeps verifiers' choice
        print(f"rl_env.verifiers_host: no tool-call probe for {name}: {e}", file=sys.stderr)
        return None
    if re.search(r'<tool_call>\s*\{\s*"name":\s*"rl_probe"', text):
        return {"name": "default", "tool_parser": "qwen3"}
    return None


class VerifiersHost(LineServer):
    """Runs episodes of one verifiers environment."""

    def __init__(self, env, splits, options, out):
        super().__init__(out)
        self.env = env
        self.splits = splits
        self.tokenizer = renderer_model_name(options["tokenizer"])
        self.renderer = options.get("renderer")
        if self.renderer is None:
            self.renderer = default_renderer(self.tokenizer)
        print(f"rl_env.verifiers_host: renderer {self.renderer or 'auto'} for {self.tokenizer}", file=sys.stderr)

    def context(self, actor):
        """verifiers' model context for the policy: its train client (token in, token out)."""
        import verifiers.v1 as vf

        key = actor.get("api_key")
        key_var = "RL_VERIFIERS_NO_KEY"
        if key:
            # verifiers reads keys from the environment, never from a config it may record.
            key_var = "RL_VERIFIERS_KEY_" + hashlib.sha256(key.encode()).hexdigest()[:16]
            os.environ[key_var] = key
        sampling = dict(actor.get("sampling") or {})
        client = vf.TrainClientConfig(
            base_url=actor["base_url"],
            api_key_var=key_var,
            headers=actor.get("headers") or {},
            renderer=self.renderer,
            renderer_model_name=self.tokenizer,
            timeout={"read": actor.get("timeout_s")},
        )
        return vf.ModelContext(client=client, model=actor["model"], sampling=vf.SamplingConfig(**sampling))

    async def do_run(self, params):
        split, index = params["split"], params["index"]
        tasks = self.splits.get(split)
        if tasks is None:
            raise BadRequest(f"unknown split {split!r}; this env has {', '.join(self.splits)}")
        if not 0 <= index < len(tasks):
            raise BadRequest(f"index {index} is out of range for split {split!r} of {len(tasks)} tasks")
        (slot,) = self.env.slots(tasks[index])
        episode = await self.env.run_slot(slot, self.context(params["actor"]))
        return {"traces": episode_json(episode)}


def load(config):
    """The environment and its splits' tasks, by verifiers' own loader and views. A split of an
    infinite taskset (one that generates tasks forever) with no selection takes its first
    `infinite_tasks` tasks, as prime-rl's sources iterate one from its start."""
    import verifiers.v1 as vf

    env_config = vf.resolve_env_config(config.get("env") or {})
    env = vf.load_environment(env_config)
    infinite_tasks = int(config.get("infinite_tasks") or 4096)
    splits = {}
    for name, select in (config.get("splits") or {"train": {}}).items():
        view = env.taskset.select(vf.SelectConfig.model_validate(select or {}))
        if not view.bounded and not select:
            view = env.taskset.select(vf.SelectConfig(limit=infinite_tasks))
            print(
                f"rl_env.verifiers_host: split {name!r}: the taskset is infinite; its first {infinite_tasks} tasks "
                f"(`infinite_tasks`, or a selection such as splits.{name}.limit)",
                file=sys.stderr,
            )
        if not view.bounded:
            raise ValueError(
                f"split {name!r}: the taskset is infinite; bound it with `limit` or closed `include.idx` ranges"
            )
        splits[name] = list(view)
    return env, env_config, splits


def describe(env, env_config, splits):
    from importlib.metadata import version

    harnesses = {role: cfg.id for role, cfg in env_config.agent_harnesses().items()}
    return {
        "id": env_config.env_id,
        "splits": {name: [t.data.model_dump(mode="json") for t in tasks] for name, tasks in splits.items()},
        "prompts": {name: [prompt_messages(t.data) for t in tasks] for name, tasks in splits.items()},
        "metadata": {
            "verifiers": version("verifiers"),
            "taskset": env_config.taskset.id,
            "harness": ", ".join(f"{k}={v}" for k, v in sorted(harnesses.items())),
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m rl_env.verifiers_host", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="JSON: env (a verifiers [env] table), splits, tokenizer")
    opts = parser.parse_args(argv)
    out = protocol_stdout()
    # Tokenizers load from the model directory; nothing is fetched from a hub at run time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        config = json.loads(opts.config)
        if not isinstance(config.get("tokenizer"), str):
            raise ValueError("`tokenizer` (the policy's model directory) is required")
        started = time.time()
        env, env_config, splits = load(config)
        ready = {"event": "ready", "protocol": PROTOCOL_VERSION, "env": describe(env, env_config, splits)}
        line = json.dumps(ready, allow_nan=False, ensure_ascii=False)
        serving = env.serving()
        loop.run_until_complete(serving.__aenter__())
        print(f"rl_env.verifiers_host: {env_config.env_id} ready in {time.time() - started:.1f}s", file=sys.stderr)
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        out.write(json.dumps({"event": "error", "message": short(f"{type(e).__name__}: {e}")}) + "\n")
        out.flush()
        return 1
    out.write(line + "\n")
    out.flush()
    serve(VerifiersHost(env, splits, config, out), loop)


if __name__ == "__main__":
    sys.exit(main())
