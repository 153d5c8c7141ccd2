"""Soak: hundreds of requests of mixed lengths and settings, 32 at a time, through the ``openai`` client against
the server over real HTTP on 127.0.0.1 (the fake model: tests/fake_server.py). About 10% are cancelled at a
random point (the client closes its stream), about 5% are malformed. Every request gets exactly one answer
(its tokens, its 400, or the end its client chose), every completed one equals the same request run alone
(greedy and seeded sampling: fixed k, so a request's tokens never depend on the batch), and the server's
metrics add up to what the clients saw."""
from __future__ import annotations

import concurrent.futures as cf
import random
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import fake_server  # noqa: E402
from fake_server import NAME, PacedFake, running  # noqa: E402
from fakes import greedy_reference  # noqa: E402
from verispec.drafters import PromptLookup  # noqa: E402
from verispec.engine import Request, Scheduler, SchedulerConfig  # noqa: E402

NUM_REQUESTS = 300
CONCURRENCY = 32
K, MAX_SEQ_LEN, EOS_BIAS = 3, 128, -2.0     # EOS now and then: some requests end early
MALFORMED = [dict(temperature=-1.0), dict(max_tokens=0), dict(n=2), dict(model="gpt-9"), dict(top_p=0.0),
             dict(logprobs=2), dict(stop=[""]), dict(prompt=[])]


def _jobs(rng: random.Random) -> list[dict]:
    jobs = []
    for i in range(NUM_REQUESTS):
        prompt = [rng.randrange(32) for _ in range(rng.randint(1, 32))]
        if rng.random() < 0.3:                         # a repetitive prompt: prompt lookup drafts and accepts
            prompt = (prompt[:rng.randint(2, 5)] * 8)[:rng.randint(8, 32)]
        kw = dict(model=NAME, prompt=prompt, max_tokens=rng.randint(1, 24), seed=1000 + i,
                  temperature=0.8 if rng.random() < 0.15 else 0.0, stream=rng.random() < 0.5)
        if kw["temperature"]:
            kw.update(rng.choice([dict(top_p=0.9), dict(top_k=5), {}]))
        if rng.random() < 0.15:
            kw["stop"] = [rng.choice(["ab", "e", "z.", "q"])]
        kind = "ok"
        roll = rng.random()
        if roll < 0.05:
            kind = "malformed"
            kw.update(rng.choice(MALFORMED))
        elif roll < 0.15:
            kind = "cancel"                            # a long stream, closed after 1-3 chunks
            kw.update(stream=True, max_tokens=MAX_SEQ_LEN - len(prompt) - K - 1, chunks=rng.randint(1, 3))
        jobs.append(dict(kind=kind, kw=kw))
    return jobs


def _send(client, job) -> dict:
    """One request -> what the client saw: {"status", "tokens", "text", "finish"} (exactly one outcome)."""
    kw = dict(job["kw"])
    chunks_wanted = kw.pop("chunks", None)
    extra = {k: kw.pop(k) for k in ("top_k",) if k in kw}
    try:
        if not kw["stream"]:
            choice = client.completions.create(**kw, extra_body=extra).choices[0]
            return dict(status=200, tokens=choice.token_ids, text=choice.text, finish=choice.finish_reason)
        tokens, text, finish, seen = [], "", [], 0
        with client.completions.create(**kw, extra_body=extra) as stream:
            for chunk in stream:
                seen += 1
                c = chunk.choices[0]
                tokens += c.token_ids
                text += c.text
                if c.finish_reason is not None:
                    finish.append(c.finish_reason)
                if chunks_wanted is not None and seen >= chunks_wanted:
                    return dict(status="cancelled")    # leaving the with-block closes the connection
        assert len(finish) == 1, finish                # exactly one final chunk
        return dict(status=200, tokens=tokens, text=text, finish=finish[0])
    except openai.BadRequestError as e:
        return dict(status=400, param=e.body.get("param") if isinstance(e.body, dict) else None)


def _alone(jobs: list[dict]) -> list[tuple[list[int], str]]:
    """Each request run by itself, with the server's drafter and k: a scheduler of one row takes them in turn.
    (A greedy request without stop strings is checked against plain decoding instead: the same tokens, cheaper.)"""
    model = PacedFake(seed=0, eos_bias=EOS_BIAS)
    drafter = PromptLookup(max_ngram=3, min_ngram=1)
    drafter.attach(model)
    sched = Scheduler(model, drafter, SchedulerConfig(1, MAX_SEQ_LEN, K))
    seqs = [sched.submit(Request(kw["prompt"], kw["max_tokens"], kw["temperature"], kw.get("top_k", 0),
                                 kw.get("top_p", 1.0), kw["seed"], tuple(kw.get("stop", ()))))
            for kw in (job["kw"] for job in jobs)]
    for _ in range(100 * len(jobs)):
        if sched.idle:
            break
        sched.step()
    return [(seq.generated, seq.finish_reason) for seq in seqs]


def _metrics(base) -> dict[str, float]:
    return fake_server.metrics(base)


def test_soak():
    jobs = _jobs(random.Random(0))
    with running(["--max-batch-size", "16", "-k", str(K), "--draft-lookup", "--max-seq-len", str(MAX_SEQ_LEN),
                  "--max-waiting", str(CONCURRENCY)], eos_bias=EOS_BIAS) as srv:
        client = openai.OpenAI(base_url=srv.base + "/v1", api_key="-", max_retries=0, timeout=60)
        with cf.ThreadPoolExecutor(CONCURRENCY) as pool:
            seen = list(pool.map(lambda job: _send(client, job), jobs))
        client.close()
        m = _metrics(srv.base)

    kinds = {k: [i for i, j in enumerate(jobs) if j["kind"] == k] for k in ("ok", "malformed", "cancel")}
    assert [seen[i]["status"] for i in kinds["malformed"]] == [400] * len(kinds["malformed"])
    assert [seen[i]["status"] for i in kinds["cancel"]] == ["cancelled"] * len(kinds["cancel"])
    assert [seen[i]["status"] for i in kinds["ok"]] == [200] * len(kinds["ok"])
    plain = [i for i in kinds["ok"] if jobs[i]["kw"]["temperature"] == 0 and "stop" not in jobs[i]["kw"]]
    model = PacedFake(seed=0, eos_bias=EOS_BIAS)
    for i in plain:
        kw = jobs[i]["kw"]
        tokens = greedy_reference(model, kw["prompt"], kw["max_tokens"])
        finish = "stop" if tokens[-1] in model.tokenizer.eos_token_ids else "length"
        assert (seen[i]["tokens"], seen[i]["finish"]) == (tokens, finish), (i, jobs[i])
    others = [i for i in kinds["ok"] if i not in plain]
    reasons = {"eos": "stop", "stop": "stop", "length": "length"}
    for i, (tokens, finish) in zip(others, _alone([jobs[i] for i in others])):
        assert (seen[i]["tokens"], seen[i]["finish"]) == (tokens, reasons[finish]), (i, jobs[i])
    assert len(plain) > 100 and len(others) > 30

    # the metrics add up to what the clients saw
    ended = {k.split('"')[1]: v for k, v in m.items() if k.startswith("verispec_requests_total{")}
    reached = kinds["ok"] + kinds["cancel"]            # every cancelled stream had its first chunk: it was submitted
    assert sum(ended.values()) == len(reached)
    assert 0 < ended.get("cancelled", 0) <= len(kinds["cancel"])
    assert ended.get("error", 0) == 0
    assert {k: v for k, v in m.items() if k.startswith("verispec_http_errors_total{")} == {
        'verispec_http_errors_total{status="400"}': len(kinds["malformed"])}
    assert m["verispec_prompt_tokens_total"] == sum(len(jobs[i]["kw"]["prompt"]) for i in reached)
    assert m["verispec_generation_tokens_total"] >= sum(len(seen[i]["tokens"]) for i in kinds["ok"])
    assert m["verispec_num_requests_running"] == m["verispec_num_requests_waiting"] == 0
    assert m["verispec_draft_tokens_accepted_total"] > 0
