"""The FastAPI app: OpenAI-compatible endpoints over an ``EngineLoop`` (see engine.py).

    POST /v1/completions         prompt (text or token ids) -> text; ``stream`` for SSE chunks
    POST /v1/chat/completions    messages -> the tokenizer's chat template -> an assistant message
    GET  /v1/models              the one served model
    GET  /health                 200 while the engine takes requests, 503 (with the reason) otherwise
    GET  /metrics                Prometheus text

Every choice carries ``token_ids`` (the generated ids, an ending EOS included, so that clients can check
exactness token for token; when streaming, each chunk carries the ids it adds) and, on the final chunk when
streaming, ``speculative_decoding_stats``. Errors, all as OpenAI's error JSON and counted in ``/metrics``: 400
(bad field, named in ``error.param``), 404 / 405 (no such endpoint / method), 429 (queue full), 500 (this
request's generation failed, or the engine did; when streaming, an ``error`` chunk before ``[DONE]``), 503
(shutting down, or the engine is dead).

No wait is unbounded: a watchdog task on the event loop looks every ``POLL_S`` at the requests whose handlers
wait for engine events, and hands a ("lost", reason) event to those the engine can no longer answer (it has
become unresponsive, or no longer knows the request: ``EngineLoop.unresponsive`` / ``lost``); their handlers give
up with a 500. One timer for all of them, not one per wait: a handler's wait for its next chunk is a plain
queue read (a per-wait timeout cost a task and a timer per chunk on the thread that shares the GIL with the
engine). A client that disconnects cancels its request: a stream's generator is cancelled by the ASGI
server, a whole response's handler listens for the disconnect message (no polling, here or in the engine).
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ..engine import QueueFull, Request
from ..engine.request import Sequence
from ..verify import rng
from .engine import EngineLoop, EngineUnavailable, Handle
from .metrics import CONTENT_TYPE, Metrics
from .protocol import BadRequest, GenerationParams, decoding_stats, error_body, parse_completion
from .text import IncrementalText

CHAT_DEFAULT_MAX_TOKENS = 256
POLL_S = 1.0                        # a handler's longest wait before it checks on the engine


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
    if room < 1:                                       # the prompt alone leaves no room: its fault, not max_tokens'
        raise BadRequest("messages" if params.messages is not None else "prompt",
                         f"the prompt has {len(prompt)} tokens: with the lookahead of {served.lookahead} it leaves no "
                         f"room for a new token in the context of {served.max_seq_len} tokens; shorten it")
    if params.max_tokens is None:                      # chat without a limit: what fits, up to a default
        return min(CHAT_DEFAULT_MAX_TOKENS, room)
    if params.max_tokens > room:
        raise BadRequest("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens {params.max_tokens} + lookahead "
                                       f"{served.lookahead} exceeds the context of {served.max_seq_len} tokens: "
                                       f"max_tokens can be at most {room} for this prompt")
    return params.max_tokens


def _finish_reason(seq: Sequence) -> str:
    return {"eos": "stop", "stop": "stop"}.get(seq.finish_reason, "length")


def _usage(seq: Sequence) -> dict:
    n_prompt, n_new = len(seq.request.prompt), len(seq.generated)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_new, "total_tokens": n_prompt + n_new}


class _Handlers:
    """The OpenAI endpoints' work: parse a request, submit it to the engine loop, answer whole or streamed."""

    def __init__(self, engine: EngineLoop, served: ServedModel, metrics: Metrics, stream_interval_s: float = 0.0):
        self.engine, self.served, self.metrics = engine, served, metrics
        self.stream_interval_s = stream_interval_s      # a stream's token chunks go at most this often (0: each round)
        self.tok = served.tokenizer
        self.eos = set(self.tok.eos_token_ids)
        # per event loop (the server has one): the handles whose handlers wait for engine events, and the watchdog
        # task that looks at them every POLL_S while there are any
        # (handles by request id) per event loop
        self.watched: dict[asyncio.AbstractEventLoop, tuple[dict[int, Handle], asyncio.Task | None]] = {}

    def watch(self, handle: Handle) -> None:
        """From now until ``release``, the watchdog checks that the engine can still answer ``handle``."""
        loop = asyncio.get_running_loop()
        handles, task = self.watched.get(loop, ({}, None))
        handles[handle.request.id] = handle
        if task is None or task.done():
            task = loop.create_task(self._watchdog(handles))
        self.watched[loop] = (handles, task)

    async def _watchdog(self, handles: dict[int, Handle]) -> None:
        """Every POLL_S while ``handles`` is not empty: a ("lost", reason) event to each handle the engine can no
        longer answer (dead, stuck, or it does not know the request and sent no end), once."""
        while handles:
            await asyncio.sleep(POLL_S)
            problem = self.engine.unresponsive()
            for handle in list(handles.values()):
                why = problem
                if why is None and self.engine.lost(handle) and handle.events.empty():
                    why = "the engine lost track of this request"
                if why is not None:
                    del handles[handle.request.id]
                    handle.events.put_nowait(("lost", why))

    def unwatch(self, handle: Handle) -> None:
        handles, _ = self.watched.get(handle.loop, ({}, None))
        handles.pop(handle.request.id, None)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)

    async def body_of(self, http: HTTPRequest):
        try:
            return await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(None, f"the request body is not valid JSON: {e}") from e

    async def next_event(self, handle: Handle) -> tuple:
        """The next ("tokens", ids) or ("end", Sequence) of ``handle``; ("lost", reason) when the engine can no
        longer deliver it (the watchdog's: a bounded wait once ``watch(handle)`` was called)."""
        if not handle.events.empty():         # the common case under load: no future to wait on
            return handle.events.get_nowait()
        return await handle.events.get()

    async def submit(self, handle: Handle):
        """Hand ``handle`` to the engine -> its Sequence; raises what the engine refused it with, or
        EngineUnavailable when the engine stops answering (a bounded wait)."""
        answer = asyncio.wrap_future(self.engine.submit(handle))
        while True:
            done, _ = await asyncio.wait({answer}, timeout=POLL_S)
            if done:
                return answer.result()
            problem = self.engine.unresponsive()
            if problem is not None:
                self.engine.cancel(handle.request.id)        # should the submission still land
                raise EngineUnavailable(problem)

    async def cancel_on_disconnect(self, http: HTTPRequest, handle: Handle) -> None:
        """Wait for the client to go away, then cancel its request. The body was read, so the ASGI server's next
        message is the disconnect: event-driven, no polling."""
        while (await http.receive())["type"] != "http.disconnect":
            pass
        handle.disconnected = True
        self.engine.cancel(handle.request.id)

    async def generate(self, http: HTTPRequest, chat: bool):
        problem = self.engine.problem()
        if problem is not None:
            return _error(503, problem, "service_unavailable", self.metrics)
        try:
            body = await self.body_of(http)
        except ClientDisconnect:             # gone before its request was read: nothing was asked, nothing to count
            return Response(status_code=499)
        except BadRequest as e:
            return _error(400, str(e), "invalid_request_error", self.metrics, e.param)
        try:
            params = parse_completion(body, chat=chat, model_name=self.served.name)
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
            await self.submit(handle)
        except QueueFull as e:
            return _error(429, f"too many requests waiting: {e}; retry later", "rate_limit_error", self.metrics)
        except ValueError as e:          # the scheduler's own check (the ones above should have caught it)
            return _error(400, str(e), "invalid_request_error", self.metrics)
        except EngineUnavailable as e:
            return _error(503, str(e), "service_unavailable", self.metrics)
        self.watch(handle)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{request.id}"
        if params.stream:
            return _Stream(self.stream(handle, params, chat, ident), lambda: self.release(handle))
        return await self.complete(http, handle, chat, ident)

    def release(self, handle: Handle) -> None:
        """The handler is done with ``handle``: if the engine still runs the request (the client went away, the
        handler was cancelled), cancel it so that its slot frees at the next step."""
        self.unwatch(handle)
        if not handle.done:
            self.engine.cancel(handle.request.id)

    async def complete(self, http: HTTPRequest, handle: Handle, chat: bool, ident: str):
        watcher = asyncio.create_task(self.cancel_on_disconnect(http, handle))
        try:
            while True:
                kind, payload = await self.next_event(handle)
                if kind != "tokens":
                    break
        finally:
            watcher.cancel()
            self.release(handle)
        if kind == "lost":
            return _error(500, f"generation failed: {payload}", "server_error", self.metrics)
        seq: Sequence = payload
        if handle.disconnected:              # nobody is listening: nothing to count as an HTTP error
            return Response(status_code=499)
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
        template = _TokenChunk(ident, chat, self.served.name)
        try:
            if chat:
                yield self.chunk(ident, chat, "", [], first=True)
            after = None                             # an event read while merging token events
            interval, loop = self.stream_interval_s, asyncio.get_running_loop()
            sent_at = None                           # when the last token chunk went (None: the first goes at once)
            while True:
                kind, payload = after if after is not None else await self.next_event(handle)
                after = None
                if kind == "tokens":
                    if interval and sent_at is not None:
                        # the rounds' events queue meanwhile and go out as one chunk: fewer chunks to frame and
                        # send on the event loop, which shares the GIL with the engine; the text is the same
                        wait = sent_at + interval - loop.time()
                        if wait > 0:
                            await asyncio.sleep(wait)
                    tokens, piece, after = _merge_queued_tokens(handle, payload)
                    yield template.render(piece, tokens) if piece is not None else self.chunk(ident, chat, piece, tokens)
                    sent_at = loop.time()
                    continue
                if kind == "lost":                   # the engine cannot deliver the end: say so, and stop waiting
                    self.metrics.http_error(500)
                    yield f"data: {json.dumps(error_body(f'generation failed: {payload}', 'server_error'))}\n\n"
                    yield "data: [DONE]\n\n"
                    return
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
            self.release(handle)


class _TokenChunk:
    """A stream's token chunks (``_Handlers.chunk`` with a text, no finish reason, nothing extra) from one template:
    the parts that never change within a stream are serialized once, so that a chunk costs two ``json.dumps`` of
    a string and a list of ints instead of building and serializing the whole object (once per stream per
    round, on the event loop). ``created`` is the stream's start, as in OpenAI's streams. The JSON is the same
    object, key for key, that ``chunk`` writes (tests/test_serve.py checks it)."""

    def __init__(self, ident: str, chat: bool, model: str):
        head = json.dumps({"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": int(time.time()), "model": model})[:-1]            # without its closing brace
        if chat:
            self.prefix = f'data: {head}, "choices": [{{"index": 0, "delta": {{"content": '
            self.middle = '}, "finish_reason": null, "token_ids": '
        else:
            self.prefix = f'data: {head}, "choices": [{{"index": 0, "text": '
            self.middle = ', "finish_reason": null, "logprobs": null, "token_ids": '

    def render(self, text: str, tokens: list[int]) -> str:
        return f"{self.prefix}{json.dumps(text)}{self.middle}{json.dumps(tokens)}}}]}}\n\n"


def _merge_queued_tokens(handle: Handle, payload: tuple) -> tuple[list[int], str | None, tuple | None]:
    """``payload`` ([ids], text) and the token events queued behind it, as one chunk: a stream that fell behind
    sends one chunk per turn, not one per round it missed. -> (ids, text, the next non-token event or None)."""
    tokens, piece = payload
    while not handle.events.empty():
        event = handle.events.get_nowait()
        if event[0] != "tokens":
            return tokens, piece, event
        more, text = event[1]
        tokens = tokens + more
        piece = None if piece is None or text is None else piece + text
    return tokens, piece, None


class _Stream(StreamingResponse):
    """Server-sent events that call ``on_close`` however the response ends. The generator's own ``finally`` is
    not enough: a client that disconnects before the first chunk gets the generator cancelled before it ever
    started, and an unstarted generator runs no ``finally``."""

    def __init__(self, events, on_close):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def warm_request_path(served: ServedModel) -> None:
    """Run, before the port opens, the HTTP side of one chat and one completion request without the engine: what
    the first requests would otherwise pay on the event loop, each once per process (jinja2's import and the chat
    template's compile, the parser, the tokenizer, the detokenizer, a chunk's JSON). Without it the first wave of
    requests after startup waited ~250 ms for its first token where the next wave waited ~40 (16 streams on the
    CPU's sleeping model; the same on an H200: benchmarks/results/serve_http_engine_process.md). Nothing reaches
    the engine or the metrics."""
    for body, chat in (({"messages": [{"role": "user", "content": "Hello"}], "stream": True}, True),
                       ({"prompt": "Hello", "stream": True}, False)):
        try:
            params = parse_completion({"model": served.name, "max_tokens": 2, **body}, chat=chat,
                                      model_name=served.name)
            prompt = _encode(params, served)
            text = IncrementalText(served.tokenizer.decode, set(), params.stop)
            _TokenChunk("warm", chat, served.name).render(text.add(prompt[-2:]), prompt[-2:])
        except Exception:      # noqa: BLE001 (e.g. a tokenizer without a chat template: its requests say so)
            continue


def build_app(engine: EngineLoop, served: ServedModel, metrics: Metrics, stream_interval_s: float = 0.0) -> FastAPI:
    """The FastAPI app: each route is one line over ``_Handlers``; ``stream_interval_s``: a stream's token chunks
    go at most this often, each carrying the tokens of the rounds since the last (0: one chunk per round)."""
    app = FastAPI(title="verispec", docs_url=None, redoc_url=None)
    h = _Handlers(engine, served, metrics, stream_interval_s)
    warm_request_path(served)

    @app.exception_handler(HTTPException)
    async def http_exception(http: HTTPRequest, exc: HTTPException):
        # routing's own answers (no such path, wrong method) in OpenAI's error JSON, counted like every error
        if exc.status_code == 404:
            message = f"no endpoint {http.method} {http.url.path}: see /v1/completions, /v1/chat/completions, " \
                      f"/v1/models, /health, /metrics"
        elif exc.status_code == 405:
            message = f"{http.url.path} does not take {http.method} (allowed: {(exc.headers or {}).get('Allow', '?')})"
        else:
            message = str(exc.detail)
        response = _error(exc.status_code, message, "invalid_request_error", metrics)
        response.headers.update(exc.headers or {})
        return response

    @app.exception_handler(Exception)
    async def unexpected(http: HTTPRequest, exc: Exception):
        # a bug in a handler: still OpenAI's JSON and counted (the ASGI server logs the traceback)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error", metrics)

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
        problem = h.engine.problem()
        if problem is None:
            return {"status": "ok"}
        return JSONResponse({"status": "unavailable", "reason": problem}, status_code=503)

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(h.metrics.render(), media_type=CONTENT_TYPE)

    return app
