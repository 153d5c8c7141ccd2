"""`verispec bench serve --client-processes N` against a fake OpenAI server (stdlib, a thread of this process):
the requests split over N spawned client processes give the same counts as one process (every request, every
token, the same prompt and output tokens per request), the workload split keeps each request's arrival time and
the concurrency, and bad values are one clear line."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("openai")

import verispec.cli as cli  # noqa: E402
from verispec.bench.serving import Job, split  # noqa: E402


class FakeOpenAI(BaseHTTPRequestHandler):
    """/v1/models and a streamed /v1/chat/completions: one chunk per token, ``max_tokens`` tokens (one per prompt
    word, cycled), then the usage chunk; prompt_tokens = the prompt's word count."""
    protocol_version = "HTTP/1.0"            # one request per connection: the end of the stream is the close

    def log_message(self, *a):
        pass

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(json.dumps({"object": "list", "data": [{"id": "fake", "object": "model", "created": 0,
                                                           "owned_by": "test"}]}).encode(), "application/json")

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        words = req["messages"][0]["content"].split()
        head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "fake"}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(req["max_tokens"]):
            chunk = {**head, "choices": [{"index": 0, "delta": {"content": " " + words[i % len(words)]},
                                          "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": len(words), "completion_tokens": req["max_tokens"],
                 "total_tokens": len(words) + req["max_tokens"]}
        self.wfile.write(f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture(scope="module")
def fake_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _bench(url: str, out, label: str, processes: int) -> dict:
    argv = ["bench", "serve", "--url", url, "--endpoint", "chat", "--num-prompts", "12", "--max-concurrency", "5",
            "--random-input-len", "6", "--random-output-len", "9", "--random-range-ratio", "0.5", "--out", str(out),
            "--label", label, "--client-processes", str(processes)]
    assert cli.main(argv) == 0
    return json.loads((out / f"{label}.json").read_text())


def test_two_client_processes_count_what_one_counts(fake_url, tmp_path):
    one = _bench(fake_url, tmp_path, "one", 1)
    two = _bench(fake_url, tmp_path, "two", 2)
    for key in ("completed", "failed", "total_input_tokens", "total_output_tokens"):
        assert one["summary"][key] == two["summary"][key], key
    assert one["summary"]["completed"] == 12 and one["summary"]["failed"] == 0
    # per request, in job order: the same tokens in and out
    assert [(r["prompt_tokens"], r["output_tokens"]) for r in one["requests"]] == \
           [(r["prompt_tokens"], r["output_tokens"]) for r in two["requests"]]
    s = two["summary"]
    assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration_s"])
    assert s["p50_ttft_ms"] <= s["p90_ttft_ms"] <= s["p99_ttft_ms"]
    assert s["client_cpu_s"] > 0


def test_split_keeps_arrival_times_and_the_concurrency():
    jobs = [Job(f"p{i}", i + 1, gap) for i, gap in enumerate([0.0, 0.5, 0.25, 1.0, 0.0, 2.0, 0.5])]
    parts = split(jobs, 5, 3)
    assert [limit for _, _, limit in parts] == [2, 2, 1]
    assert sorted(i for idx, _, _ in parts for i in idx) == list(range(7))
    arrival = [sum(j.gap_s for j in jobs[: i + 1]) for i in range(7)]
    for idx, mine, _ in parts:
        assert [j.prompt for j in mine] == [jobs[i].prompt for i in idx]
        t = 0.0
        for i, job in zip(idx, mine):
            t += job.gap_s
            assert t == pytest.approx(arrival[i])


@pytest.mark.parametrize("extra, message", [
    (["--client-processes", "0"], "--client-processes must be >= 1"),
    (["--client-processes", "3", "--num-prompts", "2"], "exceeds --num-prompts 2"),
    (["--client-processes", "4", "--max-concurrency", "3"], "exceeds --max-concurrency 3"),
])
def test_bad_client_processes_are_one_line(capsys, extra, message):
    assert cli.main(["bench", "serve", "--url", "http://127.0.0.1:1", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("verispec: error: bench serve: ")
