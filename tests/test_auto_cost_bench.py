"""benchmarks/auto_cost.py on tiny random models on the CPU: the cost table (with its overhead column) and the
in-process comparison are written, the table loads back, and every configuration emitted plain greedy decoding's
tokens."""
from __future__ import annotations

from benchmarks import auto_cost
from verispec.engine.auto_k import CostTable
from verispec.runtime import ModelConfig, load_model

TINY = ModelConfig(vocab_size=96, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                   intermediate_size=64)


def test_auto_cost_writes_the_table_and_the_comparison(tmp_path):
    target = load_model(TINY, device="cpu", dtype=None, seed=0)
    draft = load_model(TINY, device="cpu", dtype=None, seed=1)
    rows = auto_cost.main(["--device", "cpu", "--concurrency", "2", "--num-prompts", "4", "--input-len", "6",
                           "--max-tokens", "6", "--k-max", "2", "--reps", "1", "--out", str(tmp_path)],
                          target=target, draft=draft)
    assert [r[0] for r in rows] == ["AR", "K=2", "K=4", "k=auto", "k=auto, passes only", "k=auto, unpriced probes"]
    assert all(r[5] == "yes" for r in rows)
    table = CostTable.from_json((tmp_path / "cost_table.json").read_text())
    assert table.batch_sizes == (1, 2) and len(table.overhead_s) == 2
    page = (tmp_path / "auto_cost.md").read_text()
    assert "## The cost table" in page and "## In process at saturation" in page
    assert "- k=auto, unpriced probes: greedy probes that drafted 0," in page     # unpriced: none counted as priced
