"""The server under faults, over real HTTP on 127.0.0.1, with the fake model (tests/fake_server.py): a client
that disconnects frees its slot, the engine loop survives an exception (or, when it cannot, says so and the
process exits 1), no handler waits forever, and every refusal is OpenAI's error JSON, counted."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import fake_server  # noqa: E402
from fake_server import call as _call, completion as _completion, until as _until  # noqa: E402
from fake_server import free_port, running  # noqa: E402
from fakes import FakeModel, greedy_reference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)




def _metrics(base) -> dict[str, float]:
    return fake_server.metrics(base)






def _in_background(fn, *args):
    out = {}

    def run():
        out["result"] = fn(*args)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


REF = FakeModel(seed=0, eos_bias=-30.0)   # the served fake model's twin, for references


# ------------------------------------------------------------------------------------------ cancellation
def test_a_client_that_disconnects_without_streaming_frees_its_slot():
    """One slot; a long request holds it (plain decoding, >= 5 ms a token), a short one waits. The long one's client
    closes its socket before any answer: the server cancels it within a round, so the short one starts at once
    instead of after the long one's 2000 tokens (>= 10 s)."""
    with running(["--max-batch-size", "1", "--max-seq-len", "2048", "--pass-s", "0.005"]) as srv:
        host, port = srv.base.rsplit("/", 1)[1].split(":")
        body = json.dumps(_completion([1, 2, 3], 2000)).encode()
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        _until(lambda: _metrics(srv.base)["verispec_num_requests_running"] == 1, 10, "the long request runs")
        waiter, answer = _in_background(_call, srv.base, "/v1/completions", _completion([4, 5, 6], 8))
        _until(lambda: _metrics(srv.base)["verispec_num_requests_waiting"] == 1, 10, "the short request waits")
        t0 = time.monotonic()
        sock.close()                                   # the client goes away; it never reads an answer
        waiter.join(10)
        assert not waiter.is_alive(), "the waiting request did not get its slot within 10 s"
        status, out = answer["result"]
        assert status == 200 and out["choices"][0]["token_ids"] == greedy_reference(REF, [4, 5, 6], 8)
        assert time.monotonic() - t0 < 3
        m = _metrics(srv.base)
        assert m['verispec_requests_total{finish_reason="cancelled"}'] == 1
        assert m.get('verispec_http_errors_total{status="503"}', 0) == 0   # a disconnect is no HTTP error


def _stream_events(base, body, timeout=30) -> list:
    """A streamed completion read to its end with urllib: the decoded ``data:`` payloads ("[DONE]" as is)."""
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        lines = [line.decode().strip() for line in r]
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


# ------------------------------------------------------------------------------------------ a bad row
@pytest.mark.parametrize("stream", [False, True])
def test_nan_in_one_request_fails_it_alone_over_http(stream):
    """Two requests in the batch; the target pass gives NaN in the second one's logits: it gets a 500 (or its
    stream an error chunk before [DONE]) naming the reason, the first one's tokens are those of plain decoding."""
    with running(["--max-batch-size", "2", "-k", "3", "--draft-lookup", "--pass-s", "0.01"]) as srv:
        first = _in_background(_call, srv.base, "/v1/completions", _completion([1, 2, 3], 60))
        _until(lambda: _metrics(srv.base)["verispec_num_requests_running"] == 1, 10, "the first request runs")
        body = _completion([4, 5, 6], 60)
        second = _in_background(_stream_events if stream else _call, srv.base,
                                *(["/v1/completions"] if not stream else []), body)
        _until(lambda: _metrics(srv.base)["verispec_num_requests_running"] == 2, 10, "the second request runs")
        srv.target.nan_at = (1, 0)                     # row 1: the second request
        for t, _ in (first, second):
            t.join(30)
            assert not t.is_alive()
        reason = "generation failed: verification refused this round's target logits: target_logits contains NaN"
        if stream:
            events = second[1]["result"]
            assert events[-1] == "[DONE]" and events[-2] == {"error": {"message": reason, "type": "server_error",
                                                                       "param": None, "code": None}}
        else:
            assert second[1]["result"] == (500, {"error": {"message": reason, "type": "server_error", "param": None,
                                                           "code": None}})
        status, out = first[1]["result"]
        assert status == 200 and out["choices"][0]["token_ids"] == greedy_reference(REF, [1, 2, 3], 60)


# ------------------------------------------------------------------------------------------ supervision
def _slot_holder_and_waiter(srv):
    """A long request running in the only slot and a short one waiting behind it (both in background)."""
    long_ = _in_background(_call, srv.base, "/v1/completions", _completion([1, 2, 3], 1000))
    _until(lambda: _metrics(srv.base)["verispec_num_requests_running"] == 1, 10, "the long request runs")
    short = _in_background(_call, srv.base, "/v1/completions", _completion([4, 5, 6], 8))
    _until(lambda: _metrics(srv.base)["verispec_num_requests_waiting"] == 1, 10, "the short request waits")
    return long_, short


def _raise_in_next_step(engine, error):
    sched = engine.scheduler

    def step():
        raise error
    sched.step = step                                 # this scheduler only: the engine builds a fresh one


def test_an_exception_in_the_engine_loop_fails_the_requests_in_flight_and_the_loop_goes_on():
    with running(["--max-batch-size", "1", "-k", "3", "--draft-lookup", "--pass-s", "0.005"]) as srv:
        (t_long, long_out), (t_short, short_out) = _slot_holder_and_waiter(srv)
        _raise_in_next_step(srv.engine, RuntimeError("injected: a bug in the loop"))
        for t in (t_long, t_short):
            t.join(30)
            assert not t.is_alive()
        status, err = long_out["result"]
        assert status == 500 and err["error"]["type"] == "server_error"
        assert err["error"]["message"] == ("generation failed: the engine failed: RuntimeError: injected: a bug in "
                                           "the loop")
        status, out = short_out["result"]                  # it was waiting: it kept its place
        assert status == 200 and out["choices"][0]["token_ids"] == greedy_reference(REF, [4, 5, 6], 8)
        assert _call(srv.base, "/health") == (200, {"status": "ok"})
        assert _call(srv.base, "/v1/completions", _completion([7, 8], 4))[0] == 200
        m = _metrics(srv.base)
        assert m['verispec_http_errors_total{status="500"}'] == 1 and srv.engine.failures == 1


def test_an_engine_that_cannot_go_on_answers_everyone_and_says_so():
    fatal = []
    with running(["--max-batch-size", "1", "-k", "3", "--draft-lookup", "--pass-s", "0.005"]) as srv:
        srv.engine.on_fatal = fatal.append
        (t_long, long_out), (t_short, short_out) = _slot_holder_and_waiter(srv)

        def no_scheduler():
            raise RuntimeError("injected: the device is gone")
        srv.engine.make_scheduler = no_scheduler
        _raise_in_next_step(srv.engine, RuntimeError("injected: the device fell off the bus"))
        for t, out in ((t_long, long_out), (t_short, short_out)):
            t.join(30)
            assert not t.is_alive()
            assert out["result"][0] == 500 and "the engine stopped" in out["result"][1]["error"]["message"]
        status, health = _call(srv.base, "/health")
        assert status == 503 and "no fresh scheduler could be built" in health["reason"]
        status, err = _call(srv.base, "/v1/completions", _completion([7, 8], 4))
        assert status == 503 and err["error"]["type"] == "service_unavailable"
        assert len(fatal) == 1


def test_a_stuck_engine_does_not_hold_its_handlers_forever(monkeypatch):
    """A step that never returns (a hung device): the handlers give up with 500 once the step has run for
    ``stall_s``, /health says 503 meanwhile, and once the step returns everything is well again."""
    import verispec.serve.app as app_module

    monkeypatch.setattr(app_module, "POLL_S", 0.1)
    release = threading.Event()
    with running(["--max-batch-size", "2", "-k", "3", "--draft-lookup", "--pass-s", "0.005"]) as srv:
        srv.engine.stall_s = 1.0
        t, out = _in_background(_call, srv.base, "/v1/completions", _completion([1, 2, 3], 1000))
        _until(lambda: _metrics(srv.base)["verispec_num_requests_running"] == 1, 10, "the request runs")
        sched = srv.engine.scheduler
        step = sched.step

        def stuck():
            release.wait(30)
            sched.step = step
            return step()
        sched.step = stuck
        t.join(10)
        assert not t.is_alive(), "the handler waited past the stall bound"
        status, err = out["result"]
        assert status == 500 and "stuck in one step" in err["error"]["message"]
        assert _call(srv.base, "/health")[0] == 503
        release.set()
        _until(lambda: _call(srv.base, "/health")[0] == 200, 10, "health back")
        _until(lambda: _metrics(srv.base)["verispec_num_requests_running"] == 0, 10, "the abandoned request ends")
        assert _call(srv.base, "/v1/completions", _completion([7, 8], 4))[0] == 200


def test_the_process_exits_non_zero_when_the_engine_dies():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_server.py"), "--port", str(port), "-k", "3",
                             "--draft-lookup", "--pass-s", "0.005", "--die-at-step", "20"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not come up in 60 s"
                time.sleep(0.1)
        status, err = _call(base, "/v1/completions", _completion([1, 2, 3], 500))
        assert status == 500 and "the device fell off the bus" in err["error"]["message"]
        assert proc.wait(30) == 1
        assert "the engine died" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------ HTTP hygiene
def test_refusals_are_openai_errors_and_counted():
    with running(["-k", "3", "--draft-lookup", "--max-seq-len", "64"]) as srv:
        cases = [
            ("GET", "/v1/nowhere", None, 404, None),
            ("GET", "/v1/completions", None, 405, None),
            ("POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 2}, 400, "model"),
            ("POST", "/v1/completions", _completion([1] * 60, 2), 400, "prompt"),        # 60 + lookahead 4 > 64
            ("POST", "/v1/completions", _completion([1] * 50, 20), 400, "max_tokens"),   # the prompt fits, 20 don't
        ]
        for method, path, body, code, param in cases:
            status, err = _call(srv.base, path, body, method)
            assert status == code and set(err) == {"error"} and err["error"]["param"] == param, (path, err)
            assert set(err["error"]) == {"message", "type", "param", "code"}
        assert "max_tokens can be at most 10" in _call(srv.base, "/v1/completions", _completion([1] * 50, 20))[1][
            "error"]["message"]
        m = _metrics(srv.base)
        assert [m.get(f'verispec_http_errors_total{{status="{c}"}}') for c in (400, 404, 405)] == [4, 1, 1]


def test_a_stream_behind_the_engine_merges_its_queued_tokens_and_keeps_the_end():
    """Token events queued behind the one read become one chunk (ids and text in order); the end event after them
    is handed back, not lost or merged."""
    import asyncio

    from verispec.serve.app import _merge_queued_tokens
    from verispec.serve.engine import Handle

    async def scenario():
        handle = Handle(None, asyncio.get_running_loop())
        for event in (("tokens", ([3], "c")), ("tokens", ([4, 5], "de")), ("end", "SEQ"), ("tokens", ([9], "z"))):
            handle.events.put_nowait(event)
        first = ([1, 2], "ab")
        return _merge_queued_tokens(handle, first), handle.events.qsize()

    (tokens, text, after), left = asyncio.run(scenario())
    assert tokens == [1, 2, 3, 4, 5] and text == "abcde" and after == ("end", "SEQ") and left == 1
