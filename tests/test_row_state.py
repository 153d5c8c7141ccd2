"""Per-row state stays with its row (hypothesis property tests on the fake runtime).

A drafter's batch must behave exactly like one drafter per sequence: after any sequence of admissions, rounds
(each row asked for its own number of drafts, as k="auto" does) and ``keep``s with any subset in any order, row
b's drafts (and the q they were drawn from) equal those of a drafter that has served only that sequence, alone,
through the same rounds. A field that ``keep`` forgot to move, or a counter that advances with the batch instead
of the row, shows up as a different draft. The engine's ``RunningBatch`` is checked against a plain list model.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from hypothesis import given, settings, strategies as st

from fakes import FakeModel
from test_engine import noisy_copy
from verispec.drafters import DraftModel, PromptLookup, SamplingParams
from verispec.drafters.base import Sampling
from verispec.engine import Request, Sequence, Stats
from verispec.engine.round import RunningBatch

TARGET = FakeModel(seed=0, eos_bias=-30.0)
DRAFT_WEIGHTS = noisy_copy(TARGET, 0.3, seed=7).w
MAX_ROWS, MAX_SEQ_LEN, VOCAB = 5, 160, TARGET.config.vocab_size
SETTINGS = [Sampling(0.0, 0, 1.0), Sampling(1.0, 0, 1.0), Sampling(0.7, 5, 0.9)]

DRAFTERS = {
    "prompt-lookup": lambda: PromptLookup(max_ngram=3, min_ngram=1),
    "draft-model": lambda: DraftModel(FakeModel(weights=DRAFT_WEIGHTS, tokenizer=TARGET.tokenizer)),
}


def _q_rows(proposal, b: int) -> torch.Tensor | None:
    """Row b's rows of ``draft_probs`` ([sum k_b, V], rows in (b, i) order)."""
    if proposal.draft_probs is None:
        return None
    start = sum(proposal.num_draft[:b])
    return proposal.draft_probs[start:start + proposal.num_draft[b]]


def _drafts(proposal, b: int) -> list[int]:
    return proposal.draft_tokens[b, :proposal.num_draft[b]].tolist()


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(DRAFTERS)), data=st.data())
def test_a_batch_drafter_equals_one_drafter_per_row(name, data):
    make = DRAFTERS[name]
    batch = make()
    batch.reserve(None, MAX_ROWS, MAX_SEQ_LEN)
    alone: dict[int, object] = {}           # row id -> a drafter that serves only it
    order: list[int] = []                   # the batch's rows, by id (the reference model of its order)
    next_id = 0
    for _ in range(data.draw(st.integers(2, 16), label="ops")):
        op = data.draw(st.sampled_from(["admit", "round", "round", "round", "keep"]) if order else st.just("admit"))
        if op == "admit" and len(order) < MAX_ROWS:
            n = data.draw(st.integers(1, MAX_ROWS - len(order)), label="admitted")
            ids = list(range(next_id, next_id + n))
            next_id += n
            prompts = [data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=8), label="prompt") for _ in ids]
            first = [data.draw(st.integers(0, 8), label="first") for _ in ids]
            rows = [replace(SETTINGS[data.draw(st.integers(0, 2), label="setting")], seed=1000 + i) for i in ids]
            batch.admit(ids, prompts, first, SamplingParams(tuple(rows)))
            for i, p, f, s in zip(ids, prompts, first, rows):
                alone[i] = make()
                alone[i].reserve(None, 1, MAX_SEQ_LEN)
                alone[i].admit([i], [p], [f], SamplingParams((s,)))
            order += ids
        elif op == "round":
            asked = [data.draw(st.integers(0, 4), label="k") for _ in order]
            # as the engine does: no propose when no row asks for drafts (the rounds still commit)
            got = batch.propose(asked) if max(asked) else None
            accepted, emitted = [], []
            for b, (rid, k) in enumerate(zip(order, asked)):
                ref = alone[rid].propose([k]) if k else None
                drafts = _drafts(ref, 0) if ref is not None else []
                assert (_drafts(got, b) if got is not None and k else []) == drafts, (name, rid)
                if ref is not None and ref.draft_probs is not None:
                    torch.testing.assert_close(_q_rows(got, b), _q_rows(ref, 0), rtol=0, atol=1e-6)
                a = data.draw(st.integers(0, len(drafts)), label="accepted")
                accepted.append(a)
                emitted.append(drafts[:a] + [data.draw(st.integers(0, VOCAB - 2), label="token")])
            batch.commit(accepted, emitted)
            for rid, a, e in zip(order, accepted, emitted):
                alone[rid].commit([a], [e])
        elif op == "keep":
            perm = data.draw(st.permutations(range(len(order))), label="permutation")
            kept = perm[:data.draw(st.integers(0, len(order)), label="kept") or len(order) - 1]
            batch.keep(list(kept))
            order = [order[j] for j in kept]


def _seq(rid: int, setting: Sampling, rounds: int) -> Sequence:
    r = Request([1, 2], temperature=setting.temperature, top_k=setting.top_k, top_p=setting.top_p, seed=rid, id=rid)
    return Sequence(r, Stats(), rounds_done=rounds)


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.one_of(st.tuples(st.just("extend"), st.integers(1, 4), st.integers(0, 2)),
                              st.tuples(st.just("keep"), st.randoms(use_true_random=False))), max_size=12))
def test_running_batch_keeps_each_row_whole(ops):
    """Certain tokens (here: the request id), settings, seeds and stream offsets stay with their sequence."""
    batch, model, next_id = RunningBatch.empty(torch.device("cpu")), [], 0
    for op in ops:
        if op[0] == "extend":
            seqs = [_seq(next_id + j, SETTINGS[op[2]], rounds=next_id + j) for j in range(op[1])]
            next_id += op[1]
            batch.extend(torch.tensor([[s.request.id] for s in seqs]), seqs)
            model += seqs
        else:
            kept = op[1].sample(range(len(model)), op[1].randint(0, len(model)))
            batch.keep(kept)
            model = [model[j] for j in kept]
        assert batch.seqs == model and batch.size == len(model)
        assert batch.certain[:, 0].tolist() == [s.request.id for s in model]
        assert batch.sampling.seed == tuple(s.request.id for s in model)
        assert batch.sampling.rows == tuple(s.request.sampling for s in model)
        assert batch.offsets == [s.request.id + 1 for s in model]
