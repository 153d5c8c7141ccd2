"""A server as users meet it, for the tests that start one as a subprocess on 127.0.0.1: ``start`` runs the command
(``verispec serve ...`` or tests/fake_server.py) and waits until /health answers, ``stop`` ends it with SIGTERM (then
SIGKILL), ``serve_cli`` is both around ``python -m verispec.cli serve ARGS --port P``."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Iterator

from fake_server import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the repository first, then whatever PYTHONPATH already holds (a machine whose serve extra is installed there)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
       "OMP_NUM_THREADS": "1"}


def start(cmd: list[str], base: str, startup_s: float = 120.0) -> subprocess.Popen:
    """Run ``cmd`` and return once ``base``/health answers; a process that exits first fails with its output."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + startup_s
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            urllib.request.urlopen(base + "/health", timeout=1)
            return proc
        except OSError:
            if time.monotonic() > deadline:
                stop(proc)
                raise AssertionError(f"the server did not come up in {startup_s:.0f} s") from None
            time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def serve_cli(args: list[str]) -> Iterator[tuple[str, subprocess.Popen]]:
    """(base URL, process) of ``verispec serve ARGS`` on a free loopback port, stopped on exit."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start([sys.executable, "-m", "verispec.cli", "serve", *args, "--port", str(port)], base)
    try:
        yield base, proc
    finally:
        stop(proc)
