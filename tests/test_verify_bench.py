"""benchmarks/verify.py: its CPU smoke run end to end, a failing backend reported and not fatal, the page and goals
of a GPU-shaped run, and the backend table written from a run's JSON."""
from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from verispec.verify.backend import parse_table, pick_from_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_verify", ROOT / "benchmarks" / "verify.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(bench, tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke path only")
    out = tmp_path_factory.mktemp("verify_bench")
    data = bench.main(["--out", str(out / "verify.md"), "--json", str(out / "verify.json")])
    return out, data


def test_the_smoke_run_checks_and_times_every_backend(smoke, bench):
    out, data = smoke
    rows = data["rows"]
    assert [(r["mode"], r["B"], r["K"]) for r in rows] == [
        (mode, b, k) for mode in ("greedy", "sampling") for b in (1, 2) for k in (1, 2)]
    for r in rows:
        assert r["pick"] == "torch"                                    # CPU tensors
        assert r["floor_bytes"] >= (r["B"] * (r["K"] + 1)) * 64 * 4    # the logits once
        triton, cuda, torch_ = r["backends"]["triton"], r["backends"]["cuda"], r["backends"]["torch"]
        assert triton["ok"] and triton["error"] is None and triton["graph_us"] is None   # no graphs on a CPU
        assert triton["default_us"] > 0 and triton["unchecked_us"] > 0
        assert not cuda["ok"] and cuda["skipped"] == "no CUDA device"
        assert torch_["ok"]
    assert json.loads((out / "verify.json").read_text()) == json.loads(json.dumps(data))
    text = (out / "verify.md").read_text()
    assert "## Greedy" in text and "## Sampling" in text and "no failures" in text
    assert "| 1 | 1 | float32 |" in text and "n/a" in text
    assert "peer, measured 2026-11 by the team, not re-run" in text
    with pytest.raises(SystemExit, match="needs a GPU run"):             # no graph times: no table from it
        bench.write_table(out / "verify.json", out / "table.json")


def test_a_failing_backend_is_reported_not_fatal(bench, monkeypatch):
    case = bench.Case("greedy", 2, 2, 64, torch.float32, "cpu")
    good = case.call

    def broken(backend, checked):
        if backend == "triton":
            raise RuntimeError("kernel exploded\nsecond line")
        out = good(backend, checked)
        if backend == "torch" and not checked:
            out.tokens = out.tokens.clone()
            out.tokens[1, 0] += 1                                        # a wrong token in sequence 1
        return out

    monkeypatch.setattr(case, "call", broken)
    triton = bench.measure_backend(case, "triton", on_gpu=False)
    assert not triton["ok"] and triton["error"] == "RuntimeError: kernel exploded"
    assert triton["default_us"] is None
    torch_ = bench.measure_backend(case, "torch", on_gpu=False)
    assert not torch_["ok"] and torch_["error"] == "check_values=False: 1 of 2 checked sequences differ from the torch reference"


def test_a_large_sampling_batch_is_checked_on_a_sub_batch_of_sequences(bench, monkeypatch):
    monkeypatch.setattr(bench, "CHECKED_SEQUENCES", 4)
    case = bench.Case("sampling", 7, 3, 64, torch.float32, "cpu")
    assert case.checked.tolist() == [0, 1, 5, 6] and case.num_accepted is None
    full = case.call("torch", checked=True)                       # the whole batch, for comparison only
    assert torch.equal(case.reference.tokens, full.tokens[case.checked])
    assert torch.equal(case.reference.num_accepted, full.num_accepted[case.checked])
    assert case.mismatch(full) is None
    assert torch.equal(case.num_accepted, full.num_accepted)      # the sampling floor's outcome: the passing one
    rejected = int((full.num_accepted < 3).sum())
    assert case.floor_bytes() == (7 * 4 + rejected) * 64 * 4
    wrong = bench.Case("sampling", 7, 3, 64, torch.float32, "cpu").call("torch", checked=True)
    wrong.tokens[5, 0] = (wrong.tokens[5, 0] + 1) % 64
    assert case.mismatch(wrong) == "1 of 4 checked sequences differ from the torch reference"


def _gpu_run(bench, smoke_data) -> dict:
    """The smoke run's JSON made GPU-shaped: graph times, a failed cuda point, an H100 name."""
    data = copy.deepcopy(smoke_data)
    data["meta"].update(on_gpu=True, bandwidth=3.0e12)
    data["meta"]["env"].update(device="NVIDIA Test GPU", sms=132, l2_mib=50, driver="1")
    for i, r in enumerate(data["rows"]):
        for name, b in r["backends"].items():
            b.update(ok=True, skipped=None, error=None, default_us=30.0, unchecked_us=20.0,
                     graph_us=None if name == "torch" else (10.0 + i if name == "triton" else 12.0))
        r["backends"]["cuda"]["graph_us"] = 5.0 if r["B"] == 2 else 12.0
    r = data["rows"][0]
    r["backends"]["cuda"].update(ok=False, error="check_values=True: 1 of 1 sequences differ", graph_us=None)
    return data


def test_the_page_of_a_gpu_run_has_the_tables_failures_and_goals(bench, smoke):
    data = _gpu_run(bench, smoke[1])
    lines = bench.page(data["rows"], data["meta"], 3, "quoted", [])
    text = "\n".join(lines)
    assert "3 configurations skipped by the budget" in text
    assert "- greedy B=1 K=1 float32 `cuda`: check_values=True: 1 of 1 sequences differ" in text
    assert "| 1 | 1 | float32 | 0.0 | 10.0 | - | triton " in text      # the failed cuda point has no graph time
    assert "30 / 20 (1.5×)" in text
    assert "- triton: default call ≤ 1.2× the unchecked call (eager): worst 1.50×" in text
    assert "MISSED" in text


def test_write_table_replaces_this_gpu_and_keeps_the_others(bench, smoke, tmp_path):
    data = _gpu_run(bench, smoke[1])
    run = tmp_path / "run.json"
    run.write_text(json.dumps(data))
    table_path = tmp_path / "table.json"
    other = {"B": 1, "K": 1, "V": 64, "dtype": "float32", "us": {"triton": 1.0}}
    table_path.write_text(json.dumps({"_comment": "c", "devices": {
        "Other GPU": {"source": "s", "provisional": True, "greedy": [other], "sampling": []},
        "NVIDIA Test GPU": {"source": "old", "provisional": True, "greedy": [], "sampling": []}}}))
    bench.main(["--table-only", "--json", str(run), "--table", str(table_path)])
    raw = json.loads(table_path.read_text())
    assert raw["_comment"] == "c" and raw["devices"]["Other GPU"]["greedy"] == [other]
    entry = raw["devices"]["NVIDIA Test GPU"]
    assert entry["provisional"] is False and entry["source"].startswith("benchmarks/verify.py, ")
    assert len(entry["greedy"]) == len(entry["sampling"]) == 4
    first = entry["greedy"][0]
    assert first["us"] == {"triton": 10.0}       # the failed cuda point and the untimed torch are not candidates
    table = parse_table(raw)
    assert pick_from_table(table, "NVIDIA Test GPU", True, 2, 2, 64, "float32") == "cuda"   # cuda 5 µs at B = 2
    assert pick_from_table(table, "NVIDIA Test GPU", True, 1, 1, 64, "float32") == "triton"
    assert pick_from_table(table, "NVIDIA Test GPU", False, 2, 2, 64, "float32", filters=True) == "triton"
