"""Continuous batching on the fake runtime: a request admitted while others are mid-generation produces the
same tokens as when it runs alone, for every drafter, with k fixed and k=auto."""
from __future__ import annotations

import pytest

from test_engine import DRAFTERS, N_NEW, PROMPTS, noisy_copy  # noqa: F401 - the engine tests' drafters
from fakes import FakeModel, greedy_reference
from verispec.engine import Request, Scheduler, SchedulerConfig
from verispec.engine.auto_k import AutoK, CostTable

LATE = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]]


@pytest.fixture(scope="module")
def target():
    return FakeModel(seed=0, eos_bias=-30.0)


def bandwidth_bound_costs() -> CostTable:
    """A pass costs nearly the same for 1..9 tokens: k=auto speculates (and its choice moves with alpha)."""
    tokens = tuple(range(1, 10))
    return CostTable((1, 2, 4), tokens, tuple(tuple(0.01 + 0.0005 * b * t for t in tokens) for b in (1, 2, 4)),
                     (0.001, 0.001, 0.001))


@pytest.mark.parametrize("name,k", [(n, k) for n in [n for n in DRAFTERS if n != "oracle"] + [None]
                                    for k in (3, "auto")])
def test_request_admitted_mid_generation_equals_alone(target, name, k):
    prompts = PROMPTS + LATE
    refs = [greedy_reference(target, p, N_NEW) for p in prompts]
    drafter = None if name is None else DRAFTERS[name](target, refs)
    if drafter is not None:
        drafter.attach(target)
    policy = AutoK(bandwidth_bound_costs()) if k == "auto" else None
    k_max = 6 if k == "auto" else k
    sched = Scheduler(target, drafter, SchedulerConfig(4, 64, k_max), k_policy=policy)
    seqs = [sched.submit(Request(p, N_NEW, id=i)) for i, p in enumerate(PROMPTS)]
    for _ in range(2):                      # the first requests are a few rounds in (k <= 6: not done)
        sched.step()
    assert all(len(s.generated) > 1 and s.finish_reason is None for s in seqs)
    seqs += [sched.submit(Request(p, N_NEW, id=len(PROMPTS) + j)) for j, p in enumerate(LATE)]
    steps = 0
    while not sched.idle and steps < 10 * N_NEW:
        sched.step()
        steps += 1
    assert sched.idle
    assert [(s.finish_reason, s.error) for s in seqs] == [("length", None)] * len(seqs)
    assert [s.generated for s in seqs] == refs
    if drafter is not None:
        assert sum(s.stats.proposed for s in seqs) > 0
        if k == "auto":
            assert policy.last_k <= k_max and all(s.stats.num_draft_last <= k_max for s in seqs)


def _run_sampled(target, name, requests, late=(), after=3):
    """Run ``requests`` on a fresh scheduler (``late`` ones join after ``after`` steps); tokens by request id."""
    drafter = None if name is None else DRAFTERS[name](target, None)
    if drafter is not None:
        drafter.attach(target)
    sched = Scheduler(target, drafter, SchedulerConfig(4, 64, 3))
    seqs = [sched.submit(r) for r in requests]
    for _ in range(after if late else 0):
        sched.step()
    seqs += [sched.submit(r) for r in late]
    while not sched.idle:
        sched.step()
    return {s.request.id: s.generated for s in seqs}


@pytest.mark.parametrize("name", ["draft-model", "self-speculative", "prompt-lookup", None])
def test_seeded_sampling_does_not_depend_on_the_batch(target, name):
    """A sampled request (T = 1, its own seed) emits the same tokens alone and when it joins a running batch at
    another row, among other sampled and greedy requests: verification and the draft model's draws come from the
    request's own stream. Another seed changes them (the check can fail)."""
    def req(rid, prompt, seed, temperature=1.0):
        return Request(list(prompt), N_NEW, temperature=temperature, seed=seed, id=rid)

    alone = _run_sampled(target, name, [req(9, LATE[0], seed=1234)])[9]
    others = [req(i, p, seed=100 + i, temperature=(0.0 if i % 2 else 0.7)) for i, p in enumerate(PROMPTS[:3])]
    joined = _run_sampled(target, name, others, late=[req(9, LATE[0], seed=1234)])[9]
    assert joined == alone
    assert _run_sampled(target, name, [req(9, LATE[0], seed=4321)])[9] != alone
