"""The status word (verispec/verify/status.py): every backend finds the same bad inputs in its own read of the
data, the public call raises the same error naming the sequence, reads the device back exactly once, and the
engine, which reads the words at its one per-round read, fails the request of the named row alone.

Triton runs on CPU tensors under the interpreter and on CUDA tensors on a GPU (``DEVICE``); the torch reference
runs anywhere. Layout of every case: B = 3, num_draft = [2, 0, 3] -> rows 0-2 (sequence 0: two draft rows, bonus),
row 3 (sequence 1: bonus only), rows 4-7 (sequence 2: three draft rows, bonus).
"""
from __future__ import annotations

import collections
import functools
import inspect
import os

import pytest
import torch

from fakes import FakeModel
from test_engine import noisy_copy
from triton_interpreter import DEVICE
import verispec
from verispec import verify_greedy, verify_sample
from verispec.drafters import DraftModel
from verispec.engine import Request, Scheduler, SchedulerConfig
from verispec.verify import status

V = 16
NUM_DRAFT = [2, 0, 3]
NAN, INF = float("nan"), float("inf")


def _case():
    """(logits [8, V], drafts [5]): every draft is its row's argmax except sequence 2's second (rejected at 1)."""
    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(0))
    argmax = logits.argmax(1)
    drafts = torch.stack([argmax[0], argmax[1], argmax[4], (argmax[5] + 1) % V, argmax[6]])
    return logits, drafts


def _with(row, col, value):
    logits, drafts = _case()
    logits[row, col] = value
    return logits, drafts


def _dead(row):
    logits, drafts = _case()
    logits[row] = -INF
    return logits, drafts


def _bad_draft():
    logits, drafts = _case()
    drafts[3] = V                                   # sequence 2's second draft
    return logits, drafts


# name -> (inputs, the sequence named, the message); rows 6 and 7 lie after sequence 2's first rejection
CASES = {
    "nan-first-row": (lambda: _with(0, 3, NAN), 0, status.MESSAGES[status.NAN]),
    "nan-after-rejection": (lambda: _with(6, 9, NAN), 2, status.MESSAGES[status.NAN]),
    "nan-bonus-row": (lambda: _with(7, V - 1, NAN), 2, status.MESSAGES[status.NAN]),
    "nan-bonus-only-sequence": (lambda: _with(3, 0, NAN), 1, status.MESSAGES[status.NAN]),
    "pos-inf": (lambda: _with(5, 2, INF), 2, status.MESSAGES[status.POS_INF]),
    "dead-row": (lambda: _dead(2), 0, status.MESSAGES[status.DEAD_ROW]),
    "draft-id": (_bad_draft, 2, status.MESSAGES[status.DRAFT_ID]),
}
BACKENDS = ["torch", "triton"]


def _on(backend, *tensors):
    device = DEVICE if backend == "triton" else "cpu"
    return [t.to(device) for t in tensors]


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    return str(e.value)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("fn", [verify_greedy, verify_sample], ids=["greedy", "sample"])
def test_bad_values_raise_the_same_error_on_every_backend(name, fn):
    make, seq, message = CASES[name]
    errors = {be: _error(fn, *_on(be, *make()), NUM_DRAFT, backend=be) for be in BACKENDS}
    assert errors["torch"] == errors["triton"]
    assert errors["torch"].startswith(f"sequence {seq}: {message}")


@pytest.mark.parametrize("name", CASES)
def test_unchecked_calls_return_the_same_status(name):
    make, seq, _ = CASES[name]
    words = {}
    for be in BACKENDS:
        logits, drafts = _on(be, *make())
        out = verify_sample(logits, drafts, NUM_DRAFT, backend=be, check_values=False, seed=1)
        words[be] = out.status.tolist()
    assert words["torch"] == words["triton"]
    assert [b for b, w in enumerate(words["torch"]) if w] == [seq]


def test_clean_batch_has_a_zero_status():
    for be in BACKENDS:
        out = verify_greedy(*_on(be, *_case()), NUM_DRAFT, backend=be)
        assert out.status.tolist() == [0, 0, 0] and out.num_accepted.tolist() == [2, 0, 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_length_mismatch_on_the_device_is_found_by_the_kernel(backend):
    """num_draft as a tensor on the logits' device with max_num_draft: no host read, the kernels check it."""
    logits, drafts = _on(backend, *_case())
    for counts, seqs in [([3, 0, 2], []), ([2, 0, 2], [0, 1, 2]), ([6, -1, 0], [0, 1]), ([2, 4, -1], [1, 2])]:
        num_draft = _on(backend, torch.tensor(counts, dtype=torch.int32))[0]
        out = verify_greedy(logits, drafts, num_draft, max_num_draft=3, backend=backend, check_values=False)
        bad = [b for b, w in enumerate(out.status.tolist()) if w]
        assert bad == seqs and all(w == status.NUM_DRAFT for w in out.status.tolist() if w), (counts, out.status)
    error = _error(verify_sample, logits, drafts, num_draft, max_num_draft=3, backend=backend)
    assert error.startswith(f"sequence 1: {status.MESSAGES[status.NUM_DRAFT]}")


def test_a_length_mismatch_given_on_the_host_is_refused_before_the_launch():
    logits, drafts = _case()
    for be in BACKENDS:
        assert "num_draft sums to 4 but draft_tokens has 5" in _error(verify_greedy, logits, drafts, [2, 0, 2],
                                                                       backend=be)


@pytest.mark.parametrize("settings, seq", [(dict(temperature=torch.tensor([1.0, NAN, 1.0])), 1),
                                           (dict(temperature=torch.tensor([1.0, 1.0, 1e-9])), 2),
                                           (dict(top_k=torch.tensor([0, -2, 0])), 1),
                                           (dict(top_p=torch.tensor([0.0, 1.0, 1.0])), 0)])
def test_bad_tensor_settings(settings, seq):
    errors = {}
    for be in BACKENDS:
        kwargs = {name: _on(be, value)[0] for name, value in settings.items()}
        errors[be] = _error(verify_sample, *_on(be, *_case()), NUM_DRAFT, backend=be, seed=2, **kwargs)
    assert errors["torch"] == errors["triton"]
    assert errors["torch"].startswith(f"sequence {seq}: {status.MESSAGES[status.SETTINGS]}")


def _bad_q(kind: str) -> torch.Tensor:
    logits, drafts = _case()
    q = torch.softmax(torch.randn(5, V, generator=torch.Generator().manual_seed(1)), 1)
    if kind == "nan":
        q[4, 3] = NAN                               # sequence 2's last draft (after its rejection)
    elif kind == "negative":
        q[4, 3] = -0.5
    elif kind == "sum":
        q[4] *= 1.5
    else:                                           # q(draft) = 0
        q[4, drafts[4]] = 0.0
        q[4] /= q[4].sum()
    return q


@pytest.mark.parametrize("kind", ["nan", "negative", "sum", "zero-at-draft"])
def test_bad_draft_probs(kind):
    errors = {}
    for be in BACKENDS:
        logits, drafts, q = _on(be, *_case(), _bad_q(kind))
        errors[be] = _error(verify_sample, logits, drafts, NUM_DRAFT, q, backend=be, seed=3)
    assert errors["torch"] == errors["triton"]
    assert errors["torch"].startswith(f"sequence 2: {status.MESSAGES[status.DRAFT_PROBS]}")


def test_scaled_logits_only_matter_for_sampled_sequences():
    logits, drafts = _case()
    logits[3] *= 1e35                                    # sequence 1's bonus row: |l / T| > 2**30
    for be in BACKENDS:
        args = _on(be, logits, drafts)
        error = _error(verify_sample, *args, NUM_DRAFT, backend=be, seed=4)
        assert error.startswith(f"sequence 1: {status.MESSAGES[status.SCALED]}")
        greedy_row = _on(be, torch.tensor([1.0, 0.0, 1.0]))[0]
        out = verify_sample(*args, NUM_DRAFT, backend=be, seed=4, temperature=greedy_row)   # T = 0: exact argmax
        assert out.status.tolist() == [0, 0, 0]


# ------------------------------------------------------------------------------------------ one read-back
CONVERSIONS = ("cpu", "tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__")


PACKAGE = os.path.dirname(os.path.abspath(verispec.__file__))


def _in_package(filename: str) -> str | None:
    """``filename`` relative to the verispec package ("verify/api.py"), or None outside it. From the package's own
    location: the checkout's folder may have any name, "verispec" included."""
    path = os.path.abspath(filename)
    if not path.startswith(PACKAGE + os.sep):
        return None
    return os.path.relpath(path, PACKAGE).replace(os.sep, "/")


def _count_reads(monkeypatch, fn) -> collections.Counter:
    """Every tensor -> host conversion made from verispec's own code while ``fn()`` runs, by call site."""
    sites = collections.Counter()

    def recorder(name, original):
        def conversion(self, *args, **kwargs):
            caller = inspect.currentframe().f_back
            path = _in_package(caller.f_code.co_filename)
            if path is not None:
                sites[(path, caller.f_code.co_name, name)] += 1
            return original(self, *args, **kwargs)
        return conversion

    with monkeypatch.context() as patch:
        for name in CONVERSIONS:
            patch.setattr(torch.Tensor, name, recorder(name, getattr(torch.Tensor, name)))
        fn()
    return sites


ONE_READ = {("verify/api.py", "_checked", "tolist"): 1}


@pytest.mark.parametrize("fn, kwargs", [(verify_greedy, {}), (verify_sample, dict(seed=5)),
                                        (verify_sample, dict(seed=5, temperature=[0.5, 0.0, 1.0], top_k=4))],
                         ids=["greedy", "sample", "sample-settings"])
def test_the_default_call_reads_the_device_once(monkeypatch, fn, kwargs):
    logits, drafts = _on("triton", *_case())
    q = _on("triton", torch.softmax(torch.randn(5, V), 1))[0] if fn is verify_sample else None
    args = (logits, drafts, NUM_DRAFT) + ((q,) if q is not None else ())
    assert _count_reads(monkeypatch, lambda: fn(*args, backend="triton", **kwargs)) == ONE_READ
    assert _count_reads(monkeypatch, lambda: fn(*args, backend="triton", check_values=False, **kwargs)) == {}


def test_the_read_counter_sees_a_second_read(monkeypatch):
    """The counter above is not blind: a second conversion in verispec's code (here raise_for_status handed a
    tensor, which it converts itself) shows up beside the first."""
    import verispec.verify.api as api

    monkeypatch.setattr(api, "raise_for_status", lambda words: status.raise_for_status(torch.tensor(words)))
    sites = _count_reads(monkeypatch, lambda: verify_greedy(*_on("triton", *_case()), NUM_DRAFT, backend="triton"))
    assert sites == {**ONE_READ, ("verify/status.py", "raise_for_status", "tolist"): 1}


# ------------------------------------------------------------------------------------------ the engine
def _scheduler(backend, requests, max_new_tokens=12):
    target = FakeModel(seed=0, eos_bias=-30.0)
    drafter = DraftModel(noisy_copy(target, 0.15))
    drafter.attach(target)
    sched = Scheduler(target, drafter, SchedulerConfig(3, 64, 3), verify_backend=backend)
    seqs = [sched.submit(Request(p, max_new_tokens, temperature=t, seed=i, id=i))
            for i, (p, t) in enumerate(requests)]
    return target, sched, seqs


@functools.lru_cache(maxsize=None)
def _run_with_nan(backend, temperature, fault) -> tuple:
    """Requests [1, 2, 3] and [4, 5] at ``temperature``, [6] at the other one, 6 tokens each; ``fault`` = (row,
    position): NaN there in the target pass of the second round. -> (finish_reason, error, tokens) per request
    (cached: the fault-free run serves every position)."""
    requests = [([1, 2, 3], temperature), ([4, 5], temperature), ([6], 1.0 - temperature)]
    target, sched, seqs = _scheduler(backend, requests, max_new_tokens=6)
    sched.step()
    assert all(s.finish_reason is None for s in seqs)
    target.nan_at = fault
    sched.run()
    return tuple((s.finish_reason, s.error, s.generated) for s in seqs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("position", [0, 3], ids=["first-row", "bonus-row"])
def test_the_engine_fails_only_the_row_the_status_word_names(backend, temperature, position):
    """NaN in row 1's logits: request 1 ends with the reason; the other two run on and emit exactly what they
    emit without the fault (their rows are verified from their own logits and streams)."""
    if backend == "triton" and DEVICE != "cpu":
        pytest.skip("the fake model's CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")
    clean, broken = _run_with_nan(backend, temperature, None), _run_with_nan(backend, temperature, (1, position))
    assert broken[1][:2] == ("error", f"verification refused this round's target logits: {status.MESSAGES[status.NAN]}")
    assert [clean[0], clean[2]] == [broken[0], broken[2]] and clean[0][:2] == clean[2][:2] == ("length", None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refused_admission_fails_only_its_own_request(backend):
    """NaN in one prompt's logits: that request ends with the reason and no token; the others admitted with it
    run on and emit exactly what they emit alone."""
    if backend == "triton" and DEVICE != "cpu":
        pytest.skip("the fake model's CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)")

    def run(nan_on_admit):
        target, sched, seqs = _scheduler(backend, [([1, 2, 3], 0.0), ([4, 5], 0.0), ([6], 0.0)], 8)
        target.nan_on_admit = nan_on_admit
        sched.run()
        return seqs

    clean, broken = run(None), run(1)
    assert broken[1].finish_reason == "error" and broken[1].generated == []
    assert broken[1].error == f"verification refused the prompt's logits: {status.MESSAGES[status.NAN]}"
    for a, b in ((clean[0], broken[0]), (clean[2], broken[2])):
        assert b.finish_reason == a.finish_reason != "error" and b.generated == a.generated


# ------------------------------------------------------------------------------------------ GPU, full size
@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="full-size vocabulary: needs a CUDA GPU (and TRITON_INTERPRET unset)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_vocab_nan_in_the_last_chunk_of_a_late_row(dtype):
    """V = 128256 split across many programs: a NaN in the last element of a row after the first rejection."""
    vocab, num_draft = 128256, [4] * 8 + [0] * 4
    rows = sum(num_draft) + len(num_draft)
    logits = torch.randn(rows, vocab, device="cuda").to(dtype)
    drafts = torch.full((sum(num_draft),), 7, device="cuda")        # rejected at once (almost surely)
    logits[5 + 3, vocab - 1] = NAN                                   # sequence 1's fourth row (rows 5-9)
    logits[rows - 1] = -INF                                          # the last sequence's bonus row
    for fn in (verify_greedy, verify_sample):
        out = fn(logits, drafts, num_draft, backend="triton", check_values=False)
        words = out.status.tolist()
        assert words[1] == status.NAN and words[-1] == status.DEAD_ROW and sum(map(bool, words)) == 2
        assert _error(fn, logits, drafts, num_draft, backend="triton").startswith(
            f"sequence 1: {status.MESSAGES[status.NAN]} (bad sequences: [1, {len(num_draft) - 1}])")
