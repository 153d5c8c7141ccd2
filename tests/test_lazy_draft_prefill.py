"""The draft model's prefill is paid only by rows that draft (``DraftModel``'s lazy prefill, module docstring).

A plain round (k = 0 for every row) and the admission before it run no draft-model pass, so a request served
entirely at k = 0 costs no draft prefill; a row's prompt enters the draft cache in the first round it drafts, and
from then on it drafts exactly what it would have drafted with its prompt prefilled at admission (greedy and
seeded sampling). Passes are counted at the draft model's network (every prefill, step and draft-loop pass goes
through ``Transformer.prefill`` or ``Transformer.append``).
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from verispec.drafters import DraftModel, SamplingParams
from verispec.drafters.base import Sampling
from verispec.engine import Request, Scheduler, SchedulerConfig
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
PROMPTS = [[3, 4, 5, 6, 7], [9, 1], [20, 21, 22, 23, 24, 25, 26, 27, 28]]
K = 4


class PassCounter:
    """Counts the passes (and the tokens they score) of one model's network."""

    def __init__(self, model):
        self.passes, self.prefill_tokens = 0, 0
        net = model.net
        prefill, append = net.prefill, net.append

        def counted_prefill(tokens, *args, **kwargs):
            self.passes += 1
            self.prefill_tokens += int(tokens.shape[1])
            return prefill(tokens, *args, **kwargs)

        def counted_append(*args, **kwargs):
            self.passes += 1
            return append(*args, **kwargs)

        net.prefill, net.append = counted_prefill, counted_append


@pytest.fixture(scope="module")
def weights():
    # the draft model without CUDA graphs: a graph replay runs its passes without calling net.append, so on a GPU
    # the counter would miss every drafting pass (the graph path's coverage: tests/test_warm_up_coverage.py)
    return (load_model(CFG, dtype=torch.float32, seed=0),
            load_model(CFG, dtype=torch.float32, seed=5, use_graphs=False))


def scheduler(target, drafter, script, max_new: int = 24) -> tuple[Scheduler, list]:
    """A scheduler whose every row drafts ``next(script)`` per round (the rows' own caps where a script entry is a
    list), with PROMPTS submitted: one greedy, one seeded sampled, one greedy."""
    def policy(running, k):
        want = next(script)
        return list(want[:len(running)]) if isinstance(want, list) else [want] * len(running)

    sched = Scheduler(target, drafter, SchedulerConfig(4, 128, K), k_policy=policy)
    sched.eos = set()
    settings = [dict(), dict(temperature=0.9, top_p=0.9, seed=1234), dict()]
    seqs = [sched.submit(Request(p, max_new, id=i, **s)) for i, (p, s) in enumerate(zip(PROMPTS, settings))]
    return sched, seqs


def test_a_request_served_at_k0_runs_no_draft_pass(weights):
    target, draft = weights
    counter = PassCounter(draft)
    drafter = DraftModel(draft)
    sched, seqs = scheduler(target, drafter, itertools.repeat(0))
    sched.run()
    assert all(len(s.generated) == 24 for s in seqs)
    assert counter.passes == 0                 # admission and every plain round: the draft model never ran
    assert drafter.prefill_tokens == 0


def test_plain_rounds_run_no_draft_pass_and_drafting_rounds_prefill_once(weights):
    # steps whose round is plain run 0 draft passes (admission included); the first drafting round prefills every
    # prompt once (one pass per row, prompt-wide), never again
    target, draft = weights
    counter = PassCounter(draft)
    drafter = DraftModel(draft)
    sched, _ = scheduler(target, drafter, itertools.chain([0] * 5, [2, 0, 0, 3, 0, 1], itertools.repeat(0)))
    plain_steps = drafting_steps = 0
    while not sched.idle:
        passes, proposed = counter.passes, sched.totals.proposed
        sched.step()
        if sched.totals.proposed == proposed:
            assert counter.passes == passes, "a plain round (or its admission) ran the draft model"
            plain_steps += 1
        else:
            assert counter.passes > passes
            drafting_steps += 1
    assert plain_steps > 5 and drafting_steps == 3
    assert drafter.prefill_tokens == counter.prefill_tokens == sum(len(p) for p in PROMPTS)


def test_a_row_that_never_drafts_never_pays_its_prefill(weights):
    # row 1 asks for 0 drafts in every round while the others draft: it is fed with the batch (into slots its
    # prefill would overwrite) but its prompt is never prefilled
    target, draft = weights
    drafter = DraftModel(draft)
    sched, seqs = scheduler(target, drafter, itertools.repeat([2, 0, 3]))
    sched.run()
    assert drafter.prefill_tokens == len(PROMPTS[0]) + len(PROMPTS[2])
    assert seqs[1].stats.proposed == 0 and seqs[0].stats.proposed > 0


def eager(drafter: DraftModel) -> DraftModel:
    drafter.prefill_at_admission = True          # the prompt prefilled at admission, as before the lazy prefill
    return drafter


def test_late_drafting_rows_draft_as_if_prefilled_at_admission(weights):
    # the same rounds through a lazy and an eager DraftModel over twins of one model: plain rounds first, then
    # ragged rounds where some rows still draft 0, greedy and sampled rows; every proposed draft and q is equal
    _, draft = weights
    lazy, early = DraftModel(draft.truncated(CFG.num_layers)), eager(DraftModel(draft.truncated(CFG.num_layers)))
    rng = random.Random(0)
    prompts = [[rng.randrange(CFG.vocab_size) for _ in range(n)] for n in (5, 11, 3)]
    sampling = SamplingParams((Sampling(), Sampling(0.8, 7, 0.9, 11), Sampling(1.0, 0, 1.0, 12)))
    first = [rng.randrange(CFG.vocab_size) for _ in prompts]
    for d in (lazy, early):
        d.reserve(None, 4, 96)
        d.admit([0, 1, 2], prompts, first, sampling)
    script = [[0, 0, 0]] * 3 + [[0, 3, 0], [2, 2, 0], [0, 0, 0], [4, 1, 3], [1, 0, 2], [3, 3, 3]]
    for caps in script:
        if max(caps):
            ps = [d.propose(caps) for d in (lazy, early)]
            for b, n in enumerate(caps):
                assert torch.equal(ps[0].draft_tokens[b, :n], ps[1].draft_tokens[b, :n]), (caps, b)
            assert (ps[0].draft_probs is None) == (ps[1].draft_probs is None)
            if ps[0].draft_probs is not None:
                # the tokens after a prompt enter the cache through catch-up passes whose widths depend on which rows
                # take part; the CPU's float32 matmuls round by shape (the GPU's batch-invariant ones do not)
                assert torch.allclose(ps[0].draft_probs, ps[1].draft_probs, rtol=1e-5, atol=1e-7)
            drafts = ps[0].draft_tokens
        else:
            drafts = torch.zeros(3, 0, dtype=torch.long)
        accepted = [rng.randint(0, n) for n in caps]
        emitted = [drafts[b, :a].tolist() + [rng.randrange(CFG.vocab_size)] for b, a in enumerate(accepted)]
        for d in (lazy, early):
            d.commit(accepted, emitted)
    assert [r.step for r in lazy._rows] == [r.step for r in early._rows]
    assert lazy.prefill_tokens == early.prefill_tokens            # every row drafted by the end


def test_scheduler_tokens_match_the_eager_prefill_and_plain_decoding(weights):
    # greedy rows equal plain decoding; the seeded sampled row emits the same tokens as with the prompt prefilled
    # at admission (its drafts and draw counters are the same)
    target, draft = weights
    script = [0] * 4 + [[3, 0, 2], 1, 0, [0, 4, 4], 2, 0, 0, 4]
    outs = []
    for drafter in (DraftModel(draft.truncated(CFG.num_layers)), eager(DraftModel(draft.truncated(CFG.num_layers)))):
        sched, seqs = scheduler(target, drafter, itertools.chain(script, itertools.cycle([3, 0, [1, 2, 0]])))
        sched.run()
        outs.append([s.generated for s in seqs])
    assert outs[0] == outs[1]
    plain, seqs = scheduler(target, None, itertools.repeat(0))
    plain.run()
    assert [outs[0][0], outs[0][2]] == [seqs[0].generated, seqs[2].generated]


class Observer:
    """A k policy from a script that records what the scheduler reports to ``observe_round``."""

    def __init__(self, script):
        self.script, self.observed = iter(script), []

    def __call__(self, running, k):
        return [next(self.script)] * len(running)

    def observe_round(self, batch: int, k: int, seconds: float) -> None:
        self.observed.append(k)


def test_k_auto_does_not_price_a_round_by_an_admission_or_a_first_prefill(weights):
    # k=auto's measured round costs (``AutoK.observe_round``) take no round of a step that admitted (on a GPU the
    # drafter's admission work finishes inside it) and no round that prefilled rows drafting for the first time
    target, draft = weights
    policy = Observer(itertools.chain([0, 0, 0, 2, 2, 0, 3], itertools.repeat(0)))
    sched = Scheduler(target, DraftModel(draft), SchedulerConfig(4, 128, K), k_policy=policy)
    sched.eos = set()
    sched.submit(Request(PROMPTS[0], 12, id=0))
    sched.step()                                          # admission + a plain round: not observed
    sched.submit(Request(PROMPTS[1], 12, id=1))
    sched.step()                                          # another admission
    sched.step()                                          # plain: observed
    sched.step()                                          # k = 2: both rows prefill now: not observed
    sched.step()                                          # k = 2: observed
    assert policy.observed == [0, 2]
    sched.step()
    sched.step()
    assert policy.observed == [0, 2, 0, 3]


def test_prefill_rows_writes_what_admit_writes_and_refuses_bad_rows(weights):
    _, draft = weights
    a, b = draft.truncated(CFG.num_layers), draft.truncated(CFG.num_layers)
    for m in (a, b):
        m.setup_cache(4, 64, empty=True)
    a.admit([PROMPTS[0], PROMPTS[2]])
    b.admit_empty(2)
    assert b.lengths.tolist() == [0, 0]
    b.prefill_rows([1, 0], [PROMPTS[2], PROMPTS[0]])
    assert b.lengths.tolist() == a.lengths.tolist() == [5, 9]
    for layer in range(CFG.num_layers):
        for r, n in ((0, 5), (1, 9)):
            assert torch.equal(a.cache.k[layer][r, :, :n], b.cache.k[layer][r, :, :n])
            assert torch.equal(a.cache.v[layer][r, :, :n], b.cache.v[layer][r, :, :n])
    with pytest.raises(ValueError, match="row 2 is not in the batch of 2"):
        b.prefill_rows([2], [[1, 2]])
    with pytest.raises(ValueError, match="row 0's prompt has 0 tokens"):
        b.prefill_rows([0], [[]])
    with pytest.raises(ValueError, match="one prompt per distinct row"):
        b.prefill_rows([0, 0], [[1], [2]])
    with pytest.raises(ValueError, match="num_rows must be >= 1"):
        b.admit_empty(0)
