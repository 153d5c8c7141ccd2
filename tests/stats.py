"""The one goodness-of-fit helper every statistical test uses (no scipy needed; its own tests: test_stats.py)."""

import torch

MIN_EXPECTED = 5.0   # Pearson's chi-square approximation needs about 5 expected counts per bin


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = MIN_EXPECTED) -> float:
    """Pearson chi-square goodness-of-fit p-value of observed ``counts`` [V] against ``probs`` [V].

    ``probs`` need not be normalized. A count in a bin of probability 0 is impossible under
    ``probs``: p = 0. Bins expected to hold fewer than ``min_expected`` counts are pooled into
    one bin (the chi-square approximation is poor for them); a pool still below ``min_expected``
    is merged into the largest bin instead.
    The survival function of chi-square with d degrees of freedom at x is the regularized upper
    incomplete gamma Q(d/2, x/2), computed in float64.
    """
    counts, probs = counts.double().flatten(), probs.double().flatten()
    if counts.shape != probs.shape:
        raise ValueError(f"counts has {counts.numel()} bins but probs has {probs.numel()}")
    if bool((probs < 0).any()) or float(probs.sum()) <= 0:
        raise ValueError("probs must be >= 0 with a positive sum")
    if bool((counts < 0).any()) or not torch.equal(counts, counts.round()):
        raise ValueError("counts must be non-negative integers")
    support = probs > 0
    if bool((counts[~support] > 0).any()):
        return 0.0
    counts, expected = counts[support], probs[support] / probs[support].sum() * counts.sum()
    small = expected < min_expected
    if bool(small.any()):
        pooled_obs, pooled_exp = counts[small].sum(), expected[small].sum()
        counts, expected = counts[~small], expected[~small]
        if pooled_exp < min_expected and counts.numel() > 0:   # too small even pooled: merge into the largest bin
            top = int(expected.argmax())
            counts, expected = counts.clone(), expected.clone()
            counts[top] += pooled_obs
            expected[top] += pooled_exp
        else:
            counts = torch.cat([counts, pooled_obs[None]])
            expected = torch.cat([expected, pooled_exp[None]])
    dof = counts.numel() - 1
    if dof <= 0:
        return 1.0   # one bin: every sample lands in it, nothing to test
    statistic = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))
