"""`verispec serve`'s own cost, without a GPU: the HTTP server vs the same engine in-process, on a model whose
pass is a fixed wall time with the GIL released.

On the GPU the engine thread spends most of a round waiting for the device (its one host sync per round, with
the GIL released); what it does in Python around that wait, and what the event loop's thread does in Python
(uvicorn, starlette, the chunks' JSON, the metrics), is what makes the server slower than the engine alone:
the two threads share the GIL, so every millisecond of Python on one delays the other. ``SleepingModel`` stands
for the device: each pass takes ``--pass-s`` seconds, asynchronously (the round's host read sleeps until it is
done, the GIL released, like a CUDA sync), and returns the
logits of a peaked model (each token's successor is fixed, as the 8B benchmark's ``--draft oracle`` makes it),
so requests run to their max_tokens and the text is real SmolLM2 tokens, detokenized as usual. What remains is
the engine's and the server's host work, measured on this CPU.

    python benchmarks/serve_overhead.py --out DIR [--write]        # sweep: in-process vs HTTP at 8 and 32 streams
    python benchmarks/serve_overhead.py serve --port N [--profile FILE] [verispec serve options]   # one server

For each concurrency C: one server process (``--max-batch-size C``; with ``--compare DIR`` a second one running
DIR's verispec, e.g. the commit before a change), driven ``--repeats`` times each, in turn, by a client with
``--num-prompts`` chat requests (streaming, greedy, ``--max-tokens`` tokens each, at most C in flight, all at
once): ``--client raw`` (default) reads each stream whole with a minimal asyncio HTTP client, the least client
work; ``--client openai`` is `verispec bench serve` (the openai client, as benchmarks/serve_http.py uses), whose
per-chunk parsing costs more than the server's own on this machine. Beside them ``--repeats`` in-process runs of
the same engine (``run_engine``: the same number of requests and tokens, all submitted at once, C rows).
Medians and the spread (min..max) of output tok/s. The server reports per round: the wall time of its steps,
the CPU time of the engine thread and of the event loop's thread (``/proc``), how late the engine thread got the
GIL back after the pass (the wait behind the event loop), and its mean running rows; and a sampled profile of
each thread (``Sampler``; ``serve --cprofile PREFIX`` writes cProfile tables instead). ``--server-cpu 0
--client-cpu 1`` pins the server and the in-process runs to one CPU and the client to the other (this machine
has 2 cores shared with other work: the numbers are a relative measure). ``--engine-process`` adds a server
running `verispec serve --engine-process` (the engine in a child process, with a GIL of its own; its child is
pinned with it under ``--server-cpu``, so leave pinning off to let the two processes use two cores).
``--stream-interval MS`` adds a server running `verispec serve --stream-interval MS` (a stream's rounds merged into
one chunk per MS), interleaved likewise; ``--client openai --client-processes N`` splits the client over N
processes. Each client run prints its CPU seconds (``client_cpu_s``: near its duration, the client set the pace).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if os.environ.get("SERVE_OVERHEAD_TREE"):          # a --compare server: that tree's verispec comes first
    sys.path.insert(0, os.environ["SERVE_OVERHEAD_TREE"])
from benchmarks.common import environment, environment_line, markdown_table, wait_health  # noqa: E402

NAME = "sleeper"
TREE_ENV = "SERVE_OVERHEAD_TREE"  # a server subprocess imports verispec from this directory (--compare)
SUCCESSOR_IDS = (1000, 40000)     # successors are drawn from ordinary tokens: never EOS or a special token


class _Config:
    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.num_layers = 1
        self.max_position_embeddings = 1 << 20


class SleepingModel:
    """The runtime contract (``setup_cache``, ``admit``, ``append``, ``rollback``, ``keep``, ``lengths``) over no
    weights: a pass takes ``pass_s`` seconds and the logits put all their mass on ``successor[token]`` (a fixed
    random map), so greedy decoding follows the successor chain.

    Asynchronous like a GPU: ``append`` returns at once and the pass is "done" ``pass_s`` later; the round's one
    host read waits for it (``wait_device``, which ``device_waits(model)`` puts in front of the engine's
    ``read_outcome``), sleeping with the GIL released, so that the host's work between the launch and the read
    (verification, and whatever else holds the GIL) overlaps the pass as it does on the GPU. Without
    ``device_waits`` (tests) no pass waits. An admission sleeps ``pass_s`` in place (a prefill). Each wait
    records how late it returned (``overshoot_s``: the OS's jitter plus the wait for the GIL).

    The logits are views of one zeroed buffer per width, [B_max, w, V]: each pass clears the ones it set last
    time, so a pass costs O(B w), not O(B w V) (verification reads them before the next pass)."""

    def __init__(self, tokenizer, pass_s: float, seed: int = 0):
        self.tokenizer = tokenizer
        self.pass_s = pass_s
        self.config = _Config(tokenizer.vocab_size)
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        g = torch.Generator().manual_seed(seed)
        lo, hi = SUCCESSOR_IDS
        self.successor = torch.randint(lo, hi, (self.config.vocab_size,), generator=g)     # [V]
        self.overshoot_s = 0.0
        self.passes = 0
        self.ready_at = 0.0          # perf_counter when the last launched pass is done
        self.launches = 0            # passes and admissions launched
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def setup_cache(self, batch_size: int, max_seq_len: int, empty: bool = False) -> None:
        self._lengths = torch.zeros(batch_size, dtype=torch.long)
        self.max_seq_len = max_seq_len
        self._batch = 0 if empty else batch_size
        self._buffers = {}

    @property
    def lengths(self) -> torch.Tensor:
        return self._lengths[: self._batch]

    def _sleep(self) -> None:
        self.launches += 1
        self.ready_at = time.perf_counter() + self.pass_s
        self.wait_device()

    def wait_device(self) -> None:
        """Block (GIL released) until the last launched pass is done."""
        left = self.ready_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
            self.overshoot_s += time.perf_counter() - self.ready_at
            self.passes += 1

    def _peaked(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [n, w] -> logits [n, w, V], one-hot on each token's successor."""
        n, w = tokens.shape
        buf, last = self._buffers.get(w, (None, None))
        if buf is None:
            buf = torch.zeros(self._lengths.shape[0], w, self.config.vocab_size)
        elif last is not None:
            buf.view(-1, self.config.vocab_size)[last[0], last[1]] = 0.0
        idx = self.successor[tokens.reshape(-1)]                                    # [n w]
        rows = torch.arange(n * w)
        buf.view(-1, self.config.vocab_size)[rows, idx] = 1.0
        self._buffers[w] = (buf, (rows, idx))
        return buf[:n]

    def admit(self, prompts: list[list[int]]) -> torch.Tensor:
        first = self._batch
        if first + len(prompts) > self._lengths.shape[0]:
            raise ValueError("admit: no free rows")
        self._sleep()
        self._lengths[first: first + len(prompts)] = torch.tensor([len(p) for p in prompts])
        self._batch = first + len(prompts)
        # the prompt's last token decides: [n, V] (a copy: admission's logits outlive the next pass)
        return self._peaked(torch.tensor([[p[-1]] for p in prompts]))[:, 0].clone()

    def append(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.shape[0] != self._batch:
            raise ValueError(f"tokens must be [B={self._batch}, k], got {tuple(tokens.shape)}")
        self.ready_at = time.perf_counter() + self.pass_s          # launched: done pass_s from now
        self.launches += 1
        self.lengths.add_(tokens.shape[1])
        return self._peaked(tokens)

    def rollback(self, new_lengths) -> None:
        torch.minimum(torch.as_tensor(new_lengths).long(), self.lengths, out=self.lengths)

    def keep(self, batch_indices) -> None:
        idx = torch.as_tensor(batch_indices, dtype=torch.long)
        self._lengths[: len(idx)] = self._lengths[idx].clone()
        self._batch = len(idx)


@contextlib.contextmanager
def device_waits(model: SleepingModel):
    """The engine's round reads its outcome only once ``model``'s pass is done (a GPU's host sync)."""
    from verispec.engine import round as round_module

    read = round_module.read_outcome

    def read_outcome(out):
        model.wait_device()
        return read(out)

    round_module.read_outcome = read_outcome
    try:
        yield
    finally:
        round_module.read_outcome = read


# ------------------------------------------------------------------------------------------ the server side
def _thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (/proc)."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """A stdlib sampling profiler: every ``interval_s`` it reads the frames of the threads it watches
    (``sys._current_frames``) and counts, per thread, the innermost frame in verispec, uvicorn, starlette, fastapi,
    h11, json, prometheus_client, tokenizers or asyncio (``where``), and the leaf function. A thread waiting in
    ``time.sleep`` (the pass) or in ``select`` (the idle event loop) counts as idle."""

    def __init__(self, threads: dict[str, int], native: dict[str, int], interval_s: float = 0.002):
        self.threads, self.interval_s = threads, interval_s        # name -> threading ident
        self.native = native                                       # name -> the thread's id in /proc
        self.cpu_s = {n: 0.0 for n in threads}                     # the last reading (a thread's CPU, while it lives)
        self.cpu_base_s = {n: _thread_cpu_s(tid) for n, tid in native.items()}   # before serving (imports, loading)
        self.counts: dict[str, dict[str, int]] = {n: {} for n in threads}
        self.leaves: dict[str, dict[str, int]] = {n: {} for n in threads}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def _run(self) -> None:
        tick = 0
        while not self.stopped.wait(self.interval_s):
            tick += 1
            if tick % 100 == 0:
                self._read_cpu()
            frames = sys._current_frames()
            for name, ident in self.threads.items():
                frame = frames.get(ident)
                if frame is not None:
                    where, leaf = _attribute(frame)
                    self.counts[name][where] = self.counts[name].get(where, 0) + 1
                    self.leaves[name][leaf] = self.leaves[name].get(leaf, 0) + 1

    def _read_cpu(self) -> None:
        for name, tid in self.native.items():
            try:
                self.cpu_s[name] = _thread_cpu_s(tid) - self.cpu_base_s[name]
            except OSError:              # the thread has ended: keep its last reading
                pass

    def report(self) -> dict:
        self._read_cpu()
        return {"interval_s": self.interval_s, "where": self.counts, "leaf": self.leaves}


_PACKAGES = ("verispec", "uvicorn", "starlette", "fastapi", "h11", "prometheus_client", "openai", "json", "asyncio",
             "tokenizers", "selectors", "threading", "torch")


def _attribute(frame) -> tuple[str, str]:
    code = frame.f_code
    leaf = f"{_short(code.co_filename)}:{code.co_name}"
    if code.co_name in ("sleep", "select", "poll", "wait") and frame.f_back is not None:
        parent = frame.f_back.f_code
        if code.co_name == "sleep" or "selectors" in parent.co_filename or code.co_name == "select":
            return "idle", leaf
    f = frame
    while f is not None:
        name = _short(f.f_code.co_filename)
        if name.startswith("verispec/") or name.startswith("benchmarks/"):
            return f"{name}:{f.f_code.co_name}", leaf
        f = f.f_back
    return _short(code.co_filename).split("/")[0], leaf


def _short(path: str) -> str:
    for pkg in _PACKAGES:
        key = f"/{pkg}/"
        if key in path:
            return pkg + "/" + path.rsplit(key, 1)[1]
    if path.endswith(("/json/__init__.py", "/json/encoder.py")):
        return "json/" + os.path.basename(path)
    return os.path.basename(path)


def serve_main(argv: list[str]) -> int:
    """One `verispec serve` over a SleepingModel (its own options: --pass-s, --profile FILE; the rest are
    `verispec serve`'s)."""
    from verispec.runtime.loading import load_tokenizer
    from verispec.serve import server as serve_module
    from verispec.serve.cli import add_arguments, check_args

    parser = argparse.ArgumentParser(prog="serve_overhead.py serve")
    add_arguments(parser)
    parser.add_argument("--pass-s", type=float, default=0.010, help="seconds each pass takes")
    parser.add_argument("--profile", default=None, help="write per-thread CPU, GIL waits and samples here (JSON)")
    parser.add_argument("--cprofile", default=None, help="cProfile both threads (slows them): write PREFIX.engine.txt "
                        "and PREFIX.loop.txt")
    args = parser.parse_args(["--served-model-name", NAME, "--device", "cpu", *argv])
    check_args(args)
    torch.set_num_threads(1)
    if args.engine_process:
        return _serve_engine_process(args)
    target = SleepingModel(load_tokenizer(), args.pass_s)
    engine, app = serve_module.assemble(target, None, args)
    sampler_box: list = []
    if args.profile:
        engine.thread.start = _started(engine.thread.start, lambda: _begin_profile(engine, sampler_box))
    with device_waits(target):
        if args.cprofile:
            code = _cprofiled(args.cprofile, engine, lambda: serve_module.serve(engine, app, args))
        else:
            code = serve_module.serve(engine, app, args)
    if args.profile:
        _write_profile(args.profile, engine, target, sampler_box)
    return code


def load_sleeper(args):
    """(SleepingModel, no drafter) with its device waits installed for good: ``--engine-process``'s loader, run in
    the engine process. With ``--profile FILE`` the engine process writes FILE.engine.json as it exits: its passes,
    how late their waits returned, and its CPU seconds (all its threads) after loading."""
    from multiprocessing.util import Finalize

    from verispec.runtime.loading import load_tokenizer

    torch.set_num_threads(1)
    target = SleepingModel(load_tokenizer(), args.pass_s)
    target.waits = device_waits(target)      # held: a collected context manager would undo its patch
    target.waits.__enter__()
    if args.profile:
        base = time.process_time()

        def write() -> None:
            Path(args.profile + ".engine.json").write_text(json.dumps(
                {"passes": target.passes, "overshoot_s": target.overshoot_s, "cpu_s": time.process_time() - base}))

        Finalize(None, write, exitpriority=10)     # multiprocessing's children skip atexit
    return target, None


def _serve_engine_process(args) -> int:
    """``serve --engine-process``: the engine in its own process (``load_sleeper``); the profile samples this
    process's event loop and its reader thread, and takes the engine's side from FILE.engine.json."""
    from verispec.serve import server as serve_module
    from verispec.serve.engine_process import assemble_process

    engine, app = assemble_process(load_sleeper, args)
    box: list = []
    if args.profile:
        def begin() -> None:
            main = threading.main_thread()
            sampler = Sampler({"event loop": main.ident, "reader": engine.reader.ident},
                              {"event loop": main.native_id, "reader": engine.reader.native_id})
            box.append(sampler)
            sampler.thread.start()

        engine.start = _started(engine.start, begin)
    code = serve_module.serve(engine, app, args)
    if args.profile:
        sampler = box[0]
        sampler.stopped.set()
        samples = sampler.report()
        child = json.loads(Path(args.profile + ".engine.json").read_text())
        metrics = engine.metrics
        report = {"step_s": metrics.rounds._sum.get(), "rounds": metrics.rounds._count.get(),
                  "tokens": metrics.generation_tokens._value.get(), "passes": child["passes"],
                  "overshoot_s": child["overshoot_s"],
                  "cpu_s": {"engine": child["cpu_s"],
                            "event loop": sampler.cpu_s["event loop"] + sampler.cpu_s["reader"]},
                  "samples": samples}
        Path(args.profile).write_text(json.dumps(report, indent=1))
    return code


def _cprofiled(prefix: str, engine, body):
    """Run ``body()`` (the event loop, this thread) and the engine thread each under cProfile; write the top
    functions by own time and by cumulative time to PREFIX.loop.txt / PREFIX.engine.txt."""
    import cProfile
    import io
    import pstats

    profiles = {"loop": cProfile.Profile(), "engine": cProfile.Profile()}
    run = engine._run

    def profiled_run():
        profiles["engine"].runcall(run)

    engine.thread._target = profiled_run
    try:
        return profiles["loop"].runcall(body)
    finally:
        engine.join()
        for name, prof in profiles.items():
            out = io.StringIO()
            stats = pstats.Stats(prof, stream=out)
            stats.sort_stats("tottime").print_stats(40)
            stats.sort_stats("cumulative").print_stats(60)
            Path(f"{prefix}.{name}.txt").write_text(out.getvalue())


def _started(start, then):
    def wrapped():
        start()
        then()
    return wrapped


def _begin_profile(engine, box: list) -> None:
    main = threading.main_thread()
    sampler = Sampler({"engine": engine.thread.ident, "event loop": main.ident},
                      {"engine": engine.thread.native_id, "event loop": main.native_id})
    box.append(sampler)
    sampler.thread.start()


def _write_profile(path: str, engine, target: SleepingModel, box: list) -> None:
    sampler = box[0]
    sampler.stopped.set()
    samples = sampler.report()
    steps = engine.metrics.rounds._sum.get()       # wall seconds of the steps that ran a round
    report = {"step_s": steps, "rounds": engine.scheduler.totals.rounds, "tokens": engine.scheduler.totals.new_tokens, "passes": target.passes, "overshoot_s": target.overshoot_s,
              "cpu_s": sampler.cpu_s, "samples": samples}
    Path(path).write_text(json.dumps(report, indent=1))


# ------------------------------------------------------------------------------------------ the sweep
def _pin(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None else []


RAW_CLIENT = r"""
import asyncio, json, random, re, sys, time
from verispec.bench.serving import WORDS
port, n, concurrency, input_len, max_tokens, seed = map(int, sys.argv[1:7])
rng = random.Random(seed)
prompts = [" ".join(rng.choice(WORDS) for _ in range(input_len)) for _ in range(n)]
FIRST = re.compile(rb'"token_ids":\s*\[\d')
USAGE = re.compile(rb'"completion_tokens":\s*(\d+)')

async def one(prompt, gate, out):
    async with gate:
        body = json.dumps({"model": "sleeper", "messages": [{"role": "user", "content": prompt}], "max_tokens":
                           max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode())
        data, ttft = b"", None
        while True:
            got = await reader.read(1 << 16)
            if not got:
                break
            data += got
            if ttft is None and FIRST.search(data):
                ttft = time.perf_counter() - start
        writer.close()
        tokens = USAGE.findall(data)
        if not data.startswith(b"HTTP/1.1 200") or not tokens:
            raise RuntimeError(data[:300])
        out.append((ttft, time.perf_counter() - start, int(tokens[-1])))

async def main():
    gate, out = asyncio.Semaphore(concurrency), []
    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(p, gate, out) for p in prompts))
    duration = time.perf_counter() - start
    ttfts = sorted(t for t, _, _ in out)
    print(json.dumps({"completed": len(out), "output_throughput": sum(k for _, _, k in out) / duration,
                      "p50_ttft_ms": 1e3 * ttfts[len(ttfts) // 2], "duration_s": duration,
                      "client_cpu_s": time.process_time() - cpu}))

asyncio.run(main())
"""


def _client_run(concurrency: int, args, out: Path, base: str, port: int, i: int) -> dict:
    """One run of the client (``--client``) -> its summary (output_throughput, p50_ttft_ms, completed)."""
    if args.client == "raw":
        run = subprocess.run([*_pin(args.client_cpu), sys.executable, "-c", RAW_CLIENT, str(port),
                              str(args.num_prompts), str(concurrency + args.queued), str(args.input_len),
                              str(args.max_tokens),
                              str(i)], capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            raise RuntimeError(f"the raw client failed: {run.stderr[-800:]}")
        return json.loads(run.stdout)
    label = f"c{concurrency}_{i}"
    bench = subprocess.run([*_pin(args.client_cpu), sys.executable, "-m", "verispec.cli", "bench", "serve",
                            "--url", base, "--endpoint", "chat", "--num-prompts", str(args.num_prompts),
                            "--request-rate", "inf", "--max-concurrency", str(concurrency + args.queued),
                            "--random-input-len", str(args.input_len), "--random-range-ratio", "0",
                            "--random-output-len", str(args.max_tokens), "--temperature", "0",
                            "--seed", str(i), "--client-processes", str(args.client_processes),
                            "--out", str(out), "--label", label],
                           capture_output=True, text=True, timeout=600)
    if bench.returncode != 0:
        raise RuntimeError(f"bench serve failed: {bench.stderr[-800:]}")
    return json.loads((out / f"{label}.json").read_text())["summary"]


def http_runs(concurrency: int, args, out: Path, port: int) -> dict[str, tuple[list[float], dict]]:
    """One server per tree (this one: "this tree"; ``--compare DIR``: also DIR's verispec) at ``concurrency`` rows,
    all started first, then driven in turn, ``args.repeats`` times each (interleaved, so that a change in the
    machine's load falls on all alike) -> {server: (output tok/s per run, its profile)}."""
    trees = {"this tree": (None, []),
             **({f"{args.compare_label}": (args.compare, [])} if args.compare else {}),
             **({"this tree, --engine-process": (None, ["--engine-process"])} if args.engine_process else {}),
             **({f"this tree, --stream-interval {args.stream_interval:g}":
                 (None, ["--stream-interval", str(args.stream_interval)])} if args.stream_interval else {})}
    servers = {}
    try:
        for j, (label, (tree, extra)) in enumerate(trees.items()):
            env = {**os.environ, **({TREE_ENV: os.path.abspath(tree)} if tree else {})}
            name = f"c{concurrency}_{j}"
            proc = subprocess.Popen([*_pin(args.server_cpu), sys.executable, __file__, "serve", "--port",
                                     str(port + 10 * j), "--max-batch-size", str(concurrency), "--pass-s",
                                     str(args.pass_s), "--max-seq-len", "1024", "--log-level", "warning",
                                     "--profile", str(out / f"profile_{name}.json"), *extra], env=env,
                                    stdout=subprocess.DEVNULL, stderr=open(out / f"server_{name}.log", "w"))
            servers[label] = (proc, port + 10 * j, out / f"profile_{name}.json", [])
        for label, (_, p, _, _) in servers.items():
            wait_health(f"http://127.0.0.1:{p}", 120, poll_s=0.2)
        for i in range(args.repeats + 1):              # the first run warms up (connections, imports)
            for label, (_, p, _, rates) in servers.items():
                summary = _client_run(concurrency, args, out, f"http://127.0.0.1:{p}", p, i)
                if summary.get("failed", 0) or summary["completed"] != args.num_prompts:
                    raise RuntimeError(f"the client: {summary}")
                if i:
                    rates.append(summary["output_throughput"])
                print(f"HTTP C={concurrency} {label} run {i}: {summary['output_throughput']:.0f} tok/s, TTFT p50 "
                      f"{summary['p50_ttft_ms']:.0f} ms, {summary['duration_s']:.2f} s, client CPU "
                      f"{summary['client_cpu_s']:.2f} s", flush=True)
    finally:
        for proc, _, _, _ in servers.values():
            proc.terminate()
        for proc, _, _, _ in servers.values():
            proc.wait(60)
    return {label: (rates, json.loads(profile.read_text())) for label, (_, _, profile, rates) in servers.items()}


def in_process_runs(concurrency: int, args) -> tuple[list[float], float, float, float]:
    """``args.repeats`` runs of the engine alone -> (output tok/s per run, mean overshoot per pass in s, CPU s per
    round, wall s per round)."""
    from verispec.bench.measure import run_engine
    from verispec.runtime.loading import load_tokenizer

    target = SleepingModel(load_tokenizer(), args.pass_s)
    rng = random.Random(0)
    prompts = [[rng.randrange(*SUCCESSOR_IDS) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    rates, cpu_s, rounds, wall_s = [], 0.0, 0, 0.0
    for i in range(args.repeats + 1):
        target.overshoot_s, target.passes = 0.0, 0
        cpu = time.thread_time()
        with device_waits(target):
            run = run_engine(target, None, prompts, k=0, max_new_tokens=args.max_tokens,
                             arrivals=[0.0] * len(prompts), max_batch=concurrency)
        if i:
            rates.append(run.tokens_per_s)
            cpu_s, rounds, wall_s = cpu_s + time.thread_time() - cpu, rounds + run.rounds, wall_s + run.seconds
        print(f"in-process C={concurrency} run {i}: {run.tokens_per_s:.0f} tok/s", flush=True)
    return rates, target.overshoot_s / max(target.passes, 1), cpu_s / max(rounds, 1), wall_s / max(rounds, 1)


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}..{max(xs):.0f})"


def _top(counts: dict[str, int], n: int) -> str:
    total = sum(counts.values()) or 1
    busy = {k: v for k, v in counts.items() if k != "idle"}
    items = sorted(busy.items(), key=lambda kv: -kv[1])[:n]
    return "; ".join(f"`{k}` {100 * v / total:.0f}%" for k, v in items)


def sweep(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.server_cpu is not None:
        os.sched_setaffinity(0, {args.server_cpu})        # the in-process runs share the server's core
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    rows, profiles = [], []
    for i, c in enumerate(args.concurrency):
        engine_rates, engine_overshoot, engine_cpu, engine_wall = in_process_runs(c, args)
        for label, (http_rates, prof) in http_runs(c, args, out, args.port + 100 * i).items():
            rounds = max(prof["rounds"], 1)
            ratio = statistics.median(http_rates) / statistics.median(engine_rates)
            rows.append((c, label, _spread(engine_rates), _spread(http_rates), f"{ratio:.2f}",
                         f"{1e3 * engine_wall:.1f}", f"{1e3 * prof['step_s'] / rounds:.1f}", f"{1e3 * engine_cpu:.2f}",
                         f"{1e3 * prof['cpu_s']['engine'] / rounds:.2f}",
                         f"{1e3 * prof['cpu_s']['event loop'] / rounds:.2f}", f"{1e3 * engine_overshoot:.2f}",
                         f"{1e3 * prof['overshoot_s'] / max(prof['passes'], 1):.2f}", f"{prof['tokens'] / rounds:.1f}"))
            profiles.append((c, label, prof))
    command = (f"python benchmarks/serve_overhead.py --concurrency {','.join(map(str, args.concurrency))} "
               f"--num-prompts {args.num_prompts} --max-tokens {args.max_tokens} --input-len {args.input_len} "
               f"--pass-s {args.pass_s} --repeats {args.repeats}"
               + (f" --server-cpu {args.server_cpu} --client-cpu {args.client_cpu}" if args.server_cpu is not None
                  else "") + (f" --queued {args.queued}" if args.queued else "")
               + (" --engine-process" if args.engine_process else "") + (f" --compare DIR --compare-label {args.compare_label!r}" if args.compare else ""))
    lines = ["# `verispec serve`'s own cost: HTTP vs in-process on a sleeping model (CPU)", "",
             environment_line(environment()), f"CPUs: {os.cpu_count()} (shared with other work: a relative measure); "
             f"load average (1, 5, 15 min) at the start {', '.join(f'{x:.2f}' for x in load_before)}, at the end "
             f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}",
             "", f"Command: `{command}` ({time.perf_counter() - t0:.0f} s in all). `SleepingModel`: each pass takes "
             f"{args.pass_s * 1e3:.0f} ms, asynchronously like a GPU's (the round's host read sleeps until it is "
             "done, the GIL released), logits one-hot on a fixed "
             "successor (requests run to max_tokens; real SmolLM2 tokens, detokenized). Chat requests, greedy, "
             f"streamed, {args.num_prompts} per run, all at once, at most C + {args.queued} in flight for C rows "
             f"(client: {args.client}); "
             f"in-process: `run_engine`, the same count and lengths, all at once, C rows. Medians of {args.repeats} "
             "runs (min..max) after one warm-up run.", "",
             "Per round: wall ms in-process (the run's time / rounds) and of the server's steps that ran a round (the "
             "`verispec_round_seconds` summary); CPU ms of the engine in-process; in the server, of the engine thread and of the event loop's thread; GIL wait: how late the host read's "
             "wait for the pass returned (mean per pass; in-process beside it); tokens/round: the server's mean running "
             "rows (C at most; in-process nearly C)."
             + (" The --engine-process server (`verispec serve --engine-process`): its engine columns are the "
                "engine process's (CPU: all its threads, after loading; GIL wait: its host reads' lateness), its "
                "event loop CPU is the HTTP process's event loop plus the thread that reads the engine's events."
                if args.engine_process else ""), ""]
    lines += markdown_table(["C", "server", "in-process tok/s", "HTTP tok/s", "HTTP / in-process", "in-process ms/round",
                             "server step ms/round", "in-process CPU ms/round",
                             "server: engine thread CPU ms/round",
                             "event loop CPU ms/round", "GIL wait ms/pass in-process", "GIL wait ms/pass HTTP",
                             "HTTP tokens/round"], rows)
    for c, label, prof in profiles:
        lines += ["", f"Where the busy samples went at C={c}, {label} (share of all samples of that thread, every "
                      f"{prof['samples']['interval_s'] * 1e3:.0f} ms):", ""]
        for name in prof["samples"]["where"]:
            lines.append(f"- {name}: " + _top(prof["samples"]["where"][name], args.top))
            lines.append(f"  - leaf functions: " + _top(prof["samples"]["leaf"][name], args.top))
    text = "\n".join(lines) + "\n"
    (out / "serve_overhead.md").write_text(text)
    if args.write:
        (Path(__file__).resolve().parent / "results" / "serve_overhead.md").write_text(text)
    print(text)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        sys.exit(serve_main(argv[1:]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="8,32", help="comma-separated streams in flight (and server rows)")
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--pass-s", type=float, default=0.010, help="seconds each model pass takes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server-cpu", type=int, default=None, help="pin the server and the in-process runs here")
    ap.add_argument("--client-cpu", type=int, default=None, help="pin the benchmark client here")
    ap.add_argument("--queued", type=int, default=0, help="the client keeps C + QUEUED requests in flight (the "
                    "server C rows): a queue that refills a row the moment one ends, as in-process (all at once) "
                    "does; with 0 each row waits for the client's next request (a turnaround per request)")
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--compare", default=None, metavar="DIR", help="also serve with the verispec package found in "
                    "DIR (e.g. `git worktree add DIR <commit>`), interleaved with this tree's server")
    ap.add_argument("--compare-label", default="compared", help="the --compare server's name in the table")
    ap.add_argument("--engine-process", action="store_true", help="also serve with `--engine-process` (the engine "
                    "in its own process), interleaved with the in-thread server")
    ap.add_argument("--client", choices=("raw", "openai"), default="raw",
                    help="raw: a minimal asyncio HTTP client (reads each stream whole: the least client work); "
                         "openai: `verispec bench serve` (the openai client, as benchmarks/serve_http.py)")
    ap.add_argument("--client-processes", type=int, default=1, help="with --client openai: `verispec bench serve "
                    "--client-processes N` (the requests split over N client processes, all pinned to --client-cpu)")
    ap.add_argument("--stream-interval", type=float, default=0.0, metavar="MS", help="also serve with "
                    "`--stream-interval MS` (a stream's chunks at most every MS ms), interleaved with the plain server")
    ap.add_argument("--top", type=int, default=8, help="entries per profile line")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/serve_overhead"))
    ap.add_argument("--write", action="store_true", help="also write benchmarks/results/serve_overhead.md")
    args = ap.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    if (args.server_cpu is None) != (args.client_cpu is None):
        ap.error("--server-cpu and --client-cpu go together")
    sweep(args)


if __name__ == "__main__":
    main()
