import pytest
import torch
from hypothesis import given, settings, strategies as st

from verispec import verify_greedy, verify_sample
from verispec.verify.workloads import greedy_workload, sampling_workload


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 8),
    st.one_of(st.integers(0, 8), st.lists(st.integers(0, 8), min_size=8, max_size=8)),
    st.integers(2, 300),
    st.floats(0, 1),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    st.integers(0, 10**6),
)
def test_greedy_workload_answer_equals_reference(batch, num_draft, vocab, alpha, dtype, seed):
    if isinstance(num_draft, list):
        num_draft = num_draft[:batch]
    w = greedy_workload(batch, num_draft, vocab, alpha, dtype=dtype, seed=seed)
    out = verify_greedy(w.target_logits, w.draft_tokens, w.num_draft)
    assert torch.equal(out.tokens, w.expected.tokens)
    assert torch.equal(out.num_accepted, w.expected.num_accepted)
    assert w.target_logits.dtype == dtype


def test_greedy_workload_acceptance_extremes():
    assert greedy_workload(16, 6, 100, 1.0).expected.num_accepted.tolist() == [6] * 16
    assert greedy_workload(16, 6, 100, 0.0).expected.num_accepted.tolist() == [0] * 16


def test_sampling_workload_is_valid_input():
    w = sampling_workload(4, [0, 2, 5, 1], 64, 0.5, seed=3)
    assert w.draft_probs.shape == (8, 64)
    assert torch.allclose(w.draft_probs.sum(1), torch.ones(8))
    verify_sample(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, seed=0)


@pytest.mark.parametrize("bad, match", [
    (dict(batch_size=0), "batch_size"), (dict(vocab_size=1), "vocab_size"),
    (dict(acceptance_rate=1.5), "acceptance_rate"), (dict(num_draft=[1, 2]), "entries for batch_size"),
])
def test_workload_bad_arguments(bad, match):
    args = dict(batch_size=3, num_draft=2, vocab_size=10, acceptance_rate=0.5) | bad
    with pytest.raises(ValueError, match=match):
        greedy_workload(**args)
