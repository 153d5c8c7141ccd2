"""`verispec serve --engine-process` (serve/engine_process.py): the engine in a child process, over real HTTP on
127.0.0.1. The embedded SmolLM2's chat, streamed and whole, equals plain greedy decoding (the in-thread server's
output: tests/test_serve.py checks that one against the same reference); with the fake model
(tests/fake_server.py): a client that disconnects frees its slot, and a killed engine process fails the request
in flight, turns /health 503 and makes the server exit 1, each within a bound."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import fake_server  # noqa: E402
from fake_server import call as _call, completion as _completion, until as _until  # noqa: E402
from fake_server import NAME, free_port  # noqa: E402
from fakes import FakeModel, greedy_reference  # noqa: E402
from served import start, stop  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _fake_server(*argv: str):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start([sys.executable, os.path.join(HERE, "fake_server.py"), "--port", str(port), "--engine-process",
                  *argv], base)
    return proc, base








def _running(base) -> float:
    return fake_server.metrics(base)["verispec_num_requests_running"]


def _engine_pid(server_pid: int) -> int:
    """The engine process: the server's child started by multiprocessing's spawn (not its resource tracker)."""
    pids = []
    for task in os.listdir(f"/proc/{server_pid}/task"):
        with open(f"/proc/{server_pid}/task/{task}/children") as f:
            pids += [int(p) for p in f.read().split()]
    for pid in pids:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().decode(errors="replace")
        if "spawn_main" in cmdline and "resource_tracker" not in cmdline:
            return pid
    raise AssertionError(f"no engine process among the server's children {pids}")


@pytest.fixture(scope="module")
def fake():
    """One fake-model server for the tests below (starting one costs two interpreters' imports); the last test
    kills its engine process."""
    proc, base = _fake_server("-k", "3", "--draft-lookup", "--max-batch-size", "1", "--max-seq-len", "2048",
                              "--pass-s", "0.005")
    try:
        yield proc, base
    finally:
        stop(proc)


# ------------------------------------------------------------------------------------------ exactness
def test_embedded_chat_streamed_and_whole_equals_plain_greedy():
    import torch

    from verispec.engine import generate
    from verispec.runtime import load_model
    from verispec.runtime.loading import embedded_gguf_path

    try:
        embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start([sys.executable, "-m", "verispec.cli", "serve", "--engine-process", "--draft-lookup", "-k", "4",
                   "--port", str(port), "--max-batch-size", "2", "--max-seq-len", "256", "--threads", "1",
                   "--device", "cpu"], base)
    try:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
        msg = "Repeat exactly: one two three four five six seven"
        messages = [{"role": "user", "content": msg}]
        whole = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=16,
                                               temperature=0)
        pieces, ids = [], []
        for chunk in client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=16,
                                                    temperature=0, stream=True):
            choice = chunk.choices[0]
            pieces.append(choice.delta.content or "")
            ids += getattr(choice, "token_ids", None) or []
        torch.set_num_threads(1)
        ref = generate(load_model(device="cpu", dtype=torch.float32), msg, drafter=None, max_new_tokens=16,
                       chat=True)
        assert whole.choices[0].token_ids == ref.tokens and whole.choices[0].message.content == ref.text
        assert ids == ref.tokens and "".join(pieces) == ref.text
    finally:
        stop(proc)
    assert proc.returncode == 0, proc.stdout.read()


def test_fake_model_greedy_equals_the_reference(fake):
    _, base = fake
    ref = greedy_reference(FakeModel(seed=0, eos_bias=-30.0), [1, 2, 3, 1, 2], 24)
    status, out = _call(base, "/v1/completions", _completion([1, 2, 3, 1, 2], 24))
    assert status == 200 and out["choices"][0]["token_ids"] == ref
    assert fake_server.metrics(base)['verispec_requests_total{finish_reason="length"}'] == 1


# ------------------------------------------------------------------------------------------ cancellation
def test_a_client_that_disconnects_frees_its_slot(fake):
    """One slot; a long request holds it (>= 5 ms a pass, 2000 tokens: >= 10 s / (k + 1)), a short one waits. The
    long one's client closes its socket: the engine process cancels it, so the short one starts at once."""
    _, base = fake
    body = json.dumps(_completion([1, 2, 3], 2000)).encode()
    sock = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    _until(lambda: _running(base) == 1, 10, "the long request runs")
    answer = {}
    waiter = threading.Thread(target=lambda: answer.update(r=_call(base, "/v1/completions",
                                                                   _completion([4, 5, 6], 8))), daemon=True)
    waiter.start()
    sock.close()
    waiter.join(8)
    assert not waiter.is_alive(), "the short request still waits: the long one kept its slot"
    status, out = answer["r"]
    assert status == 200 and len(out["choices"][0]["token_ids"]) == 8
    _until(lambda: fake_server.metrics(base).get('verispec_requests_total{finish_reason="cancelled"}') == 1, 5,
           "the long request is counted as cancelled")


# ------------------------------------------------------------------------------------------ faults
def _stream(base, body) -> str:
    """A streamed completion's whole SSE body."""
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def test_a_killed_engine_process_fails_the_requests_and_the_server_exits_1(fake):
    """One request runs (the one slot), a streamed one waits behind it; the engine process is killed: both end with
    the reason (500; the stream's error chunk, then [DONE]), /health says 503 while the port drains, exit 1."""
    proc, base = fake
    answer = {}
    request = threading.Thread(target=lambda: answer.update(r=_call(base, "/v1/completions",
                                                                    _completion([1, 2, 3], 2000))), daemon=True)
    request.start()
    _until(lambda: _running(base) == 1, 10, "the request runs")
    streamed = threading.Thread(target=lambda: answer.update(s=_stream(base, _completion([4, 5, 6], 8))), daemon=True)
    streamed.start()
    _until(lambda: fake_server.metrics(base)["verispec_num_requests_waiting"] == 1, 10, "the streamed request waits")
    health: list = []

    def watch_health():
        while proc.poll() is None:
            try:
                health.append(_call(base, "/health", timeout=2)[0])
            except OSError:
                pass
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_health, daemon=True)
    os.kill(_engine_pid(proc.pid), signal.SIGKILL)
    watcher.start()
    request.join(10)
    assert not request.is_alive(), "the request in flight was not failed within 10 s"
    status, err = answer["r"]
    assert status == 500 and "killed by SIGKILL" in err["error"]["message"], err
    streamed.join(10)
    assert not streamed.is_alive(), "the waiting stream was not ended within 10 s"
    events = [e[len("data: "):] for e in answer["s"].split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]" and "killed by SIGKILL" in json.loads(events[-2])["error"]["message"], events
    assert proc.wait(30) == 1
    watcher.join(5)
    assert 503 in health, health
    assert "the engine died" in proc.stdout.read()


def test_an_engine_that_dies_in_its_process_fails_the_request_and_the_server_exits_1():
    """The child's own engine dies (a pass raises, then no fresh scheduler can be built): it says why before it
    exits, and the HTTP process fails the request with that reason and exits 1."""
    proc, base = _fake_server("--pass-s", "0.002", "--die-at-step", "10")
    try:
        status, err = _call(base, "/v1/completions", _completion([1, 2, 3], 500))
        assert status == 500 and "the device fell off the bus" in err["error"]["message"], err
        assert proc.wait(30) == 1
        assert "the engine died" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_failed_start_is_one_line():
    """The child's load raises: the HTTP process gets its message as one line, and no child is left behind."""
    from verispec.serve.engine_process import EngineProcess, EngineStartFailed
    from verispec.serve.metrics import Metrics

    args = fake_server.serve_args(["--port", str(free_port()), "--fail-load", "injected: no weights at /nowhere"])
    with pytest.raises(EngineStartFailed, match=r"^injected: no weights at /nowhere$"):
        EngineProcess(fake_server.load, args, Metrics(NAME))
    assert not [p for p in multiprocessing.active_children() if p.name == "verispec-engine"]


@pytest.mark.parametrize("argv, device, expected", [
    ([], "cpu", False),                          # auto on a CPU: one process
    ([], "cuda", True),                          # auto on a GPU: the engine in its own process
    ([], "cuda:1", True),
    (["--engine-process"], "cpu", True),         # a bare flag: on
    (["--engine-process", "on"], "cpu", True),
    (["--engine-process", "off"], "cuda", False),
])
def test_engine_process_default_is_on_for_a_gpu_and_off_for_a_cpu(argv, device, expected):
    import argparse

    from verispec.serve.cli import add_arguments, check_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--device", device, *argv])
    check_args(args)
    assert args.engine_process is expected
    check_args(args)                             # a resolved value stays as it is
    assert args.engine_process is expected


def test_engine_process_with_ssd_is_off_by_default_and_refused_when_asked(capsys):
    import argparse

    from verispec.serve.cli import add_arguments, check_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    base = ["--device", "cuda", "--ssd", "--draft-self", "4", "-k", "4"]
    args = parser.parse_args(base)
    check_args(args)
    assert args.engine_process is False
    with pytest.raises(SystemExit):
        check_args(parser.parse_args([*base, "--engine-process"]))
    assert "--engine-process does not combine with --ssd" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--engine-process", "sometimes"])
