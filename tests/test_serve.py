"""`verispec serve` as a subprocess on 127.0.0.1 with the embedded SmolLM2 and prompt lookup, driven by the
official ``openai`` client: exactness against ``verispec.generate``, streaming, chat, stats, concurrency,
bad inputs (400), queue overflow (429), disconnects. Greedy only: sampled verification is checked elsewhere."""
from __future__ import annotations

import concurrent.futures as cf
import json
import signal
import time
import urllib.request

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from served import serve_cli  # noqa: E402

K = 4
MAX_SEQ_LEN = 256


@pytest.fixture(scope="module")
def server():
    from verispec.runtime.loading import embedded_gguf_path

    try:
        embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with serve_cli(["--draft-lookup", "-k", str(K), "--max-batch-size", "4", "--max-seq-len", str(MAX_SEQ_LEN),
                    "--max-waiting", "32", "--threads", "1", "--device", "cpu"]) as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model():
    from verispec.runtime import load_model

    torch.set_num_threads(1)
    return load_model(device="cpu", dtype=torch.float32)


def _alone(model, prompt, max_tokens, *, chat=False, stop=None, drafter=True):
    from verispec.drafters import PromptLookup
    from verispec.engine import generate

    return generate(model, prompt, drafter=PromptLookup() if drafter else None, k=K, max_new_tokens=max_tokens,
                    chat=chat, stop=stop)


PROMPT = "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps"


def _post(base, path, body) -> tuple[int, dict]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_greedy_completion_equals_generate(client, model):
    out = client.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=20, temperature=0)
    choice = out.choices[0]
    ref = _alone(model, PROMPT, 20)
    assert choice.token_ids == ref.tokens
    assert choice.text == ref.text
    assert ref.tokens == _alone(model, PROMPT, 20, drafter=False).tokens
    st = choice.speculative_decoding_stats
    assert 0 <= st["draft_tokens_accepted"] <= st["draft_tokens_proposed"] and st["draft_tokens_proposed"] > 0
    acc = st["accepted_per_position"]
    assert all(a >= b for a, b in zip(acc, acc[1:])) and sum(acc) == st["draft_tokens_accepted"]
    assert st["rounds"] >= 1 and out.usage.completion_tokens == len(ref.tokens)


def test_stream_concatenates_to_the_same_text(client, model):
    stream = client.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=20, temperature=0,
                                       stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == _alone(model, PROMPT, 20).text
    assert [t for c in chunks for t in c.choices[0].token_ids] == _alone(model, PROMPT, 20).tokens
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "speculative_decoding_stats" in chunks[-1].choices[0].model_extra


def test_chat_applies_the_template(client, model):
    msg = "Name three colors."
    out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": msg}],
                                         max_tokens=12, temperature=0)
    ref = _alone(model, msg, 12, chat=True)
    assert out.choices[0].message.content == ref.text
    assert out.choices[0].token_ids == ref.tokens
    streamed = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": msg}],
                                              max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == ref.text


def test_concurrent_requests_each_equal_alone(client, model):
    jobs = [(f"Repeat exactly: {w} one two three {w} one two three {w}" + " x" * i, 4 + (i % 5) * 3,
             [" three"] if i % 4 == 0 else None) for i, w in enumerate(
                 "apple river cloud stone maple ocean tiger piano lemon candle violet rocket amber cedar frost honey"
                 .split())]

    def one(job):
        prompt, n, stop = job
        return client.completions.create(model="SmolLM2-135M-Instruct", prompt=prompt, max_tokens=n, temperature=0,
                                         stop=stop).choices[0]

    with cf.ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(one, jobs))
    assert len(got) == 16
    for (prompt, n, stop), choice in zip(jobs, got):
        ref = _alone(model, prompt, n, stop=stop)
        assert (choice.token_ids, choice.text) == (ref.tokens, ref.text), prompt


NAME = "SmolLM2-135M-Instruct"
BAD = [
    ({"prompt": "hi"}, "model"),
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": 3}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, -5]}, "prompt"),
    ({"prompt": [1] * MAX_SEQ_LEN}, "prompt"),
    ({"prompt": "hi", "temperature": -0.5}, "temperature"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 2.5}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": MAX_SEQ_LEN}, "max_tokens"),
    ({"prompt": "hi", "n": 2}, "n"),
    ({"prompt": "hi", "model": "gpt-9"}, "model"),
    ({"prompt": "hi", "stop": 5}, "stop"),
    ({"prompt": "hi", "stop": [""]}, "stop"),
    ({"prompt": "hi", "seed": "abc"}, "seed"),
    ({"prompt": "hi", "seed": 1.5}, "seed"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "top_k": -3}, "top_k"),
    ({"prompt": "hi", "logprobs": 2}, "logprobs"),
    ({"prompt": "hi", "presence_penalty": 1.0}, "presence_penalty"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_bad_input_gets_400_naming_the_field(server, body, param):
    status, err = _post(server[0], "/v1/completions", {"model": NAME, **body} if param != "model" else body)
    assert status == 400 and err["error"]["param"] == param, err


@pytest.mark.parametrize("body,param", [({"messages": []}, "messages"), ({"messages": [{"role": "robot",
                                        "content": "x"}]}, "messages[0].role"),
                                        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content")])
def test_bad_chat_input_gets_400(server, body, param):
    status, err = _post(server[0], "/v1/chat/completions", {"model": NAME, **body})
    assert status == 400 and err["error"]["param"] == param, err


def test_invalid_json_gets_400(server):
    req = urllib.request.Request(server[0] + "/v1/completions", data=b"{nope", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400


def _samples(base) -> dict[tuple, float]:
    """/metrics parsed with prometheus-client's own parser: (sample name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model"))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _total(samples, name, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, v2) in ls for k, v2 in labels.items()))


def _metric(base, name, **labels) -> float:
    """The sum of /metrics samples ``verispec_<name>`` that carry ``labels`` (parsed, not string-matched)."""
    return _total(_samples(base), f"verispec_{name}", **labels)


def test_disconnect_mid_stream_frees_the_slot(server, client):
    base = server[0]
    cancelled = dict(name="requests_total", finish_reason="cancelled")
    before = _metric(base, **cancelled)
    stream = client.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=200, temperature=0,
                                       stream=True)
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _metric(base, **cancelled) == before:
        time.sleep(0.2)
    assert _metric(base, **cancelled) == before + 1
    assert _metric(base, "num_requests_running") == 0
    out = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Hello", max_tokens=3, temperature=0)
    assert len(out.choices[0].token_ids) == 3


def test_queue_overflow_gets_429(server, client):
    """The 4 slots held by long streams, 40 one-token requests: 32 queue (--max-waiting), 8 are refused with 429
    at once; closing the streams frees the slots and the queued ones are served."""
    base = server[0]
    # a prompt that SmolLM2 continues for 200 tokens without an EOS: far longer than filling the queue takes
    streams = [client.completions.create(model=NAME, prompt="Tell me a long story about dragon number 0.",
                                         max_tokens=200, temperature=0, stream=True) for _ in range(4)]
    readers = [iter(s) for s in streams]               # kept: a dropped iterator closes its connection
    for r in readers:
        next(r)                                         # running: it has its first chunk
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 1, "temperature": 0}
    with cf.ThreadPoolExecutor(40) as pool:
        answers = [pool.submit(_post, base, "/v1/completions", body) for _ in range(40)]
        deadline = time.monotonic() + 60
        while sum(a.done() for a in answers) < 8 or _metric(base, "num_requests_waiting") < 32:
            assert time.monotonic() < deadline, "the queue did not fill in 60 s"
            time.sleep(0.05)
        assert [a.result()[0] for a in answers if a.done()] == [429] * 8
        for s in streams:
            s.close()
        statuses = [a.result()[0] for a in answers]
    assert sorted(statuses) == [200] * 32 + [429] * 8


def test_models_health_metrics(server):
    base = server[0]
    # one request of its own: under pytest-xdist this test may be the first of its worker's server
    body = {"model": NAME, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    assert _post(base, "/v1/completions", body)[0] == 200
    models = json.loads(urllib.request.urlopen(base + "/v1/models", timeout=30).read())
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
    assert json.loads(urllib.request.urlopen(base + "/health", timeout=30).read())["status"] == "ok"
    assert _metric(base, "draft_tokens_accepted_total") <= _metric(base, "draft_tokens_proposed_total")
    assert _metric(base, "generation_tokens_total") > 0


def test_metrics_histograms_and_counters_add_up(server, client):
    """After 5 requests (streamed and not, one ended by a stop string): one TTFT, queue time and end-to-end
    latency each, one inter-token latency per token after the first, the tokens and drafts counted once."""
    base = server[0]
    before = _samples(base)
    tokens, proposed = 0, 0
    for i in range(5):
        kw = dict(model="SmolLM2-135M-Instruct", prompt=PROMPT + " x" * i, max_tokens=6 + i, temperature=0)
        if i == 4:
            kw["stop"] = [" the"]
        if i % 2:
            chunks = list(client.completions.create(stream=True, **kw))
            ids = [t for c in chunks for t in c.choices[0].token_ids]
            stats = chunks[-1].choices[0].model_extra["speculative_decoding_stats"]
        else:
            choice = client.completions.create(**kw).choices[0]
            ids, stats = choice.token_ids, choice.speculative_decoding_stats
        tokens += len(ids)
        proposed += stats["draft_tokens_proposed"]
    after = _samples(base)
    delta = lambda name, **labels: _total(after, name, **labels) - _total(before, name, **labels)  # noqa: E731
    ended = sum(delta("verispec_requests_total", finish_reason=r) for r in ("length", "eos", "stop"))
    assert ended == delta("verispec_requests_total") == 5
    assert delta("verispec_generation_tokens_total") == tokens
    assert delta("verispec_draft_tokens_proposed_total") == proposed > 0
    assert delta("verispec_draft_proposed_per_position_total") == proposed
    assert delta("verispec_draft_accepted_per_position_total") == delta("verispec_draft_tokens_accepted_total")
    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert delta(f"verispec_{name}_seconds_count") == 5, name
    assert delta("verispec_inter_token_latency_seconds_count") == tokens - 5
    for name in ("time_to_first_token", "inter_token_latency", "e2e_request_latency", "request_queue_time"):
        buckets = sorted(((float(dict(ls)["le"]), v) for (n, ls), v in after.items()
                          if n == f"verispec_{name}_seconds_bucket"))
        assert [v for _, v in buckets] == sorted(v for _, v in buckets), name          # cumulative
        assert buckets[-1] == (float("inf"), _total(after, f"verispec_{name}_seconds_count")), name
    assert _total(after, "verispec_num_requests_running") == _total(after, "verispec_num_requests_waiting") == 0
    assert _total(after, "verispec_round_seconds_count") > _total(before, "verispec_round_seconds_count")


def test_sigterm_exits_cleanly(server):
    """After the signal, a new request gets the documented 503 (the port stays open a moment: without that, uvicorn
    closes it within 0.1 s and a client sees "connection refused"), then exit 0."""
    base, proc = server
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    status, err = _post(base, "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": 50})
    assert status == 503 and err["error"]["type"] == "service_unavailable", err
    assert proc.wait(60) == 0
    assert "[verispec serve] stopped" in proc.stdout.read()
