"""Rows on disk: ``DIR/<study>.jsonl``, one JSON object per line, appended as each point is measured.

A row carries its sweep point under ``"point"``; a run that finds a point's row already written skips it
(resume after an interruption, or extend a sweep by running again with more values).
"""
from __future__ import annotations

import json
from pathlib import Path


def point_key(point: dict) -> str:
    return json.dumps(point, sort_keys=True)


def rows_path(out: Path, study: str) -> Path:
    return Path(out) / f"{study}.jsonl"


def read_rows(out: Path, study: str) -> list[dict]:
    """Every row written so far (a torn last line, from a run killed mid-write, is dropped)."""
    path = rows_path(out, study)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def done_points(out: Path, study: str) -> set[str]:
    return {point_key(r["point"]) for r in read_rows(out, study) if "point" in r}


def append_rows(out: Path, study: str, rows: list[dict]) -> None:
    with rows_path(out, study).open("a") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
