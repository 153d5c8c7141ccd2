"""benchmarks/serve.py --cpu --quick on a tiny random model: the results table has its columns, every request
of every (rate, method) completed with the plain-decoding tokens, and the PNG is written."""
from __future__ import annotations

import pytest

from benchmarks import serve
from verispec.runtime import ModelConfig, load_model

TINY = ModelConfig(vocab_size=96, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                   intermediate_size=64)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve")
    target = load_model(TINY, device="cpu", dtype=None, seed=0)
    rows = serve.main(["--cpu", "--quick", "--requests", "5", "--out", str(out)], target=target)
    return out, rows


def test_table_has_every_column_and_row(quick_run):
    out, rows = quick_run
    page = (out / "serve_cpu.md").read_text()
    header = "| " + " | ".join(serve.COLUMNS) + " |"
    assert header in page
    table = [line for line in page.splitlines() if line.startswith("| ") and line != header]
    assert len(table) == len(rows) == 2 * 3          # 2 quick rates x (AR, fixed K, auto)
    assert all(line.count("|") == len(serve.COLUMNS) + 1 for line in table)
    assert {r["method"] for r in rows} == {"AR", "SD K=4", 'k="auto"'}
    assert (out / "serve_cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_request_completed_with_the_plain_decoding_tokens(quick_run):
    _, rows = quick_run
    for r in rows:
        assert r["completed"] == r["n"] == 5, r
        assert r["identical"], r
        assert r["ttft50"] <= r["ttft99"] and r["tpot50"] <= r["tpot99"]
        assert r["throughput"] > 0
    assert all(r["k"] == 0 for r in rows if r["method"] == "AR")
    assert all(r["k"] == 4 for r in rows if r["method"] == "SD K=4")
    assert all(0 <= r["k"] <= 4 for r in rows if r["method"] == 'k="auto"')


def test_percentile_and_arrivals():
    assert serve.percentile([1, 2, 3, 4, 5], 50) == 3
    assert serve.percentile([0, 10], 99) == pytest.approx(9.9)
    times = serve.poisson_arrivals(2000, 50.0, 0)
    assert times[0] == 0 and times == sorted(times)
    assert times[-1] / 1999 == pytest.approx(1 / 50, rel=0.1)    # mean gap 1 / rate
    assert serve.poisson_arrivals(5, 3.0, 1) == serve.poisson_arrivals(5, 3.0, 1)


def test_oracle_mode_with_steady_state(tmp_path):
    """The GPU mode's code path (peaked target, OracleDraft keyed by request id, closed loop at C = 8) on tiny
    models: the oracle's acceptance is the alpha asked for, and outputs equal plain decoding's."""
    target = load_model(TINY, device="cpu", dtype=None, seed=0)
    draft = load_model(TINY, device="cpu", dtype=None, seed=1)
    rows = serve.main(["--quick", "--requests", "16", "--rates", "50", "--max-batch", "8", "--alpha", "0.8",
                       "--out", str(tmp_path)], target=target, draft=draft)
    assert all(r["completed"] == 16 and r["identical"] for r in rows)
    sd = next(r for r in rows if r["method"] == "SD K=4")
    assert 0.5 < sd["accepted"] < 3.5          # E[accepted] = 0.8 + .64 + .512 + .41 = 2.36 at alpha 0.8
    page = (tmp_path / "serve.md").read_text()
    steady = [line for line in page.splitlines() if line.startswith("| 8 |")]
    assert len(steady) == 1, page
    accept = float(steady[0].split("|")[5])
    assert 0.7 < accept < 0.9                   # the oracle's per-position acceptance, asked for 0.8
