import pytest

from verispec import analysis


def test_expected_tokens_hand_computed():
    assert analysis.expected_tokens_per_round(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert analysis.expected_tokens_per_round(0.0, 5) == 1.0
    assert analysis.expected_tokens_per_round(1.0, 4) == 5.0
    assert analysis.expected_tokens_per_round(0.9, 4) == pytest.approx((1 - 0.9**5) / 0.1)
    assert analysis.expected_accepted(0.8, 3) == pytest.approx(0.8 + 0.64 + 0.512)


def test_expected_tokens_from_per_position_acceptance():
    for alpha in (0.0, 0.3, 0.8, 1.0):
        for k in (0, 1, 4):
            assert analysis.expected_tokens_from_positions([alpha] * k) == pytest.approx(
                analysis.expected_tokens_per_round(alpha, k), rel=1e-12)
    assert analysis.expected_tokens_from_positions([0.5, 0.8, 0.0, 1.0]) == pytest.approx(1 + 0.5 + 0.5 * 0.8)
    with pytest.raises(ValueError, match=r"alphas\[1\]"):
        analysis.expected_tokens_from_positions([0.5, 1.5])


def test_speedup_matches_seed_001_table():
    # seed 001, Llama-8B/1B on a V100: T_SD = 0.69 at K=4 (c = 0.1725), alpha = 0.9 -> 2.57x
    assert analysis.speedup(0.9, 4, 0.69 / 4) == pytest.approx(2.42, abs=0.01)
    # E_SD(0.9, 4) / (1 + T_SD) with T_SD = 0.69: 4.0951 / 1.69
    assert analysis.speedup(0.9, 4, 0.69 / 4) == pytest.approx(4.0951 / 1.69, rel=1e-6)


def test_optimal_k():
    # free drafts: more is always better up to k_max
    assert analysis.optimal_k(0.9, 0.0, k_max=16) == 16
    # expensive drafts at low acceptance: one draft
    assert analysis.optimal_k(0.3, 0.5) == 1
    # hand-checked: alpha=0.8, c=0.1 -> S(3)=2.2554, S(4)=2.4011, S(5)=2.4580, S(6)=2.4604, S(7)=2.4278
    assert analysis.optimal_k(0.8, 0.1) == 6


def test_speedup_from_times():
    # verify costs one target step: reduces to E_SD / (1 + K c)
    assert analysis.speedup_from_times(0.7, 4, 1.0, 10.0, 10.0) == pytest.approx(analysis.speedup(0.7, 4, 0.1))
    assert analysis.tokens_per_second_bound(1.0, 3, 0.0, 0.5) == pytest.approx(8.0)


@pytest.mark.parametrize("call", [
    lambda: analysis.expected_tokens_per_round(1.2, 3),
    lambda: analysis.expected_tokens_per_round(0.5, -1),
    lambda: analysis.speedup(0.5, 3, -0.1),
    lambda: analysis.optimal_k(0.5, 0.1, k_max=0),
    lambda: analysis.speedup_from_times(0.5, 3, 1.0, 0.0, 1.0),
])
def test_bad_arguments(call):
    with pytest.raises(ValueError):
        call()
