"""The FastAPI app: OpenAI-compatible endpoints over an ``EngineLoop`` (see engine.py).

    POST /v1/completions         prompt (text or token ids) -> text; ``stream`` for SSE chunks
    POST /v1/chat/completions    messages -> the tokenizer's chat template -> an assistant message
    GET  /v1/models              the one served model
    GET  /health                 200 while the engine thread runs, 503 otherwise
    GET  /metrics                Prometheus text

Every choice (the final chunk when streaming) carries ``speculative_decoding_stats`` and ``token_ids``
(the generated ids, an ending EOS included, so that clients can check exactness token for token).
Errors: 400 (bad field, named in ``error.param``), 429 (queue full), 500 (this request's generation
failed; when streaming, an ``error`` chunk before ``[DONE]``), 503 (shutting down).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from ..engine import QueueFull, Request
from ..engine.request import Sequence
from ..verify import rng
from .engine import EngineLoop, Handle
from .metrics import CONTENT_TYPE, Metrics
from .protocol import BadRequest, GenerationParams, decoding_stats, error_body, parse_completion
from .text import IncrementalText

CHAT_DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class ServedModel:
    """What the handlers need to know about the model: its name, tokenizer, limits and lookahead."""

    name: str
    tokenizer: object
    vocab_size: int
    max_seq_len: int
    lookahead: int                  # k + 1: the room one round may need beyond the last token


def _error(status: int, message: str, kind: str, metrics: Metrics, param: str | None = None) -> JSONResponse:
    metrics.http_error(status)
    return JSONResponse(error_body(message, kind, param), status_code=status)


def _encode(params: GenerationParams, served: ServedModel) -> list[int]:
    tok = served.tokenizer
    if params.messages is not None:
        ids = list(tok.apply_chat_template(params.messages, add_generation_prompt=True))
    elif isinstance(params.prompt, str):
        ids = list(tok.encode(params.prompt))
    else:
        ids = params.prompt
        bad = [t for t in ids if not 0 <= t < served.vocab_size]
        if bad:
            raise BadRequest("prompt", f"prompt token ids must be in [0, {served.vocab_size}), got e.g. {bad[:5]}")
    if not ids:
        raise BadRequest("messages" if params.messages is not None else "prompt", "the prompt encodes to no tokens")
    return ids


def _max_tokens(params: GenerationParams, prompt: list[int], served: ServedModel) -> int:
    room = served.max_seq_len - len(prompt) - served.lookahead
    if params.max_tokens is None:                      # chat without a limit: what fits, up to a default
        if room < 1:
            raise BadRequest("messages", f"the prompt has {len(prompt)} tokens: no room left in the context of "
                                         f"{served.max_seq_len} tokens")
        return min(CHAT_DEFAULT_MAX_TOKENS, room)
    if params.max_tokens > room:
        raise BadRequest("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens {params.max_tokens} + lookahead "
                                       f"{served.lookahead} exceeds the context of {served.max_seq_len} tokens")
    return params.max_tokens


def _finish_reason(seq: Sequence) -> str:
    return {"eos": "stop", "stop": "stop"}.get(seq.finish_reason, "length")


def _usage(seq: Sequence) -> dict:
    n_prompt, n_new = len(seq.request.prompt), len(seq.generated)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_new, "total_tokens": n_prompt + n_new}


class _Handlers:
    """The OpenAI endpoints' work: parse a request, submit it to the engine loop, answer whole or streamed."""

    def __init__(self, engine: EngineLoop, served: ServedModel, metrics: Metrics):
        self.engine, self.served, self.metrics = engine, served, metrics
        self.tok = served.tokenizer
        self.eos = set(self.tok.eos_token_ids)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)

    async def body_of(self, http: HTTPRequest):
        try:
            return await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(None, f"the request body is not valid JSON: {e}") from e

    async def generate(self, http: HTTPRequest, chat: bool):
        if not self.engine.alive:
            return _error(503, "the server is shutting down", "service_unavailable", self.metrics)
        try:
            params = parse_completion(await self.body_of(http), chat=chat, model_name=self.served.name)
            prompt = _encode(params, self.served)
            max_tokens = _max_tokens(params, prompt, self.served)
        except BadRequest as e:
            return _error(400, str(e), "invalid_request_error", self.metrics, e.param)
        seed = params.seed if params.seed is not None else rng.seed_from(None)
        request = Request(prompt, max_tokens, params.temperature, params.top_k, params.top_p, seed, params.stop)
        handle = Handle(request, asyncio.get_running_loop())
        if params.stream:
            handle.text = IncrementalText(self.decode, self.eos, params.stop)
        try:
            await asyncio.wrap_future(self.engine.submit(handle))
        except QueueFull as e:
            return _error(429, f"too many requests waiting: {e}; retry later", "rate_limit_error", self.metrics)
        except ValueError as e:
            return _error(400, str(e), "invalid_request_error", self.metrics, "max_tokens")
        except RuntimeError as e:
            return _error(503, str(e), "service_unavailable", self.metrics)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{request.id}"
        if params.stream:
            return StreamingResponse(self.stream(handle, params, chat, ident), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await self.complete(http, handle, chat, ident)

    async def complete(self, http: HTTPRequest, handle: Handle, chat: bool, ident: str):
        try:
            while True:
                kind, payload = await handle.events.get()
                if kind == "end":
                    break
        finally:
            if not handle.done:              # the handler was cancelled (client gone): free the slot
                self.engine.cancel(handle.request.id)
        seq: Sequence = payload
        if seq.finish_reason == "error":
            return _error(500, f"generation failed: {seq.error}", "server_error", self.metrics)
        if seq.finish_reason == "cancelled":
            return _error(503, "the request was cancelled: the server is shutting down", "service_unavailable",
                          self.metrics)
        gen = seq.result(self.decode)
        choice = {"index": 0, "finish_reason": _finish_reason(seq), "token_ids": gen.tokens,
                  "speculative_decoding_stats": decoding_stats(seq.stats)}
        if chat:
            choice["message"] = {"role": "assistant", "content": gen.text}
        else:
            choice.update(text=gen.text, logprobs=None)
        return {"id": ident, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.served.name, "choices": [choice], "usage": _usage(seq)}

    def chunk(self, ident: str, chat: bool, text: str | None, tokens: list[int], finish: str | None = None,
              first: bool = False, extra: dict | None = None) -> str:
        if chat:
            delta = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        choice["token_ids"] = tokens
        choice.update(extra or {})
        body = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.served.name, "choices": [choice]}
        return f"data: {json.dumps(body)}\n\n"

    async def stream(self, handle: Handle, params: GenerationParams, chat: bool, ident: str):
        text = handle.text
        try:
            if chat:
                yield self.chunk(ident, chat, "", [], first=True)
            while True:
                kind, payload = await handle.events.get()
                if kind == "tokens":
                    tokens, piece = payload
                    yield self.chunk(ident, chat, piece, tokens)
                    continue
                seq: Sequence = payload
                if seq.finish_reason == "error":
                    self.metrics.http_error(500)
                    yield f"data: {json.dumps(error_body(f'generation failed: {seq.error}', 'server_error'))}\n\n"
                elif seq.finish_reason != "cancelled":
                    rest = text.finish(seq)
                    yield self.chunk(ident, chat, rest, [], finish=_finish_reason(seq),
                                extra={"speculative_decoding_stats": decoding_stats(seq.stats)})
                    if params.include_usage:
                        usage = {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                                 "created": int(time.time()), "model": self.served.name, "choices": [],
                                 "usage": _usage(seq)}
                        yield f"data: {json.dumps(usage)}\n\n"
                yield "data: [DONE]\n\n"
                return
        finally:
            if not handle.done:              # the client went away mid-stream: free the slot
                self.engine.cancel(handle.request.id)


def build_app(engine: EngineLoop, served: ServedModel, metrics: Metrics) -> FastAPI:
    """The FastAPI app: each route is one line over ``_Handlers``."""
    app = FastAPI(title="verispec", docs_url=None, redoc_url=None)
    h = _Handlers(engine, served, metrics)

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        return await h.generate(http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest):
        if not getattr(h.tok, "chat_template", None):
            return _error(400, f"model {h.served.name!r} has no chat template: use /v1/completions",
                          "invalid_request_error", h.metrics, "messages")
        return await h.generate(http, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": h.served.name, "object": "model", "created": 0,
                                            "owned_by": "verispec", "max_model_len": h.served.max_seq_len}]}

    @app.get("/health")
    async def health():
        if h.engine.alive:
            return {"status": "ok"}
        return JSONResponse({"status": "unavailable"}, status_code=503)

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(h.metrics.render(), media_type=CONTENT_TYPE)

    return app
