"""`verispec serve`'s own server code over the fake model (tests/fakes.py): real HTTP on 127.0.0.1, a model that
costs next to nothing, so that serving tests (faults, cancellation, soak) stay fast.

In-process: ``running(...)`` starts uvicorn on a thread and yields a ``Served`` (base URL, engine, model).
As a process: ``python tests/fake_server.py --port N [verispec serve options] [--pass-s S] [--die-at-step S]``
(drafters: ``--draft-lookup``, ``--draft-self L``)
runs ``verispec.serve.server.serve`` as ``verispec serve`` does; ``--die-at-step S``: the S-th step raises and
no fresh scheduler can be built, so the engine dies (the process must exit 1). ``--engine-process``: the fake model
and its engine in a child process (``load`` runs there, and injects ``--die-at-step`` there); ``--fail-load
MESSAGE``: ``load`` raises ValueError(MESSAGE).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakes import FakeModel  # noqa: E402

NAME = "fake"


class PacedFake(FakeModel):
    """The fake model with a floor on each target pass (``pass_s`` seconds): long requests take a known time."""

    pass_s = 0.0

    def append(self, tokens):
        if self.pass_s:
            time.sleep(self.pass_s)
        return super().append(tokens)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_args(argv: list[str]):
    from verispec.serve.cli import add_arguments, check_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parser.add_argument("--pass-s", type=float, default=0.0)
    parser.add_argument("--die-at-step", type=int, default=None)
    parser.add_argument("--fail-load", default=None, help="load() raises ValueError(this): a failed startup")
    args = parser.parse_args(["--served-model-name", NAME, "--device", "cpu", *argv])
    check_args(args)
    return args


def load(args, eos_bias: float = -30.0):
    """(target, drafter): the fake model and the drafter ``args`` name (``--engine-process``: run in the child)."""
    from verispec.drafters import PromptLookup, SelfSpeculative

    if args.fail_load:
        raise ValueError(args.fail_load)
    if args.engine_process and args.die_at_step is not None:
        _die_at_step(args.die_at_step)
    target = PacedFake(seed=0, eos_bias=eos_bias)
    target.pass_s = args.pass_s
    drafter = None
    if args.draft_lookup:
        drafter = PromptLookup(max_ngram=3, min_ngram=1)
    elif args.draft_self is not None:
        drafter = SelfSpeculative(layers=args.draft_self)      # the fake model's first layers
    if drafter is not None:
        drafter.attach(target)
    return target, drafter


def _die_at_step(n: int) -> None:
    """In this process (the engine process, where ``load`` runs): the n-th step of any Scheduler raises, and no
    Scheduler can be built after it, so the engine dies (as ``main`` injects it into an engine thread)."""
    from verispec.engine import Scheduler

    step, init, steps = Scheduler.step, Scheduler.__init__, [0]

    def dying_step(self):
        steps[0] += 1
        if steps[0] == n:
            raise RuntimeError("injected: the device fell off the bus")
        return step(self)

    def no_scheduler(self, *args, **kwargs):
        if steps[0] >= n:
            raise RuntimeError("injected: the device is gone")
        init(self, *args, **kwargs)

    Scheduler.step, Scheduler.__init__ = dying_step, no_scheduler


def build(argv: list[str], eos_bias: float = -30.0):
    """(engine, app, target) of a fake-model server with ``verispec serve`` options ``argv`` (with
    ``--engine-process``: the engine's proxy, and no target here: the child has it)."""
    from verispec.serve.server import assemble

    args = serve_args(argv)
    if args.engine_process:
        from verispec.serve.engine_process import assemble_process

        assert eos_bias == -30.0, "--engine-process: the child loads the fake with load()'s default eos_bias"
        engine, app = assemble_process(load, args)
        return engine, app, None, args
    target, drafter = load(args, eos_bias)
    engine, app = assemble(target, drafter, args)
    return engine, app, target, args


@dataclass
class Served:
    base: str              # http://127.0.0.1:PORT
    engine: object         # the EngineLoop
    target: PacedFake


@contextlib.contextmanager
def running(argv: list[str], eos_bias: float = -30.0):
    """A fake-model server in this process (uvicorn on a thread, port chosen free), stopped on exit."""
    import uvicorn

    port = free_port()
    engine, app, target, _ = build([*argv, "--port", str(port)], eos_bias)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    engine.start()
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start in 30 s"
        time.sleep(0.02)
    try:
        yield Served(f"http://127.0.0.1:{port}", engine, target)
    finally:
        server.should_exit = True
        engine.stop()
        thread.join(30)
        engine.join(30)


def main() -> int:
    from verispec.serve import server as serve_module

    args = serve_args(sys.argv[1:])
    engine, app, _, _ = build(sys.argv[1:])
    if args.die_at_step is not None and not args.engine_process:    # (with it, load() injects into the child)
        sched, steps = engine.scheduler, [0]
        step = sched.step

        def dying_step():
            steps[0] += 1
            if steps[0] == args.die_at_step:
                raise RuntimeError("injected: the device fell off the bus")
            return step()

        def no_scheduler():
            raise RuntimeError("injected: the device is gone")

        sched.step = dying_step
        engine.make_scheduler = no_scheduler
    return serve_module.serve(engine, app, args)


def call(base: str, path: str, body=None, method=None, timeout=30) -> tuple[int, dict]:
    """(status, JSON body) of one request to a server on 127.0.0.1: POST with a body, else GET (or ``method``)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if body is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def completion(prompt, max_tokens, **kw) -> dict:
    """A greedy /v1/completions body for the fake model."""
    return {"model": NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **kw}


def until(predicate, timeout_s, what):
    """Poll ``predicate`` every 20 ms; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())


def metrics(base: str) -> dict[str, float]:
    """The server's /metrics as {'name{label="v",...}': value}, parsed with prometheus-client's own parser (labels
    sorted, the ``model`` label left out; histograms give their _bucket/_sum/_count samples)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "model"}
            key = s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
            out[key] = out.get(key, 0.0) + s.value
    return out
