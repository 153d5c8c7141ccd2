"""Running studies into a directory: ``DIR/<study>.jsonl`` (rows, appended as measured, skipped when found
on a later run), ``DIR/<study>.md`` (the page, rewritten from all rows) and its PNGs."""
from __future__ import annotations

from pathlib import Path

from . import markdown, plots
from .options import BenchOptions
from .progress import Progress
from .store import append_rows, done_points, read_rows
from .studies import count_points, run_study
from .workbench import Workbench, environment


def run_studies(options: BenchOptions, bench: Workbench | None = None) -> list[Path]:
    """Run every study of ``options`` (already checked and resolved) into ``options.out``; the pages written."""
    bench = bench or Workbench(options)
    out = Path(options.out)
    env = environment(options)
    pages = []
    for study in options.studies:
        skip = done_points(out, study)
        total = count_points(study, bench)
        progress = Progress(study, total)
        progress.done = min(len(skip), total)
        try:
            run_study(study, bench, skip, on_rows=lambda rows, s=study: append_rows(out, s, rows), progress=progress)
        finally:
            progress.close()
        pages.append(write_page(study, out, env, bench.describe_pair(), resumed=len(skip)))
    return pages


def write_page(study: str, out: Path, env: dict, pair: str, resumed: int = 0) -> Path:
    rows = read_rows(out, study)
    images = plots.plot(study, rows, out)
    path = Path(out) / f"{study}.md"
    path.write_text(markdown.study_page(study, rows, env, pair, images, resumed))
    return path
