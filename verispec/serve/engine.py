"""The engine thread: the only thread that touches the model and the ``Scheduler``.

HTTP handlers (on the asyncio loop) talk to it through ``EngineLoop.submit`` / ``cancel``, which put
commands in a thread-safe inbox and wake the loop. Tokens come back through each request's
``on_tokens`` callback, which runs on the engine thread and queues the ids (and the time) in the engine's outbox;
on the event loop ``Handle.receive`` detokenizes them when the handler streams (``Handle.text``) and observes
the latency metrics, while the engine thread waits for the device (below): Python on the engine thread lengthens
every round, Python on the event loop at that moment does not. The end of a request
(finished, cancelled, failed) comes the same way, last. The outbox goes to the event loop in one
``loop.call_soon_threadsafe`` (``_flush``): one wake-up of the event loop per round, not one per request per
round -- at 32 streams each call would cost a self-pipe write and a wake-up, on the thread that shares the GIL
with this one. When: in the next round, once its target pass is launched (``Scheduler.launched_hook``), or at the
end of the pass when no round follows (nothing runs) and before a step that admits requests (a prefill must not
hold back the running streams' tokens). Woken right after a round, the event loop's Python (a chunk per stream:
HTTP framing, JSON) would compete for the GIL with the next round's launches and delay the device's work; woken
once the pass is launched, it runs while the engine waits for the device with the GIL released. A step that admits requests also flushes once its prefill has delivered their first tokens
(``Scheduler.admitted_hook``), before the round drafts: a new request's first token does not wait for the drafting.

    handler                          engine thread
    submit(request) -> Future  --->  scheduler.submit (ValueError / QueueFull set on the Future)
    await tokens / end         <---  step(): on_tokens(kept) ... end(sequence)
    cancel(request_id)         --->  scheduler.cancel (a running request ends at the next step)

Supervision. Each pass of the loop (commands, one step, the ends) runs under a guard. An exception that
escapes it means the scheduler's state can no longer be trusted: the requests in flight fail with the
reason (HTTP 500; logged with its traceback), the requests still waiting keep their place in a fresh
scheduler, and the loop goes on (``_recover``). If it cannot go on (no fresh scheduler can be built, or the
guard itself breaks) the engine is dead (``_die``): every request in flight fails, later ones get 503,
``/health`` turns 503 and ``on_fatal`` tells the server to exit non-zero so that a supervisor restarts it.
Handlers never wait unboundedly: they wait in slices and between two ask ``unresponsive()`` (dead, or stuck
in one step for more than ``stall_s``) and whether the engine still knows their request (``lost``).
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..engine import Request, Scheduler, Sequence
from .metrics import Metrics
from .text import IncrementalText

log = logging.getLogger(__name__)


class EngineUnavailable(RuntimeError):
    """The engine takes no requests: the server is shutting down, or the engine is dead (HTTP 503)."""


@dataclass
class Handle:
    """A submitted request as its handler sees it: events arrive on ``events`` (an asyncio.Queue)."""

    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    sequence: Sequence | None = None
    done: bool = False              # set by the engine thread just before it sends the end
    disconnected: bool = False      # the client went away (set by its handler)
    text: IncrementalText | None = None     # streaming: each chunk's text, made on the event loop (``receive``)
    metrics: Metrics | None = None          # TTFT and inter-token latency are observed as chunks arrive
    last_chunk_at: float | None = None      # perf_counter of the last chunk (None: no token yet)
    outbox: list | None = None              # the engine's outbox once submitted (events wait there for _flush)

    def push(self, event: tuple) -> None:
        """From the engine thread: ("emitted", ([ids], perf_counter when emitted)) or ("end", Sequence)."""
        if self.outbox is not None:
            self.outbox.append((self, event))
        else:
            _deliver_soon(self.loop, [(self, event)])

    def on_tokens(self, request: Request, tokens: list[int]) -> None:
        """The request's ``on_tokens`` (engine thread): only the ids and the time; their text and metrics are made
        by ``receive`` on the event loop, while the engine waits for the device (module docstring)."""
        self.push(("emitted", (tokens, time.perf_counter())))

    def receive(self, event: tuple) -> None:
        """On the event loop: the engine's ``event`` into ``events``, an "emitted" one as ("tokens", ([ids], text
        or None)) once its text is made (streaming) and its TTFT / inter-token latency observed at the time it was
        emitted. Text or metrics that fail end the handler's wait with ("lost", reason) (its handler then cancels
        the request), never another request's delivery."""
        if event[0] == "emitted":
            tokens, at = event[1]
            try:
                if self.metrics is not None:
                    self.last_chunk_at = self.metrics.tokens(self.request, self.last_chunk_at, len(tokens), at)
                event = ("tokens", (tokens, self.text.add(tokens) if self.text is not None else None))
            except Exception as e:  # noqa: BLE001 - this request's text failed; the others' go on
                log.exception("request %s: its chunk could not be made", self.request.id)
                event = ("lost", f"the server could not make this request's chunk: {type(e).__name__}: {e}")
        self.events.put_nowait(event)


def _deliver(items: list) -> None:
    """On the event loop: each (handle, event) to its handle (``Handle.receive``), in order."""
    for handle, event in items:
        handle.receive(event)


def _deliver_soon(loop: asyncio.AbstractEventLoop, items: list) -> None:
    """Hand ``items`` to ``loop`` (thread-safe). A closed event loop (the server has gone) has no one left to tell."""
    try:
        loop.call_soon_threadsafe(_deliver, items)
    except RuntimeError:
        pass


class EngineStatus:
    """What handlers ask of an engine, from its ``stopping``, ``fatal``, ``handles`` and ``unresponsive()``: shared by
    the engine thread (``EngineLoop``) and the engine in its own process (``engine_process.EngineProcess``)."""

    def problem(self) -> str | None:
        """Why the engine takes no new request now (None while it does)."""
        if self.stopping and self.fatal is None:
            return "the server is shutting down"
        return self.unresponsive()

    @property
    def alive(self) -> bool:
        return self.problem() is None

    def lost(self, handle: Handle) -> bool:
        """The engine holds no end for ``handle``: not sent (``done``), and the request is not among those it
        serves (a bug; the handler must not wait for an end that will never come). The engine registers a
        request before it answers the submission, so a handler that has its Sequence asks safely."""
        return not handle.done and handle.request.id not in self.handles


class EngineLoop(EngineStatus):
    """Owns ``make_scheduler()``'s scheduler on a background thread; see the module docstring.

    ``stall_s``: a step running longer than this makes the engine unresponsive (handlers give up with 500,
    ``/health`` says 503) -- far above any real step (a round is milliseconds, an admission seconds).
    ``on_fatal(reason)``: called once, from the engine thread, when the engine dies.
    """

    def __init__(self, make_scheduler: Callable[[], Scheduler], metrics: Metrics, idle_wait_s: float = 0.5,
                 stall_s: float = 300.0, on_fatal: Callable[[str], None] | None = None):
        self.make_scheduler = make_scheduler
        self.scheduler = self._new_scheduler()
        self.metrics = metrics
        self.idle_wait_s = idle_wait_s
        self.stall_s = stall_s
        self.on_fatal = on_fatal
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.handles: dict[int, Handle] = {}          # written by the engine thread only
        self.outbox: list = []                         # (handle, event) pushed during this pass (engine thread)
        self.stopping = False
        self.fatal: str | None = None                  # why the engine died (None while it lives)
        # one record per step when a list (``VERISPEC_STEP_TRACE``, serve/server.py): (start s, seconds, rows
        # before, waiting before, rows after, the widest k of its round); engine thread only
        self.trace: list[tuple] | None = None
        self.step_started: float | None = None        # monotonic start of the step now running
        self.failures = 0                              # passes of the loop that raised and were recovered
        self.thread = threading.Thread(target=self._run, name="verispec-engine", daemon=True)

    def _new_scheduler(self) -> Scheduler:
        scheduler = self.make_scheduler()
        scheduler.launched_hook = self._flush
        scheduler.admitted_hook = self._flush
        return scheduler

    # ------------------------------------------------------------------ from any thread
    def start(self) -> None:
        self.thread.start()

    def unresponsive(self) -> str | None:
        """Why the engine can no longer answer the requests it holds (None while it can): it died, its thread
        is gone, or one step has run for more than ``stall_s``."""
        if self.fatal is not None:
            return f"the engine stopped: {self.fatal}"
        if not self.thread.is_alive():
            return "the engine thread is not running"
        started = self.step_started
        if started is not None and time.monotonic() - started > self.stall_s:
            return f"the engine has been stuck in one step for {time.monotonic() - started:.0f} s"
        return None

    def submit(self, handle: Handle) -> Future:
        """Queue ``handle.request``; the Future resolves to its Sequence or raises ValueError / QueueFull /
        EngineUnavailable."""
        fut: Future = Future()
        problem = self.problem()
        if problem is not None:
            fut.set_exception(EngineUnavailable(problem))
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
        try:
            with torch.no_grad():
                while self._pass():
                    if not self.scheduler.running:      # no round follows to carry the outbox (launched_hook)
                        self._flush()
            if self.fatal is None:
                self._cancel_all()
        except BaseException as e:  # noqa: BLE001 - the guard itself broke: nothing can be trusted any more
            self._die(f"{type(e).__name__}: {e}", e)
        finally:
            self._flush()

    def _flush(self) -> None:
        """Send the pass's events to their event loops: one call per loop (the server has one)."""
        items, self.outbox[:] = list(self.outbox), []
        by_loop: dict = {}
        for handle, event in items:
            by_loop.setdefault(handle.loop, []).append((handle, event))
        for loop, mine in by_loop.items():
            _deliver_soon(loop, mine)

    def _pass(self) -> bool:
        """One pass of the loop under the guard; False once told to stop (or dead)."""
        try:
            if not self._drain_inbox():
                return False
            if self.scheduler.idle:
                self.metrics.set_load(0, 0)
                self.wake.wait(self.idle_wait_s)
                self.wake.clear()
                return True
            if self.scheduler.waiting and len(self.scheduler.running) < self.scheduler.config.max_batch_size:
                self._flush()                            # an admission comes first: its prefill takes a while
            self._step()
        except Exception as e:  # noqa: BLE001 - the engine must outlive any request
            self.step_started = None
            return self._recover(e)
        return True

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
        handle.outbox = self.outbox
        fut.set_result(handle.sequence)

    def _cancel(self, request_id: int) -> None:
        handle = self.handles.get(request_id)
        if handle is None or not self.scheduler.cancel(request_id):
            return
        if handle.sequence not in self.scheduler.running:    # it was waiting: no step will retire it
            self._end(handle)

    def _end(self, handle: Handle) -> None:
        handle.done = True                                  # before the pop: ``lost`` must never see neither
        self.handles.pop(handle.request.id, None)
        try:
            self.metrics.finished(handle.sequence)
        except Exception:  # noqa: BLE001 - a metrics bug must not keep a request from its end
            log.exception("metrics failed for request %s", handle.request.id)
        handle.push(("end", handle.sequence))

    def _step(self) -> None:
        t0 = time.perf_counter()
        self.step_started = time.monotonic()
        rounds_before = self.scheduler.totals.rounds
        rows, waiting = len(self.scheduler.running), len(self.scheduler.waiting)
        ended = self.scheduler.step()
        self.step_started = None
        if self.scheduler.totals.rounds != rounds_before:
            self.metrics.round(time.perf_counter() - t0)
        if self.trace is not None:
            k = max((seq.stats.num_draft_last for seq in self.scheduler.running), default=0)
            self.trace.append((t0, time.perf_counter() - t0, rows, waiting, len(self.scheduler.running), k))
        for seq in ended:
            handle = self.handles.get(seq.request.id)
            if handle is not None:
                self._end(handle)
        self.metrics.set_load(len(self.scheduler.running), len(self.scheduler.waiting))

    def _recover(self, error: Exception) -> bool:
        """An exception escaped a pass: the scheduler's state can no longer be trusted. Requests in flight (running,
        or caught between the queue and the batch) that had not ended fail with the reason; requests still waiting
        keep their place, in order, in a fresh scheduler; ended ones get their end. False if no fresh scheduler can
        be built: the engine is dead."""
        reason = f"{type(error).__name__}: {error}"
        self.failures += 1
        log.error("the engine failed (%s); failing the requests in flight and going on", reason, exc_info=error)
        waiting = list(self.scheduler.waiting)
        try:
            self.scheduler = self._new_scheduler()
        except Exception as e:  # noqa: BLE001 - no scheduler, no engine
            self._die(f"{reason}; then no fresh scheduler could be built: {type(e).__name__}: {e}", e)
            return False
        self.scheduler.waiting.extend(waiting)
        queued = {seq.request.id for seq in waiting}
        for handle in list(self.handles.values()):
            if handle.request.id in queued:
                continue
            seq = handle.sequence
            if seq.finish_reason is None:
                seq.finish_reason, seq.error = "error", f"the engine failed: {reason}"
            self._end(handle)
        self.metrics.set_load(0, len(waiting))
        return True

    def _die(self, reason: str, error: BaseException | None = None) -> None:
        """The engine cannot go on: fail every request it holds or is handed, and tell the server."""
        self.fatal = reason
        log.critical("the engine is dead: %s", reason, exc_info=error)
        for handle in list(self.handles.values()):
            try:
                if handle.sequence.finish_reason is None:
                    handle.sequence.finish_reason, handle.sequence.error = "error", f"the engine stopped: {reason}"
                self._end(handle)
            except Exception:  # noqa: BLE001 - keep ending the others
                log.exception("could not end request %s", handle.request.id)
        self._refuse_queued(f"the engine stopped: {reason}")
        if self.on_fatal is not None:
            try:
                self.on_fatal(reason)
            except Exception:  # noqa: BLE001
                log.exception("on_fatal failed")

    def _refuse_queued(self, message: str) -> None:
        while True:                       # submissions that raced the stop (or the death)
            try:
                kind, what, fut = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                fut.set_exception(EngineUnavailable(message))

    def _cancel_all(self) -> None:
        for handle in list(self.handles.values()):
            if handle.sequence.finish_reason is None:
                handle.sequence.finish_reason = "cancelled"
            self._end(handle)
        self._refuse_queued("the server is shutting down")
