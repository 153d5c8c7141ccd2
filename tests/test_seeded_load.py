"""A seeded sampled request emits the same tokens alone and among 16 or 64 concurrent requests under k="auto" (the
server's default), with every drafter that is cheap on the CPU: in process through the ``Scheduler`` (the fake
runtime), and through ``verispec serve``'s HTTP with the ``openai`` client against a subprocess on 127.0.0.1.

The cost table makes the load matter: speculation pays more at 1 row than at 64, so a k chosen from the batch (the
policy before this test: one k for every row, from the batch's size and every row's acceptance) gives the request
another k, hence other positions drafted, verified and sampled as the bonus, hence other tokens. Greedy requests in
the crowd must still equal plain greedy decoding."""
from __future__ import annotations

import concurrent.futures as cf
import os
import random
import subprocess
import sys
import time
import urllib.request

import pytest

from fakes import FakeModel, greedy_reference
from test_engine import noisy_copy
from verispec.drafters import DraftModel, PromptLookup, SelfSpeculative
from verispec.engine import Request, Scheduler, SchedulerConfig
from verispec.engine.auto_k import AutoK, CostTable, best_k

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGET = FakeModel(seed=0, eos_bias=-30.0)        # no EOS: every request runs to its max_new_tokens
DRAFT_WEIGHTS = noisy_copy(TARGET, 0.2, seed=5).w
DRAFTERS = {
    "prompt-lookup": lambda: PromptLookup(max_ngram=3, min_ngram=1),
    "draft-model": lambda: DraftModel(FakeModel(weights=DRAFT_WEIGHTS, tokenizer=TARGET.tokenizer)),
    "self-speculative": lambda: SelfSpeculative(layers=2),
}
K, MAX_SEQ_LEN, N_NEW = 6, 96, 24
SIZES = (1, 2, 4, 8, 16, 32, 64)
TOKENS = tuple(range(1, K + 2))
# a target pass costs about the same for a few tokens at 1 row, and grows with the tokens it scores at 64
COSTS = CostTable(SIZES, TOKENS, tuple(tuple(0.01 + 0.0003 * b * t for t in TOKENS) for b in SIZES), (0.001,) * 7)
MINE = dict(prompt=[3, 9, 4, 3, 9, 4, 3, 9, 1, 2], temperature=0.8, top_p=0.9, seed=1001)


def test_the_table_makes_the_batch_matter():
    prior = [AutoK(COSTS).prior_alpha] * K
    assert best_k(prior, K, COSTS, 1) != best_k(prior, K, COSTS, 16) != best_k(prior, K, COSTS, 64) > 0


def crowd(n: int, seed: int) -> list[dict]:
    """n other requests: greedy and sampled under several settings, repetitive prompts and not, lengths 2..30."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(32) for _ in range(rng.randint(2, 12))]
        if i % 3 == 0:
            prompt = (prompt[:3] * 5)[:rng.randint(6, 15)]
        setting = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_k=5)][i % 3]
        out.append(dict(prompt=prompt, max_new=rng.randint(2, 30), seed=5000 + i, **setting))
    return out


def _request(rid: int, job: dict) -> Request:
    return Request(list(job["prompt"]), job.get("max_new", N_NEW), temperature=job["temperature"],
                   top_k=job.get("top_k", 0), top_p=job.get("top_p", 1.0), seed=job["seed"], id=rid)


def run(name: str, mine: dict, others: list[dict]) -> tuple[list[int], dict[int, list[int]], int]:
    """Half the others first, then mine (a middle row), then the rest two steps later (they join mid-generation;
    rows retire at different times, so ``keep`` moves rows). -> (my tokens, everyone's tokens, my drafts)."""
    drafter = DRAFTERS[name]()
    drafter.attach(TARGET)
    sched = Scheduler(TARGET, drafter, SchedulerConfig(64, MAX_SEQ_LEN, K), k_policy=AutoK(COSTS))
    half = len(others) // 2
    seqs = [sched.submit(_request(i, job)) for i, job in enumerate(others[:half])]
    me = sched.submit(_request(10**6, mine))
    for _ in range(2):
        sched.step()
    seqs += [sched.submit(_request(half + i, job)) for i, job in enumerate(others[half:])]
    for _ in range(20 * (N_NEW + 30)):
        if sched.idle:
            break
        sched.step()
    assert sched.idle
    assert all(s.finish_reason == "length" for s in seqs + [me]), [s.error for s in seqs + [me]]
    return me.generated, {s.request.id: s.generated for s in seqs}, me.stats.proposed


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_seeded_sampling_under_auto_k_does_not_depend_on_the_load(name):
    alone, _, drafted = run(name, MINE, [])
    assert drafted > 0 and len(alone) == N_NEW
    assert run(name, {**MINE, "seed": 1002}, [])[0] != alone            # the seed matters: this check can fail
    for n in (15, 63):                                                    # 16 and 64 concurrent requests
        others = crowd(n, seed=n)
        mine, tokens, _ = run(name, MINE, others)
        assert mine == alone, (name, n)
        for i, job in enumerate(others):
            if job["temperature"] == 0.0:
                assert tokens[i] == greedy_reference(TARGET, job["prompt"], job["max_new"]), (name, n, i)


# ------------------------------------------------------------------------------------------ through the server
def _server(argv: list[str]):
    from fake_server import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_server.py"), "--port", str(port), *argv],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            return proc, base
        except OSError:
            assert time.monotonic() < deadline, "the server did not come up in 60 s"
            time.sleep(0.1)


@pytest.mark.parametrize("drafter", [["--draft-lookup"], ["--draft-self", "2"]], ids=["prompt-lookup", "self"])
def test_through_the_server_a_seeded_request_ignores_the_load(tmp_path, drafter):
    """`verispec serve`'s default k (auto) with this cost table (--cost-table: loaded, not measured); the request
    alone, then among 15 and 63 others sent at once by 64 client threads."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    table = tmp_path / "costs.json"
    table.write_text(COSTS.to_json())
    proc, base = _server([*drafter, "--max-batch-size", "64", "--k-max", str(K), "--max-seq-len", str(MAX_SEQ_LEN),
                          "--cost-table", str(table)])
    from fake_server import NAME

    client = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0, timeout=60)

    def send(job):
        extra = {"top_k": job["top_k"]} if "top_k" in job else {}
        out = client.completions.create(model=NAME, prompt=job["prompt"], max_tokens=job.get("max_new", N_NEW),
                                        temperature=job["temperature"], top_p=job.get("top_p", 1.0), seed=job["seed"],
                                        extra_body=extra)
        return out.choices[0]

    try:
        alone = send(MINE)
        assert alone.speculative_decoding_stats["draft_tokens_proposed"] > 0 and len(alone.token_ids) == N_NEW
        for n in (15, 63):
            others = crowd(n, seed=n)
            with cf.ThreadPoolExecutor(n + 1) as pool:
                futures = [pool.submit(send, job) for job in others[: n // 2]] + [pool.submit(send, MINE)]
                futures += [pool.submit(send, job) for job in others[n // 2:]]
                got = [f.result() for f in futures]
            mine = got[n // 2]
            assert mine.token_ids == alone.token_ids, n
            greedy = [(job, c) for job, c in zip(others[: n // 2] + others[n // 2:], got[: n // 2] + got[n // 2 + 1:])
                      if job["temperature"] == 0.0]
            assert all(c.token_ids == greedy_reference(TARGET, job["prompt"], job["max_new"]) for job, c in greedy)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
