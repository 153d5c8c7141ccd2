"""A retirement's compaction (``StaticKVCache.keep`` with host indices: rows from the tail fill the holes) at the 8B
shape: 32 rows of a 2048-slot bf16 cache, 1 or 6 rows moved, copying every slot of a moved row vs only the slots
below the length bound (``Model.keep`` passes ``max_len_bound``).

    python benchmarks/kv_compaction.py --out DIR [--write]      # GPU only

Each cell: the median of 12 synchronized calls (ms); floor = the bytes the copy moves (read + write of the moved
rows' slots, every layer's K and V) / the measured copy bandwidth; the every-slot column is the peer (what a moved
row cost before the bound).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import copy_bandwidth, environment, environment_line, markdown_table, write_page  # noqa: E402
from verispec.runtime.cache import StaticKVCache  # noqa: E402
from verispec.runtime.config import NAMED_SHAPES  # noqa: E402

ROWS, CAPACITY, LIVE = 32, 2048, 160


def keep_ms(cache: StaticKVCache, moved: int, slots: int | None) -> float:
    """Median ms of a keep that moves the last ``moved`` rows into the first ``moved`` holes."""
    times = []
    for _ in range(12):
        cache.reset(0, CAPACITY)
        cache.admit([LIVE - 10] * ROWS)
        order = list(range(ROWS - moved))
        order[:moved] = list(range(ROWS - moved, ROWS))
        torch.cuda.synchronize()
        t = time.perf_counter()
        cache.keep(order, slots=slots)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for kv_compaction.md")
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/kv_compaction.md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    cfg = NAMED_SHAPES["llama-3.1-8b"]
    cache = StaticKVCache(cfg, ROWS, CAPACITY, torch.device("cuda"), torch.bfloat16)
    bandwidth = copy_bandwidth()
    row_slot_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 2      # K and V, bf16, one slot
    rows = []
    for moved in (1, 6):
        every, live = keep_ms(cache, moved, None), keep_ms(cache, moved, LIVE)
        floor = 2 * moved * LIVE * row_slot_bytes / bandwidth * 1e3                   # read + write
        rows.append([moved, f"{every:.3f}", f"**{live:.3f}**", f"{floor:.3f}", f"{every / live:.1f}x"])
    lines = ["# A retirement's compaction of the KV cache (8B shape)", "", environment_line(environment(), bandwidth),
             "", f"Command: `python benchmarks/kv_compaction.py`. {ROWS} rows of a {CAPACITY}-slot cache, {LIVE} "
             "live slots a row; median ms of 12 synchronized calls.", ""]
    lines += markdown_table(["rows moved", "every slot ms (peer)", f"slots < {LIVE} ms", "floor ms",
                             "every / live"], rows)
    write_page("\n".join(lines) + "\n", args.out, "kv_compaction.md", args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
