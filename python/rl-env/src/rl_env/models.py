"""Models a reward function or environment may call (an LLM judge): the request's `models` map."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from .messages import Messages


class Model:
    """An OpenAI-compatible chat endpoint from the request (`base_url` ends in /v1)."""

    def __init__(
        self, base_url: str, model: str, sampling: Mapping[str, Any] | None = None, timeout_s: float = 600.0
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sampling = dict(sampling or {})
        self.timeout_s = float(timeout_s) if timeout_s else 600.0

    def __repr__(self) -> str:
        return f"Model({self.model!r} at {self.base_url})"

    def _post(self, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            self.base_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read(64 << 20))
        except urllib.error.HTTPError as e:
            where = f"{self.model} at {self.base_url}"
            raise RuntimeError(f"{where}: HTTP {e.code}: {e.read(2000).decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            # Connection refused, unknown host, timeouts: say which endpoint, not only why.
            reason = getattr(e, "reason", e)
            raise RuntimeError(f"{self.model} at {self.base_url} is unreachable: {reason}") from None

    async def chat(self, messages: Messages, **sampling: Any) -> str:
        """The reply text of one chat completion (`sampling` overrides the request's sampling)."""
        body = {"model": self.model, "messages": messages, **self.sampling, **sampling}
        reply = await asyncio.get_running_loop().run_in_executor(None, self._post, body)
        try:
            return str(reply["choices"][0]["message"].get("content") or "")
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{self.model}: a chat completion without choices: {str(reply)[:200]}") from None
