"""benchmarks/decode.py runs its CPU smoke version end to end and writes its markdown table."""
import importlib.util
from pathlib import Path

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke path only")
def test_decode_benchmark_smoke(tmp_path):
    pytest.importorskip("transformers")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "decode.py"
    spec = importlib.util.spec_from_file_location("bench_decode", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "decode.md"
    rows, hf_rows = bench.main(["--out", str(out)])
    assert {(r["B"], r["k"]) for r in rows} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(r["ms"] > 0 for r in rows) and len(hf_rows) == 2
    text = out.read_text()
    assert "| smoke-tiny | eager | 2 |" in text and "k=4 / k=1" in text
