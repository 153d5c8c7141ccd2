"""A small progress bar on stderr for sweeps (drawn only when stderr is a terminal)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, stream=None):
        self.label, self.total, self.done = label, total, 0
        self.stream = stream or sys.stderr
        self.enabled = total > 0 and getattr(self.stream, "isatty", lambda: False)()
        self.start = time.perf_counter()
        self._draw("")

    def _draw(self, what: str) -> None:
        if not self.enabled:
            return
        width = 24
        filled = width * self.done // max(self.total, 1)
        elapsed = time.perf_counter() - self.start
        line = (f"\r[bench] {self.label:9s} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                f"{elapsed:5.0f}s {what}")
        self.stream.write(line[:120].ljust(120))
        self.stream.flush()

    def step(self, what: str = "") -> None:
        self.done += 1
        self._draw(what)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
