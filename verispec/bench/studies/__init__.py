"""The studies. Each module has ``points(bench) -> [point dicts]`` (the sweep, from the options alone) and
``measure(bench, point) -> [row dicts]``; ``run_study`` measures every point not in ``skip`` and returns the
rows (each with its ``point``), so a study is one function call from Python::

    from verispec.bench import BenchOptions, Workbench, run_study
    rows = run_study("window", Workbench(BenchOptions(studies=("window",), out="out").resolved()))
"""
from __future__ import annotations

from . import batch, breakdown, heads, kernels, speedup, ssd, trees, window
from ..store import point_key

MODULES = {m.STUDY: m for m in (kernels, speedup, breakdown, window, batch, ssd, trees, heads)}


def run_study(name: str, bench, skip: set[str] = frozenset(), on_rows=None, progress=None) -> list[dict]:
    """Rows of every point of study ``name`` whose key is not in ``skip``; ``on_rows(rows)`` is called after
    each point (the runner appends them to disk), ``progress.step(label)`` too."""
    module = MODULES[name]
    out = []
    for point in module.points(bench):
        if point_key(point) in skip:
            continue
        rows = [{"point": point, **r} for r in module.measure(bench, point)]
        if not rows:      # a point this setup cannot measure (e.g. k="auto" without a policy) is written
            rows = [{"point": point, "skipped": True}]   # as skipped, so a resumed run does not retry it
        # (a study may write its own skipped row, {"skipped": True, "reason": ...}, to say why)
        out += rows
        if on_rows is not None:
            on_rows(rows)
        if progress is not None:
            progress.step(" ".join(f"{k}={v}" for k, v in point.items()))
    return out


def count_points(name: str, bench) -> int:
    return len(MODULES[name].points(bench))
