"""What every benchmark script shares: the copy-bandwidth floor, CUDA-graph timing, the environment header of a
results file, markdown tables, waiting for a server subprocess's /health.

The floor. ``copy_bandwidth()`` is the one measurement of what the memory system can move: a device-to-device
copy of a 2 GiB buffer (far larger than any L2), counting bytes read + bytes written, median of 20 CUDA-event
timings after 3 warm-up copies. A kernel's *floor* is the bytes it must move (read + written) divided by that
rate (``floor_s``), so "% of floor" = floor time / measured time. Each results file records the rate measured
in its own run (it varies by about 3% between H100 machines).

Importable on a CPU-only machine (every function that needs a GPU says so), so every script's ``--help`` works
there. Scripts import it as ``benchmarks.common`` with the repository root on ``sys.path``.
"""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

import torch

COPY_BYTES = 2 << 30  # the copy that measures the floor: 2 GiB, far past L2


# ---------------------------------------------------------------------------------------------- timing
def time_calls(fn: Callable[[], object], iters: int, warmup: int = 3) -> float:
    """Median seconds of one ``fn()`` over ``iters`` calls: CUDA events around each call on a GPU (device
    time, launch gaps included), ``time.perf_counter`` on the CPU."""
    for _ in range(warmup):
        fn()
    if torch.cuda.is_available():
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) / 1e3 for start, end in events)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def capture_graph(body: Callable[[], object], warmup: int = 1) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``body()``, after ``warmup`` eager runs on a side stream (cuBLAS handles, Triton and
    extension builds, allocator warm-up happen outside the capture). GPU only."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def graph_us_per_call(call: Callable[[int], object], calls: int, reps: int) -> float:
    """Device microseconds per call of ``call(0), .., call(calls - 1)`` captured back to back in ONE CUDA graph:
    median over ``reps`` replays (after 3 untimed ones) / ``calls``. Launch gaps of the Python wrappers do not
    count; ``call(i)`` may rotate its inputs (e.g. over copies of a weight that together exceed L2). GPU only."""
    graph = capture_graph(lambda: [call(i) for i in range(calls)])
    for _ in range(3):
        graph.replay()
    seconds = time_calls(graph.replay, iters=reps, warmup=0)
    del graph
    return seconds * 1e6 / calls


# ---------------------------------------------------------------------------------------------- the floor
def copy_bandwidth(nbytes: int = COPY_BYTES, iters: int = 20) -> float:
    """Bytes per second (read + written) of a device-to-device copy of ``nbytes``: the floor's rate (see the
    module docstring). GPU only."""
    if not torch.cuda.is_available():
        raise RuntimeError("copy_bandwidth measures a GPU copy: no CUDA device is available")
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    seconds = time_calls(lambda: dst.copy_(src), iters=iters, warmup=3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def floor_s(bytes_moved: float, bandwidth: float) -> float:
    """Seconds the memory system needs for ``bytes_moved`` (read + written) at ``copy_bandwidth()``."""
    return bytes_moved / bandwidth


# ---------------------------------------------------------------------------------------------- header
def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"


def _driver() -> str:
    try:
        return os.popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader").read().strip() or "?"
    except OSError:
        return "?"


def environment() -> dict:
    """Where and with what a run happened, for the top of a results file (and its raw JSON): device, sms,
    l2_mib, driver (GPU only), date (UTC), torch, cuda, triton, transformers, python."""
    env = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               torch=torch.__version__, cuda=torch.version.cuda, triton=_version("triton"),
               transformers=_version("transformers"), python=platform.python_version())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(device=props.name, sms=props.multi_processor_count, l2_mib=round(props.L2_cache_size / 2**20),
                   driver=_driver())
    else:
        env.update(device=f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
    return env


def environment_line(env: dict, bandwidth: float | None = None) -> str:
    """One sentence for a results file: device, date, versions (and the measured copy bandwidth)."""
    device = env["device"] + (f" ({env['sms']} SMs, L2 {env['l2_mib']} MiB, driver {env['driver']})" if "sms" in env
                              else "")
    torch_version = env["torch"] + (f" (CUDA {env['cuda']})" if env.get("cuda") else "")
    line = (f"Device: {device}; date {env['date']}; torch {torch_version}, triton {env['triton']}, "
            f"transformers {env['transformers']}, python {env['python']}.")
    if bandwidth is not None:
        line += f" Measured copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write; the floor's rate)."
    return line


# ---------------------------------------------------------------------------------------------- tables
def table_header(columns: Sequence[str]) -> list[str]:
    """The two header lines of a markdown table."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def table_row(cells: Sequence[object]) -> str:
    """One markdown table row; cells are formatted with ``str``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A whole markdown table as lines."""
    return [*table_header(columns), *(table_row(r) for r in rows)]


def bit_check_table(checks: Sequence[dict]) -> list[str]:
    """The bit checks of a k-token pass (benchmarks/exact.py ``bit_checks``: per k, the pass vs k single-token passes
    and the sequence's rows alone vs in a ragged batch) as a markdown table."""
    return markdown_table(["k", "pass == k steps", "batch == alone", "max |diff|"],
                          [(c["k"], "yes" if c["pass_equals_steps"] else "NO",
                            "yes" if c["batch_equals_alone"] else "NO", f"{c['max_abs_diff']:.3g}") for c in checks])


def wait_health(base: str, timeout_s: float, poll_s: float) -> None:
    """Returns once ``base``/health answers 200 (a server subprocess has loaded and listens); RuntimeError after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(poll_s)
    raise RuntimeError(f"the server at {base} did not come up in {timeout_s:.0f} s")


def write_page(text: str, out: Path, name: str, write: bool, echo: bool = True) -> None:
    """A results page: ``out``/``name`` always, benchmarks/results/``name`` too with ``write``; printed with ``echo``
    (a page written early, to be kept if the run is cut short, need not be)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text)
    if write:
        (Path(__file__).resolve().parent / "results" / name).write_text(text)
    if echo:
        print(text)
