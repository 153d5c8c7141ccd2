"""Small statistics helpers shared by the distribution tests (no scipy needed)."""

import torch


def chi2_pvalue(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness-of-fit p-value of integer counts against probabilities.

    Categories with zero expected probability must have zero counts (else p = 0). The survival
    function of chi2 with d degrees of freedom is the regularized upper gamma Q(d/2, x/2).
    """
    observed = observed.double()
    total = observed.sum()
    support = expected_probs > 0
    if bool((observed[~support] > 0).any()):
        return 0.0
    expected = expected_probs[support].double() / expected_probs[support].double().sum() * total
    statistic = ((observed[support] - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    if dof <= 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))
