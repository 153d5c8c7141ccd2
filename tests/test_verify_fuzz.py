"""Fuzzed arguments to verify_greedy / verify_sample: a clear ValueError/TypeError, or a valid output that
the Triton kernels (under the interpreter on CPU) reproduce exactly. Never anything else: no other
exception, no token outside the vocabulary, no token the target gives probability 0, no silent token 0.
Both backends raise the same message, and unchecked calls (``check_values=False``) return the same status
words (``verispec.verify.status``) on both.

Values include NaN, +-inf, denormals, numbers near float32's max, negatives; shapes are tiny (V <= 6)
so the interpreter stays fast. Sampling temperatures that the triton comparison uses are powers of two,
so ``l / T`` (reference) and ``l * (log2(e) / T)`` (kernel) round alike, away from the documented
near-tie rounding differences.
"""
from __future__ import annotations

import math

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from triton_interpreter import DEVICE  # noqa: E402
from verispec import verify_greedy, verify_sample  # noqa: E402

SPECIAL = [float("nan"), float("inf"), float("-inf"), 1e-40, -1e-45, 3e38, -3e38, 1e30, 0.0, -0.0]
# mostly ordinary values, so that most batches are valid and the outputs get compared
VALUES = st.one_of(st.floats(-20, 20, allow_nan=False), st.floats(-20, 20, allow_nan=False),
                   st.integers(-3, 3).map(float), st.sampled_from(SPECIAL))
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def batches(draw):
    """(target_logits [R, V], draft_tokens [N], num_draft [B]) in the ragged layout, sometimes inconsistent:
    R != N + B (a metadata error), or num_draft not matching N or negative (found by the kernels when
    num_draft stays on the device, see _same_status)."""
    vocab = draw(st.integers(1, 6))
    counts = draw(st.lists(st.one_of(st.integers(0, 3), st.integers(0, 3), st.just(-1)), min_size=1, max_size=3))
    num_drafts = max(sum(counts) + draw(st.sampled_from([0, 0, 0, 0, 0, 1, -1])), 0)   # sometimes sum(k_b) != N
    rows = num_drafts + len(counts) + draw(st.sampled_from([0, 0, 0, 0, 1, -1]))      # sometimes R != N + B
    values = draw(st.lists(VALUES, min_size=max(rows, 0) * vocab, max_size=max(rows, 0) * vocab))
    logits = torch.tensor(values, dtype=torch.float32).reshape(max(rows, 0), vocab).to(draw(DTYPES))
    token = st.one_of(st.integers(0, vocab - 1), st.integers(0, vocab - 1), st.integers(-1, vocab))   # mostly valid
    drafts = draw(st.lists(token, min_size=num_drafts, max_size=num_drafts))
    return logits, torch.tensor(drafts, dtype=torch.long), torch.tensor(counts, dtype=torch.int32)


def _outcome(fn, *args, **kwargs):
    """("ok", output) or ("error", (exception type, message)); anything but ValueError/TypeError fails the test."""
    try:
        return "ok", fn(*args, **kwargs)
    except (ValueError, TypeError) as e:
        assert str(e).strip(), f"{type(e).__name__} without a message"
        return "error", (type(e), str(e))


def _same_status(fn, logits, drafts, counts, **kwargs) -> None:
    """Unchecked calls: the same outcome, and when both run, the same status word for every sequence. num_draft
    is a tensor on the logits' device and max_num_draft is given, so its values are judged by the kernels."""
    kwargs = dict(kwargs, backend="torch", check_values=False, max_num_draft=3)
    kind, ref = _outcome(fn, logits, drafts, counts, **kwargs)
    kind_t, tri = _outcome(fn, *_on_device(logits, drafts, counts), **dict(kwargs, backend="triton"))
    assert kind == kind_t, (ref, tri)
    if kind == "ok":
        assert ref.status.tolist() == tri.status.cpu().tolist()
        event("status " + ("clean" if not any(ref.status.tolist()) else "flagged"))
    else:
        assert ref == tri


def _check_output(out, logits, drafts, counts) -> None:
    """Structural truths of any valid result, whatever the values were."""
    assert out.status.tolist() == [0] * counts.shape[0]
    vocab = logits.shape[1]
    start = 0
    for b, k in enumerate(counts.tolist()):
        a = int(out.num_accepted[b])
        assert 0 <= a <= k and int(out.num_emitted[b]) == a + 1
        row = out.tokens[b].tolist()
        assert row[:a] == drafts[start:start + a].tolist()          # accepted = a prefix of the drafts
        emitted = row[a]
        assert 0 <= emitted < vocab
        assert logits[start + b + a, emitted].float() > float("-inf"), "emitted a token of probability 0"
        assert all(t == -1 for t in row[a + 1:])
        start += k


def _on_device(*tensors):
    """The Triton backend's inputs on the device its kernels run on (CUDA when there is one)."""
    return [t.to(DEVICE) for t in tensors]


def _same(x, y) -> None:
    assert torch.equal(x.tokens.cpu(), y.tokens.cpu())
    assert torch.equal(x.num_accepted.cpu(), y.num_accepted.cpu())


NEG_INF = float("-inf")
DEAD_ROW = (torch.tensor([[0.0, 1.0], [NEG_INF, NEG_INF]]), torch.tensor([1]), torch.tensor([1], dtype=torch.int32))


@FUZZ
@given(batches())
@example(DEAD_ROW)
@example((torch.tensor([[1e-40, -1e-45, 3e38]]), torch.zeros(0, dtype=torch.long), torch.tensor([0], dtype=torch.int32)))
def test_fuzz_verify_greedy(batch):
    logits, drafts, counts = batch
    kind, ref = _outcome(verify_greedy, logits, drafts, counts, backend="torch")
    kind_t, tri = _outcome(verify_greedy, *_on_device(logits, drafts, counts), backend="triton")
    assert kind == kind_t, (ref, tri)
    event(kind)
    _same_status(verify_greedy, logits, drafts, counts)
    if kind == "error":
        assert ref == tri
        return
    _check_output(ref, logits, drafts, counts)
    _same(ref, tri)
    rows = logits.float().argmax(dim=1)
    start = 0
    for b, k in enumerate(counts.tolist()):     # greedy: the emitted token is the row's argmax
        a = int(ref.num_accepted[b])
        assert int(ref.tokens[b, a]) == int(rows[start + b + a])
        start += k


TEMPERATURES = [0.0, 0.5, 1.0, 2.0, float("nan"), float("inf"), -1.0, 1e-39, 1e-7, 1e38, True, "1"]
TOP_K = [None, 0, 1, 2, 2**40, -1, 1.5]
TOP_P = [None, 1.0, 0.5, 1e-45, 0.0, 1.5, float("nan")]
SEEDS = [0, 7, 2**64 - 1, -(2**63), 1.5, 2**70, None]


@FUZZ
@given(batches(), st.data())
def test_fuzz_verify_sample(batch, data):
    logits, drafts, counts = batch
    size = counts.shape[0]
    temperature = data.draw(st.one_of(st.sampled_from(TEMPERATURES),
                                      st.lists(st.sampled_from(TEMPERATURES[:4]), min_size=size, max_size=size),
                                      st.lists(st.sampled_from(TEMPERATURES), min_size=1, max_size=4)))
    kwargs = dict(temperature=temperature, top_k=data.draw(st.sampled_from(TOP_K)),
                  top_p=data.draw(st.sampled_from(TOP_P)), seed=data.draw(st.sampled_from(SEEDS)), offset=3)
    if kwargs["seed"] is None:
        kwargs["seed"] = 11
    kind, ref = _outcome(verify_sample, logits, drafts, counts, backend="torch", **kwargs)
    kind_t, tri = _outcome(verify_sample, *_on_device(logits, drafts, counts), backend="triton", **kwargs)
    assert kind == kind_t, (ref, tri)
    event(kind)
    _same_status(verify_sample, logits, drafts, counts, **kwargs)
    if kind == "error":
        assert ref == tri
        return
    _check_output(ref, logits, drafts, counts)
    temps = temperature if isinstance(temperature, list) else [temperature]
    if all(isinstance(t, float) and (t == 0 or math.log2(t).is_integer()) for t in temps):
        _same(ref, tri)
