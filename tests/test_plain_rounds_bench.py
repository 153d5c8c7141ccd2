"""benchmarks/plain_rounds.py: its step-trace summary on a synthetic trace (the counting part runs the scheduler on
tiny models, as tests/test_lazy_draft_prefill.py does)."""
from __future__ import annotations

import json

from benchmarks import plain_rounds


def test_trace_summary_splits_admitting_steps_by_k_and_rows(tmp_path):
    steps = [dict(start_s=0.0, seconds=0.040, rows_before=2, waiting_before=1, rows_after=3, k=0),   # admits
             dict(start_s=0.1, seconds=0.008, rows_before=3, waiting_before=0, rows_after=3, k=0),
             dict(start_s=0.2, seconds=0.010, rows_before=3, waiting_before=0, rows_after=3, k=0),
             dict(start_s=0.3, seconds=0.014, rows_before=4, waiting_before=2, rows_after=4, k=1)]  # full: no admit
    trace = tmp_path / "trace_1.jsonl"
    trace.write_text("\n".join(json.dumps(s) for s in steps) + "\n")
    lines = plain_rounds.trace_section([trace])
    assert "`trace_1.jsonl`: 4 steps; widest k: 0: 3, 1: 1" in lines
    assert "| 0 | 1-8 | 1 | 40.00 | 2 | 9.00 |" in lines
    assert "| 1 | 1-8 | 0 | - | 1 | 14.00 |" in lines
