"""The OpenAI request bodies the server accepts, checked field by field, and its error bodies.

``parse_completion(body, chat=...)`` turns a JSON object into ``GenerationParams`` or raises ``BadRequest``
naming the first bad field. Fields this engine cannot honour (logprobs, penalties, logit_bias, n > 1, echo,
suffix) are refused rather than silently ignored; unknown fields are ignored, as OpenAI clients send extras.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

MAX_STOP_STRINGS = 4


class BadRequest(ValueError):
    """A request field is missing or invalid: HTTP 400 naming ``param``."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error JSON: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class GenerationParams:
    """What one request asks for, checked. ``prompt`` is text (or token ids); ``messages`` for chat."""

    prompt: str | list[int] | None
    messages: list[dict] | None
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if not _is_number(v) or not math.isfinite(v):
        raise BadRequest(name, f"'{name}' must be a finite number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise BadRequest(name, f"'{name}' must be in {span}, got {v!r}")
    return float(v)


def _prompt(body: dict) -> str | list[int]:
    if "prompt" not in body or body["prompt"] is None:
        raise BadRequest("prompt", "'prompt' is required")
    p = body["prompt"]
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]                     # a batch of one prompt
    if isinstance(p, str):
        if not p:
            raise BadRequest("prompt", "'prompt' must not be empty")
        return p
    if isinstance(p, list) and p and all(_is_int(t) for t in p):
        return list(p)
    if isinstance(p, list) and not p:
        raise BadRequest("prompt", "'prompt' must not be empty")
    if isinstance(p, list) and all(isinstance(x, (str, list)) for x in p):
        raise BadRequest("prompt", "'prompt' holds several prompts: send one prompt per request")
    raise BadRequest("prompt", "'prompt' must be a string or a list of token ids")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise BadRequest("messages", "'messages' is required")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages", "'messages' must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}]", f"'messages[{i}]' must be an object with 'role' and 'content'")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant"):
            raise BadRequest(f"messages[{i}].role", f"'messages[{i}].role' must be system, user or assistant, "
                                                    f"got {role!r}")
        if isinstance(content, list):   # content parts: text only
            if not all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                       for part in content):
                raise BadRequest(f"messages[{i}].content", "only text content parts are supported")
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content", f"'messages[{i}].content' must be a string")
        out.append({"role": role, "content": content})
    return out


def _stop(body: dict) -> tuple[str, ...]:
    s = body.get("stop")
    if s is None:
        return ()
    stops = [s] if isinstance(s, str) else s
    if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
        raise BadRequest("stop", "'stop' must be a string or a list of strings")
    if any(not x for x in stops):
        raise BadRequest("stop", "'stop' strings must not be empty")
    if len(stops) > MAX_STOP_STRINGS:
        raise BadRequest("stop", f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}")
    return tuple(stops)


def _refuse_unsupported(body: dict, chat: bool) -> None:
    n = body.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise BadRequest("n", f"'n' must be 1 (one choice per request), got {n!r}")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise BadRequest("best_of", f"'best_of' must be 1, got {best_of!r}")
    for name in ("presence_penalty", "frequency_penalty"):
        v = body.get(name)
        if v is not None and v != 0:
            raise BadRequest(name, f"'{name}' is not supported (exact speculative decoding samples from the "
                                   f"model's distribution); send 0 or omit it")
    if body.get("logit_bias"):
        raise BadRequest("logit_bias", "'logit_bias' is not supported")
    if body.get("logprobs") not in (None, False, 0) or body.get("top_logprobs") not in (None, 0):
        raise BadRequest("logprobs", "'logprobs' is not supported")
    if not chat and body.get("echo"):
        raise BadRequest("echo", "'echo' is not supported")
    if not chat and body.get("suffix"):
        raise BadRequest("suffix", "'suffix' is not supported")


def parse_completion(body, *, chat: bool, model_name: str) -> GenerationParams:
    """Check a /v1/completions (chat=False) or /v1/chat/completions (chat=True) body."""
    if not isinstance(body, dict):
        raise BadRequest(None, "the request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise BadRequest("model", f"'model' is required: this server serves {model_name!r}")
    if model != model_name:
        raise BadRequest("model", f"model {model!r} is not served here; this server serves {model_name!r}")
    _refuse_unsupported(body, chat)
    prompt = None if chat else _prompt(body)
    messages = _messages(body) if chat else None
    name = "max_tokens"
    max_tokens = body.get("max_tokens")
    if chat and max_tokens is None and body.get("max_completion_tokens") is not None:
        name, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
    if max_tokens is None:
        max_tokens = 16 if not chat else None
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise BadRequest(name, f"'{name}' must be an integer >= 1, got {max_tokens!r}")
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = body.get("top_k", 0)
    if top_k is None or top_k == -1:
        top_k = 0
    if not _is_int(top_k) or top_k < 0:
        raise BadRequest("top_k", f"'top_k' must be an integer >= 0 (0 or -1 = off), got {top_k!r}")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not -2**63 <= seed < 2**63):
        raise BadRequest("seed", f"'seed' must be a 64-bit integer, got {seed!r}")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream", f"'stream' must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options", "'stream_options' must be an object")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest("stream_options.include_usage", "'stream_options.include_usage' must be true or false")
    return GenerationParams(prompt, messages, max_tokens, temperature, top_p, top_k,
                            None if seed is None else seed % 2**63, _stop(body), stream, include_usage)


def decoding_stats(stats) -> dict:
    """The ``speculative_decoding_stats`` of one choice, from its sequence's ``Stats``."""
    per_pos = [a / p if p else 0.0 for a, p in zip(stats.accepted_per_position, stats.proposed_per_position)]
    return {
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_length": stats.mean_accepted_length,
        "acceptance_rate_per_position": per_pos,
        "accepted_per_position": list(stats.accepted_per_position),
        "proposed_per_position": list(stats.proposed_per_position),
        "rounds": stats.rounds,
        "draft_tokens_proposed": stats.proposed,
        "draft_tokens_accepted": stats.accepted,
        "num_draft_last": stats.num_draft_last,
    }
