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
    for _ in range(3):                      # the first requests are a few rounds in
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
