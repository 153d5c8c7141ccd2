"""Drafter units: prompt lookup's matching rules, the oracle's acceptance rate, compatibility checks."""
from __future__ import annotations

import pytest
import torch

from fakes import FakeModel, greedy_reference
from verispec.drafters import DraftModel, OracleDraft, PromptLookup, SamplingParams, SelfSpeculative
from verispec.engine import generate

GREEDY1 = SamplingParams.columns((0.0,), (0,), (1.0,), (0,))


def begin(d, prompts, first, sampling):
    """reserve + admit: the drafter starts with these sequences (rows 0..n-1)."""
    d.reserve(None, len(prompts), 64)
    d.admit(list(range(len(prompts))), prompts, first, sampling)


def lookup(history, k, **kw):
    d = PromptLookup(**kw)
    begin(d, [history[:-1]], [history[-1]], GREEDY1)
    p = d.propose([k])
    return p.draft_tokens[0, : p.num_draft[0]].tolist()


def test_prompt_lookup_prefers_the_longest_ngram():
    # tail (2, 3): the 2-gram matches at 5 -> [9]; the 1-gram (3) alone would match later at 8 -> [7]
    assert lookup([1, 2, 3, 4, 5, 2, 3, 9, 3, 7, 2, 3], 1, max_ngram=2, min_ngram=1) == [9]


def test_prompt_lookup_takes_the_most_recent_occurrence_and_caps_at_k():
    h = [5, 6, 1, 1, 5, 6, 2, 2, 2, 5, 6]
    assert lookup(h, 3, max_ngram=2, min_ngram=2) == [2, 2, 2]
    assert lookup(h, 2, max_ngram=2, min_ngram=2) == [2, 2]
    assert lookup(h, 3, max_ngram=2, min_ngram=2, num_pred_tokens=1) == [2]


def test_prompt_lookup_continuation_can_run_into_the_tail():
    assert lookup([5, 6, 7, 5, 6], 8, max_ngram=2, min_ngram=2) == [7, 5, 6]


def test_prompt_lookup_no_match_means_no_drafts():
    assert lookup([1, 2, 3, 4], 4, max_ngram=3, min_ngram=1) == []
    assert lookup([1, 2, 3, 1], 4, max_ngram=3, min_ngram=2) == []       # 1-grams are off
    assert lookup([1, 2, 3, 1], 4, max_ngram=3, min_ngram=1) == [2, 3, 1]
    assert lookup([7], 4) == []


def test_prompt_lookup_commit_and_keep():
    d = PromptLookup(max_ngram=2, min_ngram=1)
    begin(d, [[1, 2, 3], [4, 5]], [9, 4], SamplingParams.columns((0.0,) * 2, (0,) * 2, (1.0,) * 2, (0, 0)))
    p = d.propose([2, 2])
    assert p.num_draft == [0, 2] and p.draft_tokens.shape == (2, 2) and p.draft_probs is None
    d.commit([0, 0], [[1], [6]])              # h0 = 1 2 3 9 1, h1 = 4 5 4 6
    d.keep([0])
    p = d.propose([3])
    assert p.num_draft == [3] and p.draft_tokens[0].tolist() == [2, 3, 9]


def test_prompt_lookup_adaptive_length():
    d = PromptLookup(max_ngram=1, min_ngram=1)
    begin(d, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1]], [2], GREEDY1)     # tail (2) -> 3 4 5 ...
    assert d.propose([4]).num_draft == [4]
    d.commit([1], [[3, 0]])                                              # 1 of 4 accepted: cap 2
    d._rows[0].history.extend([1, 2])
    assert d.propose([4]).num_draft == [2]
    d.commit([2], [[3, 4, 5]])                                           # all accepted: cap 4
    d._rows[0].history.extend([1, 2])
    assert d.propose([8]).num_draft == [4]
    fixed = PromptLookup(max_ngram=1, min_ngram=1, adaptive=False)
    begin(fixed, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1]], [2], GREEDY1)
    fixed.propose([4])
    fixed.commit([0], [[0]])
    fixed._rows[0].history.extend([1, 2])
    assert fixed.propose([4]).num_draft == [3]          # only the history limits it (the cap would be 1)


def test_prompt_lookup_backs_off_after_two_misses():
    d = PromptLookup(max_ngram=1, min_ngram=1)
    begin(d, [[1, 2, 3, 1, 2, 3, 1]], [2], GREEDY1)
    assert d.propose([2]).num_draft == [2]
    d.commit([0], [[9]])                       # miss 1: no pause
    d._rows[0].history.extend([1])
    assert d.propose([2]).num_draft == [1]       # cap = accepted + 1
    d.commit([0], [[9]])                       # miss 2: pause one round
    d._rows[0].history.extend([1])
    assert d.propose([2]).num_draft == [0]
    d.commit([0], [[5]])
    d._rows[0].history.extend([1])
    assert d.propose([2]).num_draft == [1]       # drafting again


def test_prompt_lookup_rejects_bad_ngrams():
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookup(max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match="num_pred_tokens"):
        PromptLookup(num_pred_tokens=0)


def test_draft_model_vocab_and_tokenizer_mismatch():
    target = FakeModel(vocab_size=40)
    with pytest.raises(ValueError, match=r"draft model vocab 48 != target vocab 40.*tokenizer"):
        DraftModel(FakeModel(vocab_size=48)).attach(target)

    class OtherTokenizer(type(target.tokenizer)):
        def encode(self, text):
            return [0] + super().encode(text)

    other = FakeModel(vocab_size=40, tokenizer=OtherTokenizer(40))
    with pytest.raises(ValueError, match="tokenizer"):
        DraftModel(other).attach(target)


def test_self_speculative_shares_weights():
    target = FakeModel(num_layers=3)
    d = SelfSpeculative(layers=2)
    d.attach(target)
    assert d.model.w is target.w and d.model.config.num_layers == 2
    with pytest.raises(ValueError, match="1 <= layers < the target's 3"):
        SelfSpeculative(layers=3).attach(target)


@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_oracle_acceptance_rate(alpha):
    target = FakeModel(seed=0, eos_bias=-30.0)
    prompts = [[1, 2, 3], [4, 5], [6]]
    refs = [greedy_reference(target, p, 80) for p in prompts]
    k = 4
    out = generate(target, prompts, drafter=OracleDraft(refs, alpha, seed=1), k=k, max_new_tokens=80)
    assert [g.tokens for g in out] == refs
    accepted = sum(g.stats.accepted for g in out)
    rounds = sum(g.stats.rounds for g in out)
    expected = sum(alpha**i for i in range(1, k + 1))          # E[accepted per round]
    assert abs(accepted / rounds - expected) < 0.35 * expected + 0.1


def test_oracle_rejects_sequences_without_a_continuation():
    target = FakeModel(eos_bias=-30.0)
    with pytest.raises(ValueError, match=r"1 continuations; sequences \[1\] have none"):
        generate(target, [[1, 2], [3]], drafter=OracleDraft([[1]], 0.5), k=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="acceptance_rate"):
        OracleDraft([[1]], 1.5)
