"""OpenAI-compatible completion bodies in vLLM's shapes (the pace of their tokens is live.py's)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from specdec_runtime.simulator.vllm_cli import ServeOptions

# vLLM's default max_tokens for /v1/completions; the simulator uses it for chat too, where vLLM would
# default to the rest of the context window, to keep test requests short.
DEFAULT_MAX_TOKENS = 16
TOKEN_TEXT = " sim"


class RequestError(ValueError):
    """A request body vLLM would answer with 400."""


@dataclass
class CompletionRequest:
    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _sent_role: bool = False

    @classmethod
    def parse(cls, body: Any, *, chat: bool, options: ServeOptions) -> CompletionRequest:
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError("messages must be a non-empty list")
            prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            if "prompt" not in body:
                raise RequestError("prompt is required")
            prompt = body["prompt"] if isinstance(body["prompt"], str) else json.dumps(body["prompt"])
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError("max_tokens must be a positive integer")
        # A word is close enough to a token for the usage block of a simulated reply.
        prompt_tokens = max(1, len(prompt.split()))
        if options.max_model_len is not None and prompt_tokens + max_tokens > options.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {options.max_model_len} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens."
            )
        return cls(
            chat=chat,
            model=str(body.get("model", options.served_model_name)),
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            stream=bool(body.get("stream", False)),
        )

    @property
    def _id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.request_id}"

    def response(self, created: float) -> dict[str, Any]:
        text = TOKEN_TEXT * self.max_tokens
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        else:
            choice["text"] = text
        return {
            "id": self._id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": int(created),
            "model": self.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.max_tokens,
                "total_tokens": self.prompt_tokens + self.max_tokens,
            },
        }

    def sse_chunk(self, tokens: int, created: float, finish_reason: str | None = None) -> bytes:
        text = TOKEN_TEXT * tokens
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["delta"] = {"content": text} if self._sent_role else {"role": "assistant", "content": text}
            self._sent_role = True
        else:
            choice["text"] = text
        chunk = {
            "id": self._id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(created),
            "model": self.model,
            "choices": [choice],
        }
        return f"data: {json.dumps(chunk)}\n\n".encode()

    def sse_end(self, created: float) -> bytes:
        return self.sse_chunk(0, created, finish_reason="length") + b"data: [DONE]\n\n"
