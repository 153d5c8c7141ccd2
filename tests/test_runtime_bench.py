"""benchmarks/decode.py runs its CPU smoke version end to end and writes its markdown table."""
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch


def _smoke_weight_and_kv_bytes(cfg, slots: int) -> tuple[int, int]:
    """Bytes one pass reads (fp32): every layer's matrices and norms, the final norm, the LM head;
    and the KV bytes per sequence over ``slots`` cache slots. From the config alone, not the model."""
    H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    layer = H * (cfg.num_heads + 2 * cfg.num_kv_heads) * hd + cfg.num_heads * hd * H + 3 * H * I + 2 * H
    weights = 4 * (cfg.num_layers * layer + H + cfg.vocab_size * H)
    kv = 4 * cfg.num_layers * 2 * cfg.num_kv_heads * slots * hd
    return weights, kv


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke path only")
def test_decode_benchmark_smoke(tmp_path):
    pytest.importorskip("transformers")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "decode.py"
    spec = importlib.util.spec_from_file_location("bench_decode", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "decode.md"
    rows, hf_rows = bench.main(["--out", str(out)])

    # the smoke grid: the tiny model, the eager path (no Triton kernels on CPU), B and k in {1, 2}
    assert sorted((r["B"], r["k"]) for r in rows) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert {(r["model"], r["variant"]) for r in rows} == {("smoke-tiny", "eager")}
    # the floors follow from the config: bytes / the fixed CPU bandwidth of 1e10 B/s
    capacity = 16 + (3 + 4) * 2   # prompt 16 + (iters 3 + 4 warm-up calls) * max k
    weight_bytes, kv_bytes = _smoke_weight_and_kv_bytes(bench.SMOKE_CFG, slots=64)   # 30 rounded up to 64
    for r in rows:
        assert r["floor_ms"] == pytest.approx(weight_bytes / 1e10 * 1e3, rel=1e-12)
        assert r["floor_kv_ms"] == pytest.approx((weight_bytes + r["B"] * kv_bytes) / 1e10 * 1e3, rel=1e-12)
        assert math.isfinite(r["ms"]) and math.isfinite(r["capture_s"])
    assert sorted((h["model"], h["B"]) for h in hf_rows) == [("smoke-tiny", 1), ("smoke-tiny", 2)]

    # the markdown: one decode row per B whose tok/s is B / ms, the k table, and the raw rows verbatim
    text = out.read_text()
    for r in rows:
        if r["k"] == 1:
            assert f"| smoke-tiny | eager | {r['B']} | {r['ms']:.3f} | {r['B'] / (r['ms'] / 1e3):.1f} |" in text
    assert "| model | variant | B | k=1 | k=2 | k=4 / k=1 |" in text
    raw = json.loads(text.split("```json\n")[1].split("\n```")[0])
    assert raw["rows"] == rows and raw["hf"] == hf_rows
    assert raw["meta"]["prompt_len"] == 16 and raw["meta"]["capacity"] == capacity


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke path only")
def test_prefill_benchmark_smoke(tmp_path):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "prefill.py"
    spec = importlib.util.spec_from_file_location("bench_prefill", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "prefill.md"
    rows = bench.main(["--out", str(out)])

    # the smoke grid: the tiny model, two lengths, the old path only (the kernel path needs CUDA)
    assert [(r["model"], r["T"]) for r in rows] == [("smoke-tiny", 8), ("smoke-tiny", 24)]
    cfg = bench.SMOKE_CFG
    for r in rows:
        assert math.isfinite(r["old_ms"]) and "new_ms" not in r
        assert r["floor_ms"] == pytest.approx(2 * cfg.num_params * r["T"] / 989e12 * 1e3, rel=1e-12)
        attn = 2 * r["T"] ** 2 * cfg.num_heads * cfg.head_dim * cfg.num_layers
        assert r["attn_floor_ms"] == pytest.approx(attn / 989e12 * 1e3, rel=1e-12)
    text = out.read_text()
    assert f"| smoke-tiny | 24 | {rows[1]['old_ms']:.3f} | – |" in text
    raw = json.loads(text.split("```json\n")[1].split("\n```")[0])
    assert raw["rows"] == rows
