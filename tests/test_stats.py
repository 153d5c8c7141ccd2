"""The chi-square helper (tests/stats.py): exact p-values, pooling, and power against a wrong distribution."""
import math

import pytest
import torch

from stats import chi2_pvalue


def _survival_even_dof(x: float, dof: int) -> float:
    """P(chi2_dof > x) for even dof, in closed form: exp(-x/2) sum_{i < dof/2} (x/2)^i / i!."""
    half = x / 2
    return math.exp(-half) * sum(half**i / math.factorial(i) for i in range(dof // 2))


@pytest.mark.parametrize("counts", [[30, 20, 50], [10, 10, 10, 10, 60], [25, 25, 25, 25, 0, 0, 0, 0, 0, 100]])
def test_pvalue_equals_the_closed_form(counts):
    """Odd numbers of bins (even dof) have a closed-form survival function to compare with."""
    counts = torch.tensor(counts)
    probs = torch.ones(len(counts))
    expected = counts.sum() / len(counts)
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert chi2_pvalue(counts, probs) == pytest.approx(_survival_even_dof(statistic, len(counts) - 1), rel=1e-12)


def test_known_quantile():
    """chi2 with 1 dof: P(X > 3.841459) = 0.05 (the two-sided z = 1.959964 squared)."""
    # two bins of probability 1/2, n = 400: statistic = (2 d)^2 / n for a deviation d from 200
    d = 1.959964 * 400**0.5 / 2
    counts = torch.tensor([200 + d, 200 - d])
    assert chi2_pvalue(counts.round(), torch.tensor([0.5, 0.5])) == pytest.approx(0.05, abs=0.01)


def test_impossible_bin_and_pooling():
    assert chi2_pvalue(torch.tensor([5, 5, 1]), torch.tensor([0.5, 0.5, 0.0])) == 0.0
    assert chi2_pvalue(torch.tensor([5, 5, 0]), torch.tensor([0.5, 0.5, 0.0])) == 1.0
    # 1000 draws, three rare bins (3 expected each) pooled into one of 9: 3 bins, 2 dof
    probs = torch.tensor([0.5, 0.491, 0.003, 0.003, 0.003])
    assert chi2_pvalue(torch.tensor([500, 491, 3, 3, 3]), probs) == pytest.approx(1.0)
    statistic = 16**2 / 491 + 16**2 / 9   # 475 in the second bin, 25 in the pool
    assert chi2_pvalue(torch.tensor([500, 475, 9, 8, 8]), probs) == pytest.approx(math.exp(-statistic / 2))
    # a pool below 5 expected joins the largest bin: [500 + 3, 497] against [501, 499]
    probs = torch.tensor([0.5, 0.499, 0.001])
    statistic = 2**2 / 501 + 2**2 / 499
    assert chi2_pvalue(torch.tensor([500, 497, 3]), probs) == pytest.approx(math.erfc((statistic / 2) ** 0.5))
    with pytest.raises(ValueError, match="counts has 3 bins but probs has 2"):
        chi2_pvalue(torch.tensor([1, 2, 3]), torch.tensor([0.5, 0.5]))
    with pytest.raises(ValueError, match="non-negative integers"):
        chi2_pvalue(torch.tensor([1.5, 2.0]), torch.tensor([0.5, 0.5]))


def test_accepts_the_right_distribution_and_rejects_a_wrong_one():
    """Power check: samples of p pass at 1e-3; samples of a distribution 5% (total variation) away fail."""
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(12, generator=gen), 0)
    wrong = torch.softmax(torch.randn(12, generator=gen) * 0.2, 0) * 0.1 + p * 0.9
    assert 0.04 < float((wrong - p).abs().sum()) / 2 < 0.06
    n = 20_000
    right_counts = torch.bincount(torch.multinomial(p, n, replacement=True, generator=gen), minlength=12)
    wrong_counts = torch.bincount(torch.multinomial(wrong, n, replacement=True, generator=gen), minlength=12)
    assert chi2_pvalue(right_counts, p) > 1e-3
    assert chi2_pvalue(wrong_counts, p) < 1e-6
