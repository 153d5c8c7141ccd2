"""The status word of the backend="cuda" kernels on bad inputs (GPU): each bad input sets its bit
(``verispec.verify.status``) on exactly the sequence it belongs to, every other sequence keeps status 0 and
its tokens, and nothing is read out of bounds.

The bad value sits in a row or draft past the sequence's first rejection (the workloads reject the first
draft of every sequence), so the tests also show that every row of a sequence is read. Batches go straight
to the launchers (tests/cuda_batch.py): the public API would refuse them before any kernel runs.

Out-of-bounds reads: run this file under compute-sanitizer (``VERISPEC_MEMCHECK=1`` adds the test that
does so), e.g. ``compute-sanitizer --tool memcheck --error-exitcode 9 python -m pytest tests/test_cuda_status.py``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cuda_batch import ragged_batch
from verispec.verify import status as st
from verispec.verify.workloads import greedy_workload, sampling_workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

B, K, V = 4, 3, 5003  # 16 rows; V spans 2 pass-1 chunks at this row count
BAD = 1               # the sequence that gets the bad input
ROWS_OF = lambda b, i: b * (K + 1) + i  # noqa: E731  target row of sequence b's position i (every k_b = K)
DRAFT_OF = lambda b, i: b * K + i      # noqa: E731


# ---- greedy --------------------------------------------------------------------------------
def _greedy_inputs():
    w = greedy_workload(B, K, V, 0.0, dtype=torch.float32, device="cuda", seed=4)  # alpha 0: the first draft rejected
    return w.target_logits.clone(), w.draft_tokens.clone(), [K] * B


def _greedy_status(logits, drafts, num_draft, max_num_draft=K):
    from verispec.verify.cuda import GREEDY_VARIANTS, verify_greedy_cuda

    batch = ragged_batch(logits, drafts, num_draft, max_num_draft)
    outs = [verify_greedy_cuda(batch, variant=v, argmax=a) for v in GREEDY_VARIANTS for a in ("v2", "v3", "bal-t256-u8")]
    torch.cuda.synchronize()
    for out in outs[1:]:
        assert torch.equal(out.status, outs[0].status)
    return outs


def _set(tensor, index, value):
    tensor[index] = value
    return tensor


GREEDY_CASES = {
    "nan": (lambda l, d: (_set(l, (ROWS_OF(BAD, 2), 17), float("nan")), d), st.NAN),
    "pos_inf_bonus_row": (lambda l, d: (_set(l, (ROWS_OF(BAD, K), 5), float("inf")), d), st.POS_INF),
    "dead_row": (lambda l, d: (_set(l, ROWS_OF(BAD, 2), float("-inf")), d), st.DEAD_ROW),
    "draft_id_v": (lambda l, d: (l, _set(d, DRAFT_OF(BAD, 2), V)), st.DRAFT_ID),
    "draft_id_negative": (lambda l, d: (l, _set(d, DRAFT_OF(BAD, 1), -1)), st.DRAFT_ID),
    "draft_id_wraps_int32": (lambda l, d: (l, _set(d, DRAFT_OF(BAD, 2), 2**32 + 5)), st.DRAFT_ID),
}


@pytest.mark.parametrize("case", sorted(GREEDY_CASES))
def test_greedy_status_bit(case):
    logits, drafts, num_draft = _greedy_inputs()
    clean = _greedy_status(logits, drafts, num_draft)[0]
    assert clean.status.tolist() == [0] * B
    make_bad, bit = GREEDY_CASES[case]
    for out in _greedy_status(*make_bad(logits, drafts), num_draft):
        assert out.status.tolist() == [bit if b == BAD else 0 for b in range(B)]
        others = [b for b in range(B) if b != BAD]
        assert torch.equal(out.tokens[others], clean.tokens[others])


# num_draft that does not fit the inputs: (num_draft, max_num_draft, the sequences flagged)
LAYOUT_CASES = {
    "k_above_max": ([3, 5, 1, 3], 4, [1]),        # sum still 12: only sequence 1 is wrong
    "k_negative": ([3, -1, 7, 3], 7, [1]),        # sum 12; sequence 2's rows are in range (read, meaningless)
    "sum_short": ([3, 3, 3, 2], K, [0, 1, 2, 3]),  # sum 11 + B != 16 rows: every sequence
    "sum_long": ([3, 3, 3, 9], 9, [0, 1, 2, 3]),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_greedy_status_num_draft(case):
    logits, drafts, _ = _greedy_inputs()
    num_draft, max_k, flagged = LAYOUT_CASES[case]
    for out in _greedy_status(logits, drafts, num_draft, max_k):
        status = out.status.tolist()
        assert all(status[b] & st.NUM_DRAFT for b in flagged), status
        assert all(status[b] == 0 for b in range(B) if b not in flagged), status
        for b in flagged:  # nothing of a sequence without a sound layout is emitted
            assert out.tokens[b].tolist() == [-1] * (max_k + 1) and int(out.num_emitted[b]) == 0


# ---- sampling ------------------------------------------------------------------------------
def _sample_inputs():
    # alpha 0: p and q have disjoint supports, so every first draft is rejected
    w = sampling_workload(B, K, V, 0.0, device="cuda", seed=6)
    settings = dict(temperature=torch.tensor([1.0, 1.0, 0.0, 0.8]), top_k=torch.zeros(B, dtype=torch.int32),
                    top_p=torch.ones(B), seed=torch.tensor([11, 12, 13, 14]))
    return w.target_logits.clone(), w.draft_tokens.clone(), w.draft_probs.clone(), settings


def _sample_outs(logits, drafts, q, settings, num_draft=None, max_num_draft=K, check=True):
    from verispec.verify.cuda import verify_sample_cuda

    batch = ragged_batch(logits, drafts, [K] * B if num_draft is None else num_draft, max_num_draft,
                         draft_probs=q, **settings)
    outs = [verify_sample_cuda(batch, race_blocks_per_sm=split, check_draft_probs=check) for split in (0, 8)]
    torch.cuda.synchronize()
    assert torch.equal(outs[0].status, outs[1].status)
    assert torch.equal(outs[0].tokens, outs[1].tokens)
    return outs[0]


def _setting(name, b, value):
    def make(l, d, q, s):
        s = dict(s)
        s[name] = s[name].clone()
        s[name][b] = value
        return l, d, q, s
    return make


def _scale_q_row(factor):
    def make(l, d, q, s):
        q[DRAFT_OF(BAD, 2)] *= factor
        return l, d, q, s
    return make


SAMPLE_CASES = {
    "nan": (lambda l, d, q, s: (_set(l, (ROWS_OF(BAD, 2), 17), float("nan")), d, q, s), st.NAN, BAD),
    "nan_greedy_sequence": (lambda l, d, q, s: (_set(l, (ROWS_OF(2, 1), 9), float("nan")), d, q, s), st.NAN, 2),
    "pos_inf": (lambda l, d, q, s: (_set(l, (ROWS_OF(BAD, K), 5), float("inf")), d, q, s), st.POS_INF, BAD),
    "dead_row": (lambda l, d, q, s: (_set(l, ROWS_OF(BAD, 2), float("-inf")), d, q, s), st.DEAD_ROW, BAD),
    "scaled": (lambda l, d, q, s: (_set(l, (ROWS_OF(BAD, 2), 3), 2e9), d, q, s), st.SCALED, BAD),
    "scaled_by_temperature": (lambda l, d, q, s: _setting("temperature", BAD, 1e-5)(
        _set(l, (ROWS_OF(BAD, 1), 3), 2e5), d, q, s), st.SCALED, BAD),  # 2e5 / 1e-5 = 2e10
    "draft_id": (lambda l, d, q, s: (l, _set(d, DRAFT_OF(BAD, 2), V + 7), q, s), st.DRAFT_ID, BAD),
    "draft_id_negative": (lambda l, d, q, s: (l, _set(d, DRAFT_OF(BAD, 0), -3), q, s), st.DRAFT_ID, BAD),
    "temperature_negative": (_setting("temperature", BAD, -1.0), st.SETTINGS, BAD),
    "temperature_nan": (_setting("temperature", BAD, float("nan")), st.SETTINGS, BAD),
    "temperature_inf": (_setting("temperature", BAD, float("inf")), st.SETTINGS, BAD),
    "temperature_tiny": (_setting("temperature", BAD, 1e-7), st.SETTINGS, BAD),
    "top_k_negative": (_setting("top_k", BAD, -1), st.SETTINGS, BAD),
    "top_p_above_one": (_setting("top_p", BAD, 1.5), st.SETTINGS, BAD),
    "top_p_nan": (_setting("top_p", BAD, float("nan")), st.SETTINGS, BAD),
    "top_p_zero_greedy": (_setting("top_p", 2, 0.0), st.SETTINGS, 2),  # T = 0: not a filter, still out of range
    "q_nan": (lambda l, d, q, s: (l, d, _set(q, (DRAFT_OF(BAD, 2), 4), float("nan")), s), st.DRAFT_PROBS, BAD),
    "q_negative": (lambda l, d, q, s: (l, d, _set(q, (DRAFT_OF(BAD, 2), 4), -0.25), s), st.DRAFT_PROBS, BAD),
    "q_sum_half": (_scale_q_row(0.5), st.DRAFT_PROBS, BAD),
}


@pytest.mark.parametrize("case", sorted(SAMPLE_CASES))
def test_sample_status_bit(case):
    logits, drafts, q, settings = _sample_inputs()
    clean = _sample_outs(logits, drafts, q, settings)
    assert clean.status.tolist() == [0] * B
    make_bad, bit, bad_seq = SAMPLE_CASES[case]
    out = _sample_outs(*make_bad(logits, drafts, q, settings))
    assert out.status.tolist() == [bit if b == bad_seq else 0 for b in range(B)]
    others = [b for b in range(B) if b != bad_seq]
    assert torch.equal(out.tokens[others], clean.tokens[others])


def test_sample_q_of_the_draft_is_checked_without_the_row_check():
    """check_draft_probs=False skips reading whole q rows (a bad entry elsewhere goes unseen), but the q(x) the
    accept test reads is always checked: a drafted token with q(x) = 0 sets DRAFT_PROBS."""
    logits, drafts, q, settings = _sample_inputs()
    x = int(drafts[DRAFT_OF(BAD, 1)])
    q[DRAFT_OF(BAD, 1), x + 1 if x + 1 < V // 2 else x - 1] = float("nan")  # in q's support, not the draft
    assert _sample_outs(logits, drafts, q, settings, check=False).status.tolist() == [0] * B
    q[DRAFT_OF(BAD, 2), int(drafts[DRAFT_OF(BAD, 2)])] = 0.0
    expected = [st.DRAFT_PROBS if b == BAD else 0 for b in range(B)]
    assert _sample_outs(logits, drafts, q, settings, check=False).status.tolist() == expected


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_sample_status_num_draft(case):
    logits, drafts, q, settings = _sample_inputs()
    num_draft, max_k, flagged = LAYOUT_CASES[case]
    out = _sample_outs(logits, drafts, q, settings, num_draft, max_k)
    status = out.status.tolist()
    assert all(status[b] & st.NUM_DRAFT for b in flagged), status
    for b in flagged:
        assert out.tokens[b].tolist() == [-1] * (max_k + 1) and int(out.num_emitted[b]) == 0


@pytest.mark.skipif(os.environ.get("VERISPEC_MEMCHECK") != "1" or shutil.which("compute-sanitizer") is None,
                    reason="set VERISPEC_MEMCHECK=1 (with compute-sanitizer on PATH) to rerun these under memcheck")
def test_bad_inputs_read_nothing_out_of_bounds():
    tests = Path(__file__).resolve().parent
    cmd = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9", sys.executable, "-m", "pytest", "-q",
           "-x", "-p", "no:cacheprovider", str(tests / "test_cuda_status.py"), "-k", "not out_of_bounds"]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "VERISPEC_MEMCHECK": "0"},
                            timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
