"""``verispec serve --engine-process``: the engine (model, ``Scheduler``, ``EngineLoop``) in a child process.

Why: in one process the event loop's Python (HTTP, SSE chunks, JSON) and the engine thread's Python (the
launches of each round's device work) share one GIL; every millisecond the engine thread waits for it is a
millisecond the device idles. Here the child process runs the same ``EngineLoop`` (engine.py) with the GIL to
itself; the HTTP process keeps the app, tokenization, detokenization and the metrics, and talks to the child
through ``EngineProcess``, a proxy with ``EngineLoop``'s interface (``submit``, ``cancel``, ``stop``, ``join``,
``unresponsive``, ``problem``, ``lost``, ``fatal``, ``on_fatal``) so that app.py serves either unchanged.

    HTTP process                                   engine process (multiprocessing "spawn")
    EngineProcess.submit(handle) -> Future  --->   ("submit", Request)   EngineLoop.submit
                  Future resolved           <---   ("submitted", id, None | (kind, message))
    EngineProcess.cancel(id) / stop()       --->   ("cancel", id) / ("stop",)
    reader thread: Handle events            <---   ("events", [(id, event)], round seconds, load): one message
                                                   per ``EngineLoop._flush`` (once per round, as in one process)
                   /health's problem        <---   ("problem", reason | None) when the child's own
                                                   ``unresponsive()`` changes (a stuck step)

An "end" carries the child's Sequence's outcome (tokens, finish reason, error, stop cut, stats); the HTTP process
keeps its own ``Sequence`` per request and fills it in. Timestamps (``perf_counter``) cross the process boundary:
on Linux it is CLOCK_MONOTONIC, one clock for every process.

Faults. The pipe closes when the child dies (the HTTP process holds no copy of the child's end): the reader
thread then fails every request in flight (500), refuses those being submitted (503), ``/health`` turns 503 and
``on_fatal`` tells the server to exit non-zero, as ``EngineLoop._die`` does. A child whose own engine dies says so
("fatal") and exits 1. The child ignores SIGINT (a terminal's Ctrl-C reaches the whole process group): the HTTP
process stops it through the pipe, and it stops itself when the pipe closes (the HTTP process died). Startup
waits for the child's warm-up while the child lives; a failure there is one line (``EngineStartFailed``).
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import Future
from typing import Callable

from ..engine import QueueFull, Sequence, Stats
from .engine import EngineLoop, EngineStatus, EngineUnavailable, Handle, _deliver_soon

log = logging.getLogger(__name__)

READY_POLL_S = 0.5          # how often the startup wait and the child's command loop look at the other side
STOP_WAIT_S = 30.0          # how long ``join`` waits for the child to stop before it is killed


class EngineStartFailed(ValueError):
    """The engine process could not load the model or warm up (the message is one line: why)."""


# ---------------------------------------------------------------------------------------------------- HTTP side
class EngineProcess(EngineStatus):
    """The HTTP process's proxy of an ``EngineLoop`` running in a child process (module docstring).

    ``load(args) -> (target, drafter)``: a module-level function (it is pickled to the child), run there.
    The constructor starts the child and waits for its warm-up; ``served_info`` is then what the child reported
    (``vocab_size``, ``lookahead``, ``tokenizer``). ``start()`` starts reading its events."""

    def __init__(self, load: Callable, args, metrics, stall_s: float = 300.0):
        self.metrics = metrics
        self.on_fatal: Callable[[str], None] | None = None
        self.fatal: str | None = None                # why the engine died (None while it lives)
        self.stopping = False
        self.child_problem: str | None = None        # the child's own ``unresponsive()`` (a stuck step)
        self.handles: dict[int, Handle] = {}         # submitted and not ended; written by the reader thread
        self.pending: dict[int, tuple[Handle, Future]] = {}   # sent, not yet answered
        self.lock = threading.Lock()                 # guards pending / handles against the death's sweep
        self.send_lock = threading.Lock()
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_child_main, args=(load, args, child_conn, stall_s),
                                   name="verispec-engine", daemon=True)
        self.process.start()
        child_conn.close()          # only the child holds its end: the pipe closes when the child dies
        try:
            self.served_info = self._wait_ready()
        except BaseException:
            self._kill()
            raise
        self.reader = threading.Thread(target=self._read, name="verispec-engine-reader", daemon=True)

    def _wait_ready(self) -> dict:
        while True:
            if self.conn.poll(READY_POLL_S):
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    message = None
                if message is None:
                    self.process.join(5)
                    raise EngineStartFailed(f"the engine process exited during startup ({_exit(self.process)}); "
                                            f"its log is above")
                if message[0] == "ready":
                    return message[1]
                if message[0] == "failed":
                    raise EngineStartFailed(message[1])
            elif not self.process.is_alive():
                raise EngineStartFailed(f"the engine process exited during startup ({_exit(self.process)}); "
                                        f"its log is above")

    def _kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)

    # ------------------------------------------------------------------ EngineLoop's interface (any thread)
    def start(self) -> None:
        self.reader.start()

    def unresponsive(self) -> str | None:
        if self.fatal is not None:
            return f"the engine stopped: {self.fatal}"
        if not self.process.is_alive():
            return f"the engine process is gone ({_exit(self.process)})"
        if self.reader.ident is not None and not self.reader.is_alive():
            return "the engine process's reader thread is not running"
        return self.child_problem

    def submit(self, handle: Handle) -> Future:
        """As ``EngineLoop.submit``: the Future resolves to the request's Sequence (this process's) or raises
        ValueError / QueueFull / EngineUnavailable."""
        fut: Future = Future()
        problem = self.problem()
        if problem is not None:
            fut.set_exception(EngineUnavailable(problem))
            return fut
        handle.metrics = self.metrics
        request = handle.request
        with self.lock:
            if self.fatal is not None:
                fut.set_exception(EngineUnavailable(f"the engine stopped: {self.fatal}"))
                return fut
            self.pending[request.id] = (handle, fut)
        # the child gets the request without its callback (a callable of this process); its id and arrival time go
        # with it: the events name the request by id, and the child's queue time counts from the arrival here
        if not self._send(("submit", dataclasses.replace(request, on_tokens=None))):
            with self.lock:         # whoever takes it out of ``pending`` answers it (here, or the death's sweep)
                mine = self.pending.pop(request.id, None) is not None
            if mine:
                fut.set_exception(EngineUnavailable("the engine process is gone"))
        return fut

    def cancel(self, request_id: int) -> None:
        self._send(("cancel", request_id))

    def stop(self) -> None:
        """Stop accepting; the child cancels everything in flight (their handlers get their end) and exits."""
        self.stopping = True
        self._send(("stop",))

    def join(self, timeout: float = STOP_WAIT_S) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            log.error("the engine process did not stop in %.0f s: killing it", timeout)
            self._kill()
        if self.reader.ident is not None and threading.current_thread() is not self.reader:
            self.reader.join(5)

    def _send(self, message: tuple) -> bool:
        try:
            with self.send_lock:
                self.conn.send(message)
            return True
        except (OSError, ValueError):     # the child is gone (its death is the reader's to report)
            return False

    # ------------------------------------------------------------------ reader thread
    def _read(self) -> None:
        try:
            while True:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    break
                kind = message[0]
                if kind == "events":
                    self._events(*message[1:])
                elif kind == "submitted":
                    self._submitted(*message[1:])
                elif kind == "problem":
                    self.child_problem = message[1]
                elif kind == "fatal":
                    self._die(message[1])
                    return
                elif kind == "stopped":
                    break
            if self.stopping:
                self._stopped()
            else:
                self.process.join(5)
                self._die(f"the engine process exited ({_exit(self.process)})")
        except BaseException as e:  # noqa: BLE001 - a broken reader is a dead engine: nothing else delivers
            log.exception("the engine process's reader failed")
            self._die(f"the engine process's reader failed: {type(e).__name__}: {e}")

    def _submitted(self, request_id: int, error) -> None:
        with self.lock:
            handle, fut = self.pending.pop(request_id, (None, None))
            if handle is None:
                return
            if error is None:
                handle.sequence = Sequence(handle.request, Stats())
                self.handles[request_id] = handle
        if error is None:
            fut.set_result(handle.sequence)
        else:
            kind, message = error
            fut.set_exception({"QueueFull": QueueFull, "ValueError": ValueError}.get(kind, EngineUnavailable)(message))

    def _events(self, events: list, round_s: list[float], load: tuple | None) -> None:
        items = []
        for request_id, event in events:
            handle = self.handles.get(request_id)
            if handle is None:
                continue
            if event[0] == "end":
                self._finish(handle, event[1])
                items.append((handle, ("end", handle.sequence)))
            else:
                items.append((handle, event))
        for seconds in round_s:
            self.metrics.round(seconds)
        if load is not None:
            self.metrics.set_load(*load)
        self._deliver(items)

    def _finish(self, handle: Handle, outcome: dict) -> None:
        """The request's end: its Sequence filled in with the child's outcome, its metrics, then ``done``."""
        seq = handle.sequence
        seq.generated, seq.finish_reason, seq.error = outcome["generated"], outcome["finish_reason"], outcome["error"]
        seq.text_cut, seq.stats = outcome["text_cut"], outcome["stats"]
        self._retire(handle)

    def _retire(self, handle: Handle) -> None:
        handle.done = True                               # before the pop: ``lost`` must never see neither
        with self.lock:
            self.handles.pop(handle.request.id, None)
        try:
            self.metrics.finished(handle.sequence)
        except Exception:  # noqa: BLE001 - a metrics bug must not keep a request from its end
            log.exception("metrics failed for request %s", handle.request.id)

    @staticmethod
    def _deliver(items: list) -> None:
        by_loop: dict = {}
        for handle, event in items:
            by_loop.setdefault(handle.loop, []).append((handle, event))
        for loop, mine in by_loop.items():
            _deliver_soon(loop, mine)

    def _stopped(self) -> None:
        """The child stopped as told: it ended the requests it held; submissions it never read are refused."""
        with self.lock:
            handles, pending = list(self.handles.values()), list(self.pending.values())
            self.pending.clear()
        items = []
        for handle in handles:
            if handle.sequence.finish_reason is None:
                handle.sequence.finish_reason = "cancelled"
            self._retire(handle)
            items.append((handle, ("end", handle.sequence)))
        self._deliver(items)
        for _, fut in pending:
            if not fut.done():
                fut.set_exception(EngineUnavailable("the server is shutting down"))

    def _die(self, reason: str) -> None:
        """The engine is gone: fail every request in flight, refuse those being submitted, tell the server."""
        with self.lock:
            if self.fatal is not None:
                return
            self.fatal = reason
            handles, pending = list(self.handles.values()), list(self.pending.values())
            self.pending.clear()
        log.critical("the engine is dead: %s", reason)
        items = []
        for handle in handles:
            seq = handle.sequence
            if seq.finish_reason is None:
                seq.finish_reason, seq.error = "error", f"the engine stopped: {reason}"
            self._retire(handle)
            items.append((handle, ("end", seq)))
        self._deliver(items)
        for _, fut in pending:
            if not fut.done():
                fut.set_exception(EngineUnavailable(f"the engine stopped: {reason}"))
        if self.on_fatal is not None:
            try:
                self.on_fatal(reason)
            except Exception:  # noqa: BLE001
                log.exception("on_fatal failed")


def _exit(process) -> str:
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def assemble_process(load: Callable, args):
    """(the ``EngineProcess``, started child and warmed up; the app over it), the ``--engine-process`` form of
    ``server.assemble``. ``load(args) -> (target, drafter)`` runs in the child."""
    from .app import ServedModel, build_app
    from .cli import served_name
    from .metrics import Metrics

    name = served_name(args)
    metrics = Metrics(name)
    engine = EngineProcess(load, args, metrics)
    info = engine.served_info
    served = ServedModel(name, info["tokenizer"], info["vocab_size"], args.max_seq_len, info["lookahead"])
    return engine, build_app(engine, served, metrics, args.stream_interval / 1e3)


# ---------------------------------------------------------------------------------------------------- child side
class _ForwardedMetrics:
    """The child's stand-in for ``Metrics``: what the engine loop observes (round times, load) waits here for the
    next message to the HTTP process; a request's own metrics are the HTTP process's (``EngineProcess._finish``)."""

    def __init__(self):
        self.round_s: list[float] = []
        self.load: tuple | None = None
        self.sent_load: tuple | None = None

    def round(self, seconds: float) -> None:
        self.round_s.append(seconds)

    def set_load(self, running: int, waiting: int) -> None:
        self.load = (running, waiting)

    def finished(self, seq) -> None:
        pass

    def take(self) -> tuple[list[float], tuple | None]:
        rounds, self.round_s = self.round_s, []
        load = self.load if self.load != self.sent_load else None
        self.sent_load = self.load
        return rounds, load


class _ChildLoop(EngineLoop):
    """``EngineLoop`` whose outbox goes to the HTTP process over the pipe (one message per ``_flush``)."""

    send: Callable[[tuple], None]

    def _flush(self) -> None:
        items, self.outbox[:] = list(self.outbox), []
        rounds, load = self.metrics.take()
        if not items and not rounds and load is None:
            return
        events = []
        for handle, (kind, payload) in items:
            if kind == "end":
                seq = payload
                payload = {"generated": list(seq.generated), "finish_reason": seq.finish_reason, "error": seq.error,
                           "text_cut": seq.text_cut, "stats": seq.stats}
            events.append((handle.request.id, (kind, payload)))
        self.send(("events", events, rounds, load))


def _child_main(load: Callable, args, conn, stall_s: float) -> None:
    """The engine process: load, warm up, report ready, then apply the HTTP process's commands until told to stop
    (exit 0), the engine dies (exit 1) or the pipe closes (the HTTP process is gone: stop, exit 0)."""
    from .server import GIL_SWITCH_S, _log, build_engine, report_stop

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.setswitchinterval(GIL_SWITCH_S)     # the command loop's thread must not hold the engine thread back either
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        try:
            with send_lock:
                conn.send(message)
        except (OSError, ValueError):        # the HTTP process is gone; the command loop sees the pipe close
            pass

    try:
        if getattr(args, "threads", None):
            import torch

            torch.set_num_threads(args.threads)
        target, drafter = load(args)
        engine, served, after_warm_up = build_engine(target, drafter, args, _ForwardedMetrics(), _ChildLoop)
    except Exception as e:  # noqa: BLE001 - one line to the HTTP process, the traceback to the log
        if not isinstance(e, (ValueError, FileNotFoundError)):
            log.exception("the engine process could not start")
        send(("failed", str(e) if isinstance(e, (ValueError, FileNotFoundError)) else f"{type(e).__name__}: {e}"))
        sys.exit(2)
    engine.send = send
    engine.stall_s = stall_s
    engine.on_fatal = lambda reason: send(("fatal", reason))
    engine.start()
    send(("ready", {"vocab_size": served.vocab_size, "lookahead": served.lookahead, "tokenizer": served.tokenizer}))
    _log(f"engine process {os.getpid()}: ready")

    def answer(handle: Handle, fut: Future) -> None:
        error = fut.exception()
        send(("submitted", handle.request.id,
              None if error is None else (type(error).__name__, str(error))))

    problem = None
    while engine.fatal is None:
        now = engine.unresponsive()
        if now != problem:
            problem = now
            send(("problem", now))
        try:
            if not conn.poll(READY_POLL_S):
                continue
            message = conn.recv()
        except (EOFError, OSError):
            break
        kind = message[0]
        if kind == "submit":
            handle = Handle(message[1], None)
            engine.submit(handle).add_done_callback(lambda fut, handle=handle: answer(handle, fut))
        elif kind == "cancel":
            engine.cancel(message[1])
        elif kind == "stop":
            break
    engine.stop()
    engine.join()
    report_stop(engine, after_warm_up)
    send(("stopped",))
    conn.close()
    sys.exit(1 if engine.fatal is not None else 0)
