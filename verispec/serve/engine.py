"""The engine thread: the only thread that touches the model and the ``Scheduler``.

HTTP handlers (on the asyncio loop) talk to it through ``EngineLoop.submit`` / ``cancel``, which put
commands in a thread-safe inbox and wake the loop. Tokens come back through each request's
``on_tokens`` callback, which runs on the engine thread, detokenizes them there when the handler streams
(``Handle.text``: the event loop never decodes) and hands both to the handler's asyncio queue with
``loop.call_soon_threadsafe``; the end of a request (finished, cancelled, failed) comes the same way, last.

    handler                          engine thread
    submit(request) -> Future  --->  scheduler.submit (ValueError / QueueFull set on the Future)
    await tokens / end         <---  step(): on_tokens(kept) ... end(sequence)
    cancel(request_id)         --->  scheduler.cancel (a running request ends at the next step)
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..engine import Request, Scheduler, Sequence
from .metrics import Metrics
from .text import IncrementalText


@dataclass
class Handle:
    """A submitted request as its handler sees it: events arrive on ``events`` (an asyncio.Queue)."""

    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    sequence: Sequence | None = None
    done: bool = False
    text: IncrementalText | None = None     # streaming: each chunk's text, made on the engine thread
    metrics: Metrics | None = None          # TTFT and inter-token latency are observed as chunks arrive
    last_chunk_at: float | None = None      # perf_counter of the last chunk (None: no token yet)

    def push(self, event: tuple) -> None:
        """From the engine thread: ("tokens", ([ids], text or None)) or ("end", Sequence)."""
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def on_tokens(self, request: Request, tokens: list[int]) -> None:
        """The request's ``on_tokens`` (engine thread)."""
        if self.metrics is not None:
            self.last_chunk_at = self.metrics.tokens(request, self.last_chunk_at, len(tokens))
        self.push(("tokens", (tokens, self.text.add(tokens) if self.text is not None else None)))


class EngineLoop:
    """Owns ``make_scheduler()``'s scheduler on a background thread; see the module docstring."""

    def __init__(self, make_scheduler: Callable[[], Scheduler], metrics: Metrics, idle_wait_s: float = 0.5):
        self.make_scheduler = make_scheduler
        self.scheduler = make_scheduler()
        self.metrics = metrics
        self.idle_wait_s = idle_wait_s
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.handles: dict[int, Handle] = {}          # engine thread only
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="verispec-engine", daemon=True)

    # ------------------------------------------------------------------ from any thread
    def start(self) -> None:
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self.stopping

    def submit(self, handle: Handle) -> Future:
        """Queue ``handle.request``; the Future resolves to its Sequence or raises ValueError / QueueFull."""
        fut: Future = Future()
        if self.stopping:
            fut.set_exception(RuntimeError("the server is shutting down"))
            return fut
        handle.request.on_tokens, handle.metrics = handle.on_tokens, self.metrics
        self.inbox.put(("submit", handle, fut))
        self.wake.set()
        return fut

    def cancel(self, request_id: int) -> None:
        self.inbox.put(("cancel", request_id, None))
        self.wake.set()

    def stop(self) -> None:
        """Stop accepting and cancel everything in flight (their handlers get their end); does not wait."""
        self.stopping = True
        self.inbox.put(("stop", None, None))
        self.wake.set()

    def join(self, timeout: float = 30.0) -> None:
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        with torch.no_grad():
            while True:
                if not self._drain_inbox():
                    break
                if self.scheduler.idle:
                    self.metrics.set_load(0, 0)
                    self.wake.wait(self.idle_wait_s)
                    self.wake.clear()
                    continue
                self._step()
        self._cancel_all()

    def _drain_inbox(self) -> bool:
        """Apply queued commands; False once told to stop."""
        while True:
            try:
                kind, what, fut = self.inbox.get_nowait()
            except queue.Empty:
                return True
            if kind == "stop":
                return False
            if kind == "submit":
                self._submit(what, fut)
            elif kind == "cancel":
                self._cancel(what)

    def _submit(self, handle: Handle, fut: Future) -> None:
        try:
            handle.sequence = self.scheduler.submit(handle.request)
        except Exception as e:  # noqa: BLE001 - ValueError / QueueFull go back to the handler as they are
            fut.set_exception(e)
            return
        self.handles[handle.request.id] = handle
        fut.set_result(handle.sequence)

    def _cancel(self, request_id: int) -> None:
        handle = self.handles.get(request_id)
        if handle is None or not self.scheduler.cancel(request_id):
            return
        if handle.sequence not in self.scheduler.running:    # it was waiting: no step will retire it
            self._end(handle)

    def _end(self, handle: Handle) -> None:
        self.handles.pop(handle.request.id, None)
        handle.done = True
        self.metrics.finished(handle.sequence)
        handle.push(("end", handle.sequence))

    def _step(self) -> None:
        t0 = time.perf_counter()
        rounds_before = self.scheduler.totals.rounds
        try:
            ended = self.scheduler.step()
        except Exception as e:  # noqa: BLE001 - the engine must outlive any request
            self._recover(e)
            return
        if self.scheduler.totals.rounds != rounds_before:
            self.metrics.round(time.perf_counter() - t0)
        for seq in ended:
            handle = self.handles.get(seq.request.id)
            if handle is not None:
                self._end(handle)
        self.metrics.set_load(len(self.scheduler.running), len(self.scheduler.waiting))

    def _recover(self, error: Exception) -> None:
        """A step raised outside a round (the round itself fails its rows): the batch state can no longer be
        trusted, so every request in flight fails with the error and the scheduler starts afresh."""
        message = f"{type(error).__name__}: {error}"
        traceback.print_exc()
        for handle in list(self.handles.values()):
            seq = handle.sequence
            if seq.finish_reason != "cancelled":
                seq.finish_reason, seq.error = "error", message
            self._end(handle)
        self.scheduler = self.make_scheduler()

    def _cancel_all(self) -> None:
        for handle in list(self.handles.values()):
            if handle.sequence.finish_reason is None:
                handle.sequence.finish_reason = "cancelled"
            self._end(handle)
        while True:                       # submissions that raced the stop
            try:
                kind, what, fut = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                fut.set_exception(RuntimeError("the server is shutting down"))
