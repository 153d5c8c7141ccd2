"""Bad input raises ValueError naming the argument: never a silent wrong token."""

import pytest
import torch

from verispec import verify_greedy, verify_sample

LOGITS = torch.randn(5, 8)   # B=2, num_draft=[2, 1] -> 3 drafts + 2 bonus rows
DRAFTS = torch.tensor([1, 2, 3])
NUM_DRAFT = [2, 1]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(target_logits=LOGITS[0]), "target_logits must be a 2-D"),
        (dict(target_logits=LOGITS.long()), "target_logits must be float"),
        (dict(target_logits=LOGITS[:4]), "rows"),
        (dict(draft_tokens=DRAFTS[None]), "draft_tokens must be a 1-D"),
        (dict(draft_tokens=DRAFTS.float()), "draft_tokens must be an integer"),
        (dict(draft_tokens=torch.tensor([1, 2, 8])), r"sequence 1: draft_tokens must be in \[0, V\)"),
        (dict(draft_tokens=torch.tensor([1, -1, 2])), r"sequence 0: draft_tokens must be in \[0, V\)"),
        (dict(num_draft=[3, 0]), None),  # sums match, valid
        (dict(num_draft=[1, 1]), "num_draft sums to 2"),
        (dict(num_draft=[4, -1]), "sequence 1: num_draft must be >= 0, got -1"),
        (dict(num_draft=torch.tensor([[2, 1]])), "num_draft must be a non-empty 1-D"),
        (dict(num_draft=[]), "num_draft must be a non-empty 1-D"),
        (dict(target_logits=torch.where(torch.arange(8) == 3, float("nan"), LOGITS)),
         r"sequence 0: target_logits contains NaN \(bad sequences: \[0, 1\]\)"),
        (dict(target_logits=torch.where(torch.arange(8) == 3, float("inf"), LOGITS)), r"sequence 0: .*\+inf"),
        (dict(max_num_draft=1), "max_num_draft"),
    ],
)
@pytest.mark.parametrize("fn", [verify_greedy, verify_sample])
def test_bad_shapes_and_values(fn, kwargs, match):
    args = dict(target_logits=LOGITS, draft_tokens=DRAFTS, num_draft=NUM_DRAFT) | kwargs
    if match is None:
        fn(**args)
        return
    with pytest.raises(ValueError, match=match):
        fn(**args)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=torch.tensor([1.0, 1.0, 1.0])), "temperature must be a scalar or a"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(draft_probs=torch.rand(3, 7)), "draft vocab must equal the target vocab"),
        (dict(draft_probs=torch.rand(2, 8)), r"\[sum\(num_draft\), V\]"),
        (dict(draft_probs=torch.full((3, 8), 0.5)), r"sequence 0: draft_probs must be distributions .* summing to 1"),
        (dict(draft_probs=-torch.softmax(torch.randn(3, 8), 1)), r"sequence 0: draft_probs must be distributions \(non-negative"),
        (dict(draft_probs=torch.eye(8)[[0, 0, 0]]), "sequence 0: draft_probs .* a positive probability"),
        (dict(backend="tpu"), "backend must be one of"),
        (dict(seed=torch.tensor([1])), r"seed must be an int, a 0-d tensor .* or a \[B\]=2 tensor"),
        (dict(seed=torch.tensor([1, 2, 3])), r"seed must be .* \[B\]=2 tensor"),
        (dict(seed=torch.tensor([[1, 2]])), r"seed must be .* got shape \(1, 2\)"),
        (dict(seed=torch.tensor([1.0, 2.0])), "TypeError: seed must be an integer tensor"),
        (dict(seed=torch.tensor([True, False])), "TypeError: seed must be an integer tensor"),
        (dict(seed=1.5), r"TypeError: seed must be an integer, got 1.5 \(float\)"),
        (dict(seed=True), r"TypeError: seed must be an integer, got True \(bool\)"),
        (dict(seed=2**64), "seed must fit in 64 bits"),
        (dict(offset=torch.tensor([0])), r"offset must be an int, a 0-d tensor .* \[B\]=2 tensor"),
        (dict(offset=torch.tensor(0.0)), "TypeError: offset must be an integer tensor"),
        (dict(offset="0"), "TypeError: offset must be an integer, got '0'"),
    ],
)
def test_bad_sampling_arguments(kwargs, match):
    """A wrong value is a ValueError, a wrong type (float or bool seeds, a string) a TypeError ("TypeError: "
    in the expected message); either names the argument."""
    args = dict(target_logits=LOGITS, draft_tokens=DRAFTS, num_draft=NUM_DRAFT) | kwargs
    kind, match = (TypeError, match[len("TypeError: "):]) if match.startswith("TypeError: ") else (ValueError, match)
    with pytest.raises(kind, match=match):
        verify_sample(**args)


@pytest.mark.parametrize(
    "seed, offset",
    [(7, 3), (2**64 - 1, 0), (-(2**63), 0), (torch.tensor(7), torch.tensor(3)),
     (torch.tensor([7, 8], dtype=torch.int32), torch.tensor([3, 4])), (torch.tensor([7, 8]), 5)],
)
def test_good_seed_and_offset_forms(seed, offset):
    out = verify_sample(LOGITS, DRAFTS, NUM_DRAFT, seed=seed, offset=offset)
    assert out.tokens.shape == (2, 3)


def test_cuda_backend_on_cpu_tensors_is_a_clear_error():
    with pytest.raises(ValueError, match="backend='cuda' needs CUDA tensors"):
        verify_greedy(LOGITS, DRAFTS, NUM_DRAFT, backend="cuda")


def test_minus_inf_logits_are_allowed_and_never_emitted():
    logits = LOGITS.clone()
    logits[:, 0] = float("-inf")
    out = verify_sample(logits, torch.tensor([1, 2, 3]), NUM_DRAFT, seed=1)
    assert (out.tokens[out.tokens >= 0] != 0).all()


def test_reference_needs_per_sequence_keys():
    """The oracle takes the [B] keys verify_sample computed: a scalar there would silently give
    every sequence one stream."""
    from verispec.verify.reference import reference_verify_sample

    args = (LOGITS, DRAFTS, torch.tensor(NUM_DRAFT), 2, None, torch.ones(2), torch.zeros(2, dtype=torch.int32),
            torch.ones(2))
    with pytest.raises(ValueError, match=r"seed must be a \[B\]=2 integer tensor"):
        reference_verify_sample(*args, 7, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"offset must be a \[B\]=2 integer tensor"):
        reference_verify_sample(*args, torch.tensor([1, 2]), torch.zeros(2))
    out = reference_verify_sample(*args, torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int64))
    assert out.tokens.shape == (2, 3)
