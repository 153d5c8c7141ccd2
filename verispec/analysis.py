"""Analytical model of speculative decoding (Leviathan et al. 2023: a draft step costs c target steps, so a round's drafting
costs T_SD = K * c).

Notation:
    alpha   per-position acceptance probability (i.i.d. model)
    K       drafts proposed per round
    c       cost ratio: one draft step / one target step  (T_SD = K * c)

Expected tokens per round (accepted drafts + the one recovered/bonus token):
    E_SD(alpha, K) = sum_{i=0..K} alpha^i = (1 - alpha^(K+1)) / (1 - alpha)      (= K + 1 at alpha = 1)
Expected accepted drafts per round:
    E[num_accepted] = E_SD - 1 = sum_{i=1..K} alpha^i
Per-position acceptance: when draft i (0-based) is accepted with probability alpha_i given that drafts
0..i-1 were (measured as accepted at i / tested at i: a round tests position i only if it reached it),
    E(k) = 1 + alpha_0 + alpha_0 alpha_1 + ... + alpha_0 ... alpha_{k-1}          (= E_SD with every alpha_i = alpha)
Speedup over autoregressive decoding, when one verify pass costs one target step:
    S(alpha, K, c) = E_SD(alpha, K) / (1 + K * c)
With measured times (a verify pass of K+1 tokens need not cost exactly one decode step):
    S = E_SD(alpha, K) * T_target / (K * T_draft + T_verify)
"""

from __future__ import annotations


def _check_alpha_k(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0 or int(k) != k:
        raise ValueError(f"K must be a non-negative integer, got {k}")


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E_SD = (1 - alpha^(K+1)) / (1 - alpha): tokens emitted per verify round.

    >>> expected_tokens_per_round(0.5, 2)        # 1 + 0.5 + 0.25
    1.75
    >>> expected_tokens_per_round(1.0, 4)        # every draft accepted: K + 1
    5.0
    """
    _check_alpha_k(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_tokens_from_positions(alphas) -> float:
    """E(k) = 1 + alpha_0 + alpha_0 alpha_1 + ... + alpha_0 ... alpha_{k-1} with k = len(alphas): tokens per round
    when ``alphas[i]`` is the acceptance rate at draft position i (accepted at i / tested at i).

    >>> expected_tokens_from_positions([0.5, 0.5])             # E_SD(0.5, 2)
    1.75
    >>> expected_tokens_from_positions([0.5, 0.8, 0.0, 1.0])   # 1 + 0.5 + 0.4: nothing past position 2
    1.9
    """
    total, reach = 1.0, 1.0
    for i, a in enumerate(alphas):
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"alphas[{i}] must be in [0, 1], got {a}")
        reach *= a
        total += reach
    return total


def expected_accepted(alpha: float, k: int) -> float:
    """Expected accepted drafts per round: E_SD - 1."""
    return expected_tokens_per_round(alpha, k) - 1.0


def speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """E_SD / (1 + K * c): speedup over AR when a verify pass costs one target step."""
    if cost_ratio < 0:
        raise ValueError(f"cost_ratio must be >= 0, got {cost_ratio}")
    return expected_tokens_per_round(alpha, k) / (1.0 + k * cost_ratio)


def optimal_k(alpha: float, cost_ratio: float, k_max: int = 32) -> int:
    """The K in [1, k_max] that maximizes ``speedup`` (smallest K on ties).

    >>> optimal_k(0.8, 0.05), round(speedup(0.8, optimal_k(0.8, 0.05), 0.05), 3)
    (8, 3.092)
    """
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    return max(range(1, k_max + 1), key=lambda k: (speedup(alpha, k, cost_ratio), -k))


def speedup_from_times(alpha: float, k: int, draft_step_s: float, target_s: float, target_step_s: float) -> float:
    """Predicted speedup from measured step times: E_SD * T_target / (K * T_draft + T_verify).

    draft_step_s: one draft forward (one token); target_s: one target pass scoring K + 1
    tokens; target_step_s: one target decode step (the AR baseline's cost per token).
    """
    if min(draft_step_s, target_s, target_step_s) < 0 or target_s == 0:
        raise ValueError("step times must be >= 0 and target_s > 0")
    return expected_tokens_per_round(alpha, k) * target_step_s / (k * draft_step_s + target_s)


def tokens_per_second_bound(alpha: float, k: int, draft_step_s: float, target_s: float) -> float:
    """Tokens/s a speculative loop can reach at best: E_SD / (K * T_draft + T_verify)."""
    if target_s <= 0 or draft_step_s < 0:
        raise ValueError("target_s must be > 0 and draft_step_s >= 0")
    return expected_tokens_per_round(alpha, k) / (k * draft_step_s + target_s)
