"""Rollback keeps both caches consistent (hypothesis property test on the fake runtime).

After every round, for every active sequence with history h (prompt + emitted; h[-1] is the
certain token, not yet cached):
    target cache: length == len(h) - 1 and slots [0, len(h) - 1) == a fresh prefill of h[:-1]
    draft cache:  length >= len(h) - 2 and slots [0, len(h) - 2) == a fresh prefill of h[:-2]
(the draft invariant is one token weaker: after all k drafts are accepted the draft never saw
d_k; the next round feeds it, see verispec/drafters/draft_model.py).
"""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from test_engine import noisy_copy
from fakes import FakeModel, fresh_states, greedy_reference
from verispec.drafters import DraftModel, OracleDraft, PromptLookup, SelfSpeculative
from verispec.engine import SpeculativeDecoder

TARGET = FakeModel(seed=0, eos_bias=-4.0)     # EOS happens now and then: the batch shrinks too


def _draft_model(drafter):
    if isinstance(drafter, OracleDraft):
        return drafter._runner.model if drafter._runner is not None else None
    return getattr(drafter, "model", None)


def check_caches(decoder, active):
    draft = _draft_model(decoder.drafter)
    for j, seq in enumerate(active):
        h = seq.prompt + seq.generated
        n = len(h) - 1
        assert int(decoder.target.lengths[j]) == n
        torch.testing.assert_close(decoder.target.committed_states(j, n), fresh_states(decoder.target, h[:-1]),
                                   rtol=0, atol=1e-12)
        if draft is not None:
            assert int(draft.lengths[j]) >= n - 1
            torch.testing.assert_close(draft.committed_states(j, n - 1), fresh_states(draft, h[:-2]),
                                       rtol=0, atol=1e-12)


@st.composite
def scenarios(draw):
    batch = draw(st.integers(1, 3))
    prompts = [draw(st.lists(st.integers(0, 30), min_size=1, max_size=6)) for _ in range(batch)]
    return dict(prompts=prompts, k=draw(st.integers(1, 5)), drafter=draw(st.sampled_from(
        ["draft", "perfect", "self", "oracle", "lookup"])), alpha=draw(st.sampled_from([0.0, 0.5, 0.9, 1.0])),
        temperature=draw(st.sampled_from([0.0, 1.0])), seed=draw(st.integers(0, 2**20)),
        max_new=draw(st.integers(1, 14)))


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_caches_match_a_fresh_prefill_after_every_round(sc):
    kind = sc["drafter"]
    if kind == "draft":
        drafter = DraftModel(noisy_copy(TARGET, 0.2, seed=sc["seed"]))
    elif kind == "perfect":
        drafter = DraftModel(FakeModel(weights=TARGET.w, tokenizer=TARGET.tokenizer))
    elif kind == "self":
        drafter = SelfSpeculative(layers=1 + sc["seed"] % 2)
    elif kind == "oracle":
        refs = [greedy_reference(TARGET, p, sc["max_new"]) for p in sc["prompts"]]
        drafter = OracleDraft(refs, sc["alpha"], cost_model=FakeModel(seed=9, num_layers=1), seed=sc["seed"])
    else:
        drafter = PromptLookup(max_ngram=3, min_ngram=1)
    decoder = SpeculativeDecoder(TARGET, drafter, k=sc["k"])
    rounds = []
    decoder._debug_round_hook = lambda d, active: (check_caches(d, active), rounds.append(len(active)))
    out = decoder.generate(sc["prompts"], max_new_tokens=sc["max_new"], temperature=sc["temperature"],
                           seed=sc["seed"])
    if sc["temperature"] == 0:
        assert [g.tokens for g in out] == [greedy_reference(TARGET, p, sc["max_new"]) for p in sc["prompts"]]
