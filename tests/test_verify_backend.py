"""backend=None: the measured choice (verispec/verify/backend.py) on synthetic tables, the committed table, and
the wiring from verify_greedy / verify_sample through pick_backend."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import torch

from verispec.verify import api, backend, verify_greedy, verify_sample
from verispec.verify.backend import BACKENDS, FALLBACK, parse_table, pick_from_table

ROOT = Path(__file__).resolve().parents[1]
GPU = "Fake GPU 80GB"
V = 128256


def point(B, K, us, dtype="float32", vocab=V):
    return {"B": B, "K": K, "V": vocab, "dtype": dtype, "us": us}


def table(greedy=(), sampling=(), gpu=GPU):
    return parse_table({"devices": {gpu: {"source": "test", "provisional": False,
                                          "greedy": list(greedy), "sampling": list(sampling)}}})


# small B: triton faster; large B: cuda faster (the H100's greedy shape)
SMALL_TRITON_LARGE_CUDA = table(greedy=[point(1, 4, {"triton": 5.0, "cuda": 9.0}),
                                        point(128, 4, {"triton": 140.0, "cuda": 120.0})])


def pick(tab, B, K, greedy=True, dtype="float32", vocab=V, **kw):
    return pick_from_table(tab, GPU, greedy, B, K, vocab, dtype, **kw)


# ---------------------------------------------------------------------------------------------- the lookup
@pytest.mark.parametrize("B, expected", [(1, "triton"), (2, "triton"), (8, "triton"), (16, "cuda"), (128, "cuda"),
                                         (1024, "cuda")])
def test_the_nearest_point_in_log_b_decides(B, expected):
    # log2 midpoint of 1 and 128 is B = 11.3: below it the B=1 point is nearer
    assert pick(SMALL_TRITON_LARGE_CUDA, B, 4) == expected


def test_k_and_v_count_in_log_scale():
    tab = table(greedy=[point(8, 1, {"triton": 9.0, "cuda": 8.0}), point(8, 8, {"triton": 20.0, "cuda": 30.0})])
    assert pick(tab, 8, 1) == "cuda"
    assert pick(tab, 8, 2) == "cuda"      # log2(3) is nearer log2(2) than log2(9)
    assert pick(tab, 8, 5) == "triton"    # log2(6) is nearer log2(9)
    assert pick(tab, 8, 0) == "cuda"      # K = 0 (no drafts) is a point: K + 1 = 1 row
    by_vocab = table(greedy=[point(8, 4, {"triton": 1.0, "cuda": 2.0}, vocab=32000),
                             point(8, 4, {"triton": 2.0, "cuda": 1.0}, vocab=152064)])
    assert pick(by_vocab, 8, 4, vocab=32768) == "triton"
    assert pick(by_vocab, 8, 4, vocab=128256) == "cuda"


def test_an_unknown_gpu_or_an_unmeasured_mode_gets_the_fallback():
    assert FALLBACK == "triton"
    assert pick_from_table(SMALL_TRITON_LARGE_CUDA, "Some Other GPU", True, 128, 4, V, "float32") == "triton"
    # greedy points say cuda at B=128, but they say nothing about sampling
    assert pick(SMALL_TRITON_LARGE_CUDA, 128, 4, greedy=False) == "triton"
    assert pick(table(), 128, 4) == "triton"


def test_sampling_with_possible_filters_never_gets_cuda():
    tab = table(sampling=[point(128, 8, {"triton": 300.0, "cuda": 200.0}), point(1, 8, {"cuda": 10.0})])
    assert pick(tab, 128, 8, greedy=False) == "cuda"
    assert pick(tab, 128, 8, greedy=False, filters=True) == "triton"
    assert pick(tab, 1, 8, greedy=False, filters=True) == "triton"   # no other candidate at the point: fallback
    # greedy verification has no filters: the flag changes nothing there
    assert pick(SMALL_TRITON_LARGE_CUDA, 128, 4, filters=True) == "cuda"


def test_the_same_dtype_is_preferred_and_another_dtype_is_the_fallback():
    tab = table(greedy=[point(128, 4, {"triton": 1.0, "cuda": 2.0}, dtype="float32"),
                        point(1, 4, {"triton": 2.0, "cuda": 1.0}, dtype="bfloat16")])
    # a bf16 batch at B=128 uses the bf16 point, though the fp32 point is at its exact (B, K, V)
    assert pick(tab, 128, 4, dtype="bfloat16") == "cuda"
    assert pick(tab, 1, 4, dtype="float32") == "triton"
    # float16 was not measured: the nearest point of any dtype
    assert pick(tab, 128, 4, dtype="float16") == "triton"
    assert pick(tab, 1, 4, dtype="float16") == "cuda"


def test_a_backend_that_cannot_run_or_failed_is_no_candidate():
    assert pick(SMALL_TRITON_LARGE_CUDA, 128, 4, cuda_ok=False) == "triton"
    failed_triton = table(greedy=[point(8, 4, {"cuda": 50.0, "torch": 40.0})])   # torch measured faster: chosen
    assert pick(failed_triton, 8, 4) == "torch"
    assert pick(failed_triton, 8, 4, cuda_ok=False) == "torch"


def test_equal_times_go_to_triton_then_cuda():
    tab = table(greedy=[point(8, 4, {"torch": 5.0, "cuda": 5.0, "triton": 5.0}), point(128, 4, {"torch": 5.0, "cuda": 5.0})])
    assert pick(tab, 8, 4) == "triton"
    assert pick(tab, 128, 4) == "cuda"


@pytest.mark.parametrize("bad, message", [
    ({"devices": {GPU: {"greedy": [point(1, 4, {"tensorrt": 1.0})]}}}, "unknown backends ['tensorrt']"),
    ({"devices": {GPU: {"greedy": [{"B": 1, "K": 4, "us": {"triton": 1.0}}]}}}, "greedy[0] is not a point"),
    ({"devices": {GPU: {"sampling": [point(1, 4, {"triton": -1.0})]}}}, "not a positive number"),
    ({"devices": {GPU: {"greedy": [point(0, 4, {"triton": 1.0})]}}}, "need B >= 1"),
    ({"gpus": {}}, "'devices'"),
])
def test_a_malformed_table_is_refused_with_the_entry_named(bad, message):
    with pytest.raises(ValueError, match="where.json") as err:
        parse_table(bad, where="where.json")
    assert message in str(err.value)


# ---------------------------------------------------------------------------------------------- the committed table
def test_the_committed_table_parses_and_names_known_backends_only():
    raw = json.loads(backend.TABLE_PATH.read_text())
    parsed = backend.load_table()
    assert parsed and raw["devices"]
    for gpu, entry in raw["devices"].items():
        assert entry["source"] and isinstance(entry["provisional"], bool), gpu
        assert set(entry) <= {"source", "provisional", "greedy", "sampling"}, gpu
        for mode in backend.MODES:
            for p in parsed[gpu][mode]:
                assert p.us and set(p.us) <= set(BACKENDS)
                assert p.dtype in {"float32", "bfloat16", "float16"}
        assert parsed[gpu]["greedy"], f"{gpu}: no greedy points"


def test_the_table_ships_with_the_package():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert backend.TABLE_PATH.name in package_data["verispec.verify"]
    assert backend.TABLE_PATH.parent == ROOT / "verispec" / "verify"


# ---------------------------------------------------------------------------------------------- choose_backend
@pytest.fixture
def fake_gpu(monkeypatch):
    """choose_backend on a 'cuda' device without a GPU: the GPU's name, the table and the toolkit are faked."""
    monkeypatch.setattr(backend, "gpu_name", lambda index: GPU)
    monkeypatch.setattr(backend, "load_table", lambda: SMALL_TRITON_LARGE_CUDA)
    monkeypatch.setattr(backend, "cuda_buildable", lambda: True)
    backend._choose.cache_clear()
    yield monkeypatch
    backend._choose.cache_clear()


def test_choose_backend_reads_the_table_for_a_gpu_and_memoizes(fake_gpu):
    cuda0 = torch.device("cuda", 0)
    assert backend.choose_backend(cuda0, 128, 4, V, torch.float32, True) == "cuda"
    assert backend.choose_backend(cuda0, 1, 4, V, torch.float32, True) == "triton"
    hits = backend._choose.cache_info().hits
    assert backend.choose_backend(cuda0, 128, 4, V, torch.float32, True) == "cuda"
    assert backend._choose.cache_info().hits == hits + 1   # a repeated shape is a dict lookup


def test_choose_backend_falls_back_without_a_toolkit_or_on_an_unknown_gpu(fake_gpu):
    cuda0 = torch.device("cuda", 0)
    fake_gpu.setattr(backend, "cuda_buildable", lambda: False)
    assert backend.choose_backend(cuda0, 128, 4, V, torch.float32, True) == "triton"
    backend._choose.cache_clear()
    fake_gpu.setattr(backend, "gpu_name", lambda index: "NVIDIA Unknown")
    fake_gpu.setattr(backend, "cuda_buildable", lambda: True)
    assert backend.choose_backend(cuda0, 128, 4, V, torch.float32, True) == "triton"


def test_cpu_tensors_always_get_the_reference():
    for greedy in (True, False):
        assert backend.choose_backend(torch.device("cpu"), 128, 8, V, torch.float32, greedy) == "torch"
    assert backend.fallback_backend(torch.device("cpu")) == "torch"
    assert backend.fallback_backend(torch.device("cuda", 0)) == "triton"


@pytest.mark.parametrize("top_k, top_p, expected", [
    (None, None, False), (0, 1.0, False), ([0, None], [1.0, None], False), (None, 1, False),
    (50, None, True), (None, 0.9, True), ([0, 5], None, True), (None, [1.0, 0.5], True),
    (torch.tensor([0, 0]), None, True), (None, torch.tensor(1.0), True),   # tensors are not read: maybe on
])
def test_filters_possible(top_k, top_p, expected):
    assert backend.filters_possible(top_k, top_p) is expected


# ---------------------------------------------------------------------------------------------- the wiring
@pytest.fixture
def spy(monkeypatch):
    """api.choose_backend replaced by a recorder that answers "torch" (the CPU backend)."""
    calls = []

    def record(device, batch_size, max_num_draft, vocab, dtype, greedy, *, filters=False):
        calls.append(dict(device=device.type, B=batch_size, K=max_num_draft, V=vocab, dtype=dtype, greedy=greedy,
                          filters=filters))
        return "torch"

    monkeypatch.setattr(api, "choose_backend", record)
    return calls


def test_verify_calls_choose_backend_with_the_batch_shape(spy):
    logits = torch.randn(7, 11, dtype=torch.bfloat16)           # B = 3, num_draft = [2, 0, 2]: 4 + 3 rows
    drafts, num_draft = torch.tensor([1, 2, 3, 4]), [2, 0, 2]
    verify_greedy(logits, drafts, num_draft)
    verify_greedy(logits, drafts, num_draft, max_num_draft=5, check_values=False)
    verify_sample(logits, drafts, num_draft, seed=1)
    verify_sample(logits, drafts, num_draft, seed=1, top_p=0.9)
    verify_sample(logits, drafts, num_draft, seed=1, top_k=torch.tensor([0, 0, 0]))
    verify_greedy(logits, drafts, num_draft, backend="torch")   # an explicit backend: no choice made
    base = dict(device="cpu", B=3, V=11, dtype=torch.bfloat16)
    assert spy == [dict(base, K=2, greedy=True, filters=False), dict(base, K=5, greedy=True, filters=False),
                   dict(base, K=2, greedy=False, filters=False), dict(base, K=2, greedy=False, filters=True),
                   dict(base, K=2, greedy=False, filters=True)]


def test_pick_backend_uses_the_table_for_none(fake_gpu):
    batch = api.canonical_batch(torch.randn(5 * 129, 13), torch.zeros(4 * 129, dtype=torch.int64),
                                [4] * 129, 4, False)
    cuda0 = torch.device("cuda", 0)
    fake_gpu.setattr(backend, "load_table", lambda: table(greedy=[point(128, 4, {"triton": 2.0, "cuda": 1.0},
                                                                        vocab=13)]))
    assert api.pick_backend(None, cuda0, batch) == "cuda"
    assert api.pick_backend(None, cuda0, batch, greedy=False) == "triton"   # no sampling points: fallback
    assert api.pick_backend(None, cuda0) == "triton"                        # no batch (dev/kv): the device rule
    assert api.pick_backend("torch", cuda0, batch) == "torch"
    with pytest.raises(ValueError, match="backend must be one of"):
        api.pick_backend("tensorrt", cuda0, batch)
