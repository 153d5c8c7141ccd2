"""Rejection sampling preserves the target distribution: chi-square tests at fixed seeds.

Significance: each test rejects at p < 1e-3. Seeds are fixed, so the tests are deterministic;
a correct sampler fails a given test with probability 1e-3 over the choice of seed, a biased
one (e.g. emitting the draft's distribution, or skipping the residual) fails with p ~ 0 at
these sample sizes (checked by ``test_chi2_detects_a_biased_sampler``).
"""

import pytest
import torch

from verispec import analysis, verify_sample
from verispec.verify.sampling import filtered_probs
from stats import chi2_pvalue

VOCAB = 10
DRAWS = 100_000
SIGNIFICANCE = 1e-3


def _fixed_p_q():
    gen = torch.Generator().manual_seed(1234)
    logits = torch.randn(VOCAB, generator=gen) * 1.5
    q = torch.softmax(torch.randn(VOCAB, generator=gen) * 1.5, dim=0)
    return logits, q


FILTERS = [
    dict(temperature=1.0, top_k=None, top_p=None),
    dict(temperature=1.0, top_k=4, top_p=None),
    dict(temperature=0.8, top_k=None, top_p=0.7),
    dict(temperature=1.3, top_k=6, top_p=0.9),
]


def _first_token_counts(mode: str, filt: dict, draws: int = DRAWS, seed: int = 11):
    logits, q = _fixed_p_q()
    gen = torch.Generator().manual_seed(seed)
    num_draft = torch.ones(draws, dtype=torch.int32)
    target_logits = logits.repeat(2 * draws, 1)  # each sequence: one draft row + the bonus row
    if mode == "draft_probs":
        drafts = torch.multinomial(q, draws, replacement=True, generator=gen)
        draft_probs = q.repeat(draws, 1)
    else:  # point-mass drafts, always the same proposal
        drafts = torch.full((draws,), 3, dtype=torch.int64)
        draft_probs = None
    out = verify_sample(target_logits, drafts, num_draft, draft_probs, seed=seed, **filt)
    counts = torch.bincount(out.tokens[:, 0].long(), minlength=VOCAB)
    p = filtered_probs(logits[None], filt["temperature"], filt["top_k"] or 0, filt["top_p"] or 1.0)[0]
    return counts, p, out


@pytest.mark.parametrize("mode", ["draft_probs", "ngram"])
@pytest.mark.parametrize("filt", FILTERS, ids=["plain", "top_k", "top_p", "all"])
def test_first_emitted_token_is_distributed_as_p(mode, filt):
    counts, p, _ = _first_token_counts(mode, filt)
    assert chi2_pvalue(counts, p) > SIGNIFICANCE, (counts.tolist(), p.tolist())


def test_chi2_detects_a_biased_sampler():
    # the draft's own distribution is not p: the test must reject it decisively
    logits, q = _fixed_p_q()
    biased = torch.multinomial(q, DRAWS, replacement=True, generator=torch.Generator().manual_seed(5))
    counts = torch.bincount(biased, minlength=VOCAB)
    assert chi2_pvalue(counts, torch.softmax(logits, 0)) < 1e-12


@pytest.mark.parametrize("mode", ["draft_probs", "ngram"])
def test_expected_accepted_matches_closed_form(mode):
    """K drafts per sequence from i.i.d. (p, q) positions: E[accepted] = sum_{i=1..K} beta^i,
    with beta = sum_v min(p_v, q_v) (= p(x) for a point-mass draft x)."""
    logits, q = _fixed_p_q()
    p = torch.softmax(logits, 0)
    draws, k = 20_000, 4
    gen = torch.Generator().manual_seed(3)
    num_draft = torch.full((draws,), k, dtype=torch.int32)
    target_logits = logits.repeat(draws * (k + 1), 1)
    if mode == "draft_probs":
        drafts = torch.multinomial(q, draws * k, replacement=True, generator=gen)
        draft_probs = q.repeat(draws * k, 1)
        beta = float(torch.minimum(p, q).sum())
    else:
        drafts = torch.full((draws * k,), 3, dtype=torch.int64)
        draft_probs = None
        beta = float(p[3])
    out = verify_sample(target_logits, drafts, num_draft, draft_probs, seed=99)
    accepted = out.num_accepted.double()
    expected = analysis.expected_accepted(beta, k)
    stderr = float(accepted.std()) / draws**0.5
    assert abs(float(accepted.mean()) - expected) < 4 * stderr, (float(accepted.mean()), expected)


def test_workload_acceptance_rate_is_exact_in_expectation():
    from verispec.verify.workloads import sampling_workload

    for draft_probs in (True, False):
        w = sampling_workload(20_000, 3, 16, 0.6, seed=4, draft_probs=draft_probs)
        out = verify_sample(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, seed=8)
        accepted = out.num_accepted.double()
        expected = analysis.expected_accepted(0.6, 3)
        assert abs(float(accepted.mean()) - expected) < 4 * float(accepted.std()) / 20_000**0.5
