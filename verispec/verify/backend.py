"""The default verification backend, chosen from measurements committed beside this file.

``backend=None`` in ``verify_greedy`` / ``verify_sample`` runs ``choose_backend`` for the batch: the backend
measured fastest on this GPU at the nearest measured (B, K, V, dtype) of the same mode (greedy or sampling).

The table, ``backend_table.json`` (written by ``python benchmarks/verify.py --write-table`` from one GPU run;
each time is the median device µs of one call replayed from a CUDA graph, ``check_values=False``):

    {"devices": {"NVIDIA H100 80GB HBM3": {              # the key is torch.cuda.get_device_name()
        "source": "benchmarks/verify.py, 2026-11-23 ...", "provisional": false,
        "greedy":   [{"B": 128, "K": 8, "V": 128256, "dtype": "float32", "us": {"triton": 259.0, "cuda": 231.0}},
                     ...],
        "sampling": [...]}}}

The rule, for B sequences, K = max_num_draft, vocabulary V and the logits' dtype:
  1. CPU tensors: "torch" (the Triton kernels run on a CPU only under TRITON_INTERPRET=1, for tests).
  2. A GPU named in the table with points for the mode: among the mode's points of the batch's dtype (all of the
     mode's points when that dtype was not measured), the nearest one in (log2 B, log2 (K + 1), log2 V); the
     fastest candidate backend at that point (ties: triton, cuda, torch).
  3. Otherwise (a GPU not in the table, a mode it has no points for, no candidate at the point): "triton", the
     backend with every feature (top-k / top-p sampling) and measured fastest or within a few percent of the
     fastest at most sizes on an H100.
A candidate is a backend with a time at the point (a backend whose check failed has none) that can run here:
"cuda" only when its extension is built or nvcc can build it (the first call then builds it, about a minute),
and for sampling only when no top-k / top-p can be in play, which ``verify_sample_cuda`` does not implement.

Cost: the table is read once per process and each distinct (GPU, mode, B, K, V, dtype, filters) is decided once,
so a call costs a dict lookup.

Greedy results are identical on every backend, so the choice never changes a greedy token. Sampled tokens agree
between backends except at float near-ties (docs/verification.md): as the choice depends on B, one sequence
verified in batches of different sizes carries that caveat, as it already does on one backend.
"""
from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path
from typing import NamedTuple

import torch

from ..jit import is_built

BACKENDS = ("torch", "triton", "cuda")
MODES = ("greedy", "sampling")
FALLBACK = "triton"
TABLE_PATH = Path(__file__).resolve().with_name("backend_table.json")
_PREFERENCE = ("triton", "cuda", "torch")   # tie-break order among equal times
_NO_FILTERS = ("cuda",)                     # backends whose verify_sample refuses top-k / top-p


class Point(NamedTuple):
    """One measured configuration: B sequences of K drafts over V, logits ``dtype``; ``us``: backend -> µs."""

    batch_size: int
    max_num_draft: int
    vocab: int
    dtype: str
    us: dict

    def distance(self, batch_size: int, max_num_draft: int, vocab: int) -> float:
        """Euclidean distance in (log2 B, log2 (K + 1), log2 V): K + 1 rows per sequence, so K = 0 is a point."""
        return math.dist((math.log2(self.batch_size), math.log2(self.max_num_draft + 1), math.log2(self.vocab)),
                         (math.log2(batch_size), math.log2(max_num_draft + 1), math.log2(vocab)))


def fallback_backend(device: torch.device) -> str:
    """The backend for a device without measurements: "triton" on a GPU, "torch" on a CPU."""
    return FALLBACK if device.type == "cuda" else "torch"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> "bfloat16", the spelling of the table."""
    return str(dtype).removeprefix("torch.")


def parse_table(data: dict, where: str = "backend table") -> dict[str, dict[str, tuple[Point, ...]]]:
    """{GPU name: {mode: points}} from the JSON object; ValueError naming ``where`` and the bad entry."""
    devices = data.get("devices") if isinstance(data, dict) else None
    if not isinstance(devices, dict):
        raise ValueError(f"{where}: expected an object with a 'devices' object")
    table = {}
    for gpu, entry in devices.items():
        table[gpu] = {}
        for mode in MODES:
            points = []
            for i, p in enumerate(entry.get(mode, [])):
                try:
                    point = Point(int(p["B"]), int(p["K"]), int(p["V"]), str(p["dtype"]),
                                  {str(b): float(t) for b, t in p["us"].items()})
                except (KeyError, TypeError, ValueError, AttributeError) as e:
                    raise ValueError(f"{where}: {gpu} {mode}[{i}] is not a point with B, K, V, dtype, us: {e!r}")
                unknown = set(point.us) - set(BACKENDS)
                if unknown:
                    raise ValueError(f"{where}: {gpu} {mode}[{i}] names unknown backends {sorted(unknown)}; "
                                     f"known: {BACKENDS}")
                if point.batch_size < 1 or point.max_num_draft < 0 or point.vocab < 1:
                    raise ValueError(f"{where}: {gpu} {mode}[{i}] has B={point.batch_size}, K={point.max_num_draft}, "
                                     f"V={point.vocab}: need B >= 1, K >= 0, V >= 1")
                if not all(math.isfinite(t) and t > 0 for t in point.us.values()):
                    raise ValueError(f"{where}: {gpu} {mode}[{i}] has a time that is not a positive number: {point.us}")
                points.append(point)
            table[gpu][mode] = tuple(points)
    return table


@functools.lru_cache(maxsize=None)
def load_table(path: Path = TABLE_PATH) -> dict[str, dict[str, tuple[Point, ...]]]:
    """The parsed table at ``path`` (read once per process and path)."""
    return parse_table(json.loads(Path(path).read_text()), where=str(path))


@functools.lru_cache(maxsize=None)
def cuda_buildable() -> bool:
    """Whether ``backend="cuda"`` can run here without an error: its extension is built, or nvcc can build it
    (the same test as ``verispec.jit.load_extension``). Decided once per process."""
    if is_built("verispec_verify") or shutil.which("nvcc"):
        return True
    from torch.utils.cpp_extension import CUDA_HOME

    return CUDA_HOME is not None


def pick_from_table(table, gpu: str, greedy: bool, batch_size: int, max_num_draft: int, vocab: int, dtype: str,
                    filters: bool = False, cuda_ok: bool = True) -> str:
    """Rules 2-3 of the module docstring on a parsed ``table`` (a pure function: tests give it tables).

    ``dtype``: the table's spelling ("float32"); ``filters``: top-k / top-p may be in play (sampling only);
    ``cuda_ok``: whether the CUDA extension can run here.
    """
    points = table.get(gpu, {}).get("greedy" if greedy else "sampling", ())
    same_dtype = [p for p in points if p.dtype == dtype]
    points = same_dtype or points
    if not points:
        return FALLBACK
    nearest = min(points, key=lambda p: p.distance(batch_size, max_num_draft, vocab))
    excluded = set()
    if not cuda_ok:
        excluded.add("cuda")
    if filters and not greedy:
        excluded.update(_NO_FILTERS)
    candidates = [b for b in _PREFERENCE if b in nearest.us and b not in excluded]
    if not candidates:
        return FALLBACK
    return min(candidates, key=lambda b: nearest.us[b])   # min keeps the first of equal times: the preference


@functools.lru_cache(maxsize=4096)
def _choose(gpu: str, greedy: bool, batch_size: int, max_num_draft: int, vocab: int, dtype: torch.dtype,
            filters: bool) -> str:
    table = load_table()
    chosen = pick_from_table(table, gpu, greedy, batch_size, max_num_draft, vocab, dtype_name(dtype), filters)
    if chosen == "cuda" and not cuda_buildable():
        chosen = pick_from_table(table, gpu, greedy, batch_size, max_num_draft, vocab, dtype_name(dtype), filters,
                                 cuda_ok=False)
    return chosen


@functools.lru_cache(maxsize=None)
def gpu_name(index: int | None) -> str:
    """torch.cuda.get_device_name of CUDA device ``index`` (None: the current one), once per index."""
    return torch.cuda.get_device_name(index)


def choose_backend(device: torch.device, batch_size: int, max_num_draft: int, vocab: int, dtype: torch.dtype,
                   greedy: bool, *, filters: bool = False) -> str:
    """The backend ``backend=None`` runs for this batch (the rule in the module docstring).

    Args:
        device: the logits' device.
        batch_size, max_num_draft, vocab: B, K and V of the batch.
        dtype: the logits' dtype.
        greedy: verify_greedy (True) or verify_sample (False).
        filters: for sampling, whether top-k / top-p may be in play (``filters_possible``).

    Example (CPU tensors are always verified by the reference):
        >>> choose_backend(torch.device("cpu"), 128, 8, 128256, torch.float32, greedy=True)
        'torch'
    """
    if device.type != "cuda":
        return "torch"
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _choose(gpu_name(index), bool(greedy), batch_size, max_num_draft, vocab, dtype, bool(filters))


def filters_possible(top_k, top_p) -> bool:
    """Whether a verify_sample call's ``top_k`` / ``top_p`` may filter: a tensor may (its values are on the
    device: not read here), as may any Python value other than "off" (None or 0 for top_k, None or 1 for top_p).

        >>> filters_possible(None, 1.0), filters_possible([0, 0], None), filters_possible(50, None)
        (False, False, True)
    """
    def on(value, off) -> bool:
        if isinstance(value, torch.Tensor):
            return True
        values = value if isinstance(value, (list, tuple)) else [value]
        return any(v is not None and v != off for v in values)

    return on(top_k, 0) or on(top_p, 1.0)
