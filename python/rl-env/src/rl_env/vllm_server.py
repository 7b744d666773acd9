"""vLLM's OpenAI server plus the one admin route `rl rl` needs to serve the policy from vLLM.

    python -m rl_env.vllm_server --model /path/to/model --served-model-name policy \\
        --logprobs-mode processed_logprobs [any other `vllm serve` flag]

adds to `vllm serve`:

- `POST /update_weights {"weight_dir": DIR}`: loads every `*.safetensors` file in DIR (a trainer
  broadcast, `broadcasts/step_N`) into the running model on every worker, then resets the prefix
  cache (cached keys and values were computed with the old weights). Answers `{"status": "ok"}`.
  The orchestrator calls it after each trainer step; prime-rl's inference server has the same
  route and payload, so either server works.
- `--weight-roots DIR[,DIR...]`: `/update_weights` refuses directories outside these (default:
  none, which refuses every update; `rl rl` runs point it at the run's `broadcasts` directory).

Everything else is `vllm serve`: pass its flags through. `--logprobs-mode processed_logprobs` is
set unless given: the trainer's importance ratios compare its logprobs at the sampling temperature
with the engine's, so the engine must report logprobs after temperature scaling (vLLM's default is
the raw distribution).

Needs `vllm` (a GPU install); not part of this package's tests, which cannot run vLLM. See
docs/guide-vllm.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROUTE = "/update_weights"
WORKER_EXTENSION = "rl_env.vllm_server.WeightsFromDirectory"


def safetensors_files(weight_dir: str) -> list[Path]:
    """The weight files of a broadcast directory, in a stable order."""
    files = sorted(Path(weight_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{weight_dir} holds no .safetensors file")
    return files


def allowed(weight_dir: str, roots: list[str]) -> bool:
    """Whether `weight_dir` (symlinks resolved) lies under one of `roots`."""
    target = Path(weight_dir).resolve()
    for root in roots:
        base = Path(root).resolve()
        if target == base or base in target.parents:
            return True
    return False


def is_adapter_dir(weight_dir: str) -> bool:
    """Whether `weight_dir` holds a LoRA adapter (PEFT's `adapter_config.json`), which
    `/update_weights` does not load into vLLM: its weights are not the model's."""
    return os.path.isfile(os.path.join(weight_dir, "adapter_config.json"))


ADAPTER_REFUSED = (
    "weight_dir holds a LoRA adapter (adapter_config.json): /update_weights on vLLM loads full weights only. "
    "Load adapters through vLLM's LoRA API instead: set orchestrator.model.lora_name and start vLLM with "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True --enable-lora --max-lora-rank <rank> (docs/guide-vllm.md)"
)


class WeightsFromDirectory:
    """vLLM worker extension (`--worker-extension-cls`): the method `/update_weights` calls on
    every worker through `collective_rpc`."""

    def update_weights_from_path(self, weight_dir: str) -> int:
        from safetensors.torch import safe_open

        def tensors():
            for path in safetensors_files(weight_dir):
                with safe_open(str(path), framework="pt", device="cpu") as f:
                    for name in f:
                        yield name, f.get_tensor(name)

        # vLLM's model classes map HF names onto their fused parameters and cast to their dtype.
        loaded = self.model_runner.model.load_weights(weights=tensors())
        return len(loaded) if loaded is not None else 0


def _split_roots(argv: list[str]) -> tuple[list[str], list[str]]:
    """Takes `--weight-roots` out of the command line (vLLM would reject it)."""
    roots: list[str] = []
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--weight-roots":
            roots.extend(p for p in next(it, "").split(",") if p)
        elif arg.startswith("--weight-roots="):
            roots.extend(p for p in arg.split("=", 1)[1].split(",") if p)
        else:
            rest.append(arg)
    return roots, rest


def _with_defaults(argv: list[str]) -> list[str]:
    has = lambda flag: any(a == flag or a.startswith(flag + "=") for a in argv)  # noqa: E731
    out = list(argv)
    if not has("--logprobs-mode"):
        out += ["--logprobs-mode", "processed_logprobs"]
    # vLLM's default (`auto`) applies the model's generation_config.json as defaults to every
    # request (Qwen3: top_k 20, top_p 0.95): rollouts would be sampled from a truncated
    # distribution the trainer does not compute. `vllm` keeps the run's sampling config
    # authoritative, as prime-rl's server does.
    if not has("--generation-config"):
        out += ["--generation-config", "vllm"]
    if not has("--worker-extension-cls"):
        out += ["--worker-extension-cls", WORKER_EXTENSION]
    return out


def main(argv: list[str] | None = None) -> None:
    roots, rest = _split_roots(list(sys.argv[1:] if argv is None else argv))
    os.environ["RL_WEIGHT_ROOTS"] = os.pathsep.join(roots)

    import uvloop
    import vllm.entrypoints.openai.api_server as api_server
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    router = APIRouter()

    def error(status: int, message: str) -> JSONResponse:
        # vLLM's error object, so clients parse it as they parse vLLM's own errors.
        kind = "BadRequestError" if status == 400 else "NotFoundError" if status == 404 else "InternalServerError"
        body = {"error": {"message": message, "type": kind, "param": "weight_dir", "code": status}}
        return JSONResponse(body, status_code=status)

    @router.post(ROUTE)
    async def update_weights(request: Request) -> JSONResponse:
        body = await request.json()
        weight_dir = body.get("weight_dir") if isinstance(body, dict) else None
        if not isinstance(weight_dir, str) or not weight_dir:
            return error(400, "`weight_dir` must be a directory path")
        allowed_roots = [r for r in os.environ.get("RL_WEIGHT_ROOTS", "").split(os.pathsep) if r]
        if not allowed(weight_dir, allowed_roots):
            return error(400, "`weight_dir` is not under a --weight-roots directory")
        if is_adapter_dir(weight_dir):
            return error(400, ADAPTER_REFUSED)
        try:
            safetensors_files(weight_dir)
        except FileNotFoundError as e:
            return error(404, str(e))
        client = request.app.state.engine_client
        await client.collective_rpc("update_weights_from_path", args=(weight_dir,))
        await client.reset_prefix_cache()
        return {"status": "ok"}

    original_build_app = api_server.build_app

    def build_app(*args, **kwargs):
        app = original_build_app(*args, **kwargs)
        app.include_router(router)
        return app

    api_server.build_app = build_app
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM with rl's /update_weights"))
    args = parser.parse_args(_with_defaults(rest))
    validate_parsed_serve_args(args)
    uvloop.run(api_server.run_server(args))


if __name__ == "__main__":
    main()
