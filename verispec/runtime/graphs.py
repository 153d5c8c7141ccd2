"""CUDA graphs of the model's passes and of short prefills, captured lazily on first use.

A *program* is a function of one static input buffer that runs the model's passes (``Model._step``)
and returns its output tensors; nothing in it reads a device value on the host, so it can be captured.
Two kinds run here, one graph per key:

    ("step", rows, k)                  one decode / verify pass: tokens [rows, k] -> logits [rows, k, V]
    ("draft", rows, k, width, choose)  a whole draft loop (``Model.draft_loop``): a rollback, a [rows, 2]
                                       pass, then k - 1 single-token passes, each token chosen on the device

``rows`` is the batch bucket (``Model.graph_rows``): the model pads a batch up to it. A captured program
reads its inputs from its static buffer and ``lengths`` from the cache's fixed lengths buffer, computes
positions and the attention mask on the device, writes K/V, advances ``lengths`` and leaves its outputs
in static buffers. Replay = copy the inputs in (one copy), replay, copy the outputs out (the shared pool
below lets the next replay of another graph overwrite them). Rows of the input buffer past the live rows keep earlier values (zeros at
first): a program runs padding rows on any valid inputs and nobody reads their outputs.

All graphs of one model share one memory pool: they are replayed one at a time, so their intermediates
may overlap; each graph's output buffers stay allocated because this cache holds them, but a graph
captured later may place intermediates or outputs in memory an earlier one uses as scratch.

Prefill (``PrefillGraphs``): one graph per (prompts n, token bucket T) of ``Model.admit``; see the class.
"""
from __future__ import annotations

import gc
from typing import Callable, Hashable

import torch
from torch import Tensor

from ..device import copy_into

Program = Callable[[Tensor], tuple[Tensor, ...]]


class GraphCache:
    def __init__(self, step: Callable[[Tensor], Tensor], lengths: Callable[[int], Tensor]):
        self._step = step              # tokens [R, k] -> logits [R, k, V]; advances lengths by k
        self._lengths = lengths        # rows -> the [rows] lengths view the programs use (restored after warm-up)
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, Tensor, tuple[Tensor, ...]]] = {}
        self._pool = None
        self.captures = 0              # graphs captured over its life (a benchmark checks a timed run adds none)

    def __len__(self) -> int:
        return len(self._graphs)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    def count(self, kind: str) -> int:
        """Graphs captured of one kind ("step" or "draft")."""
        return sum(1 for key in self._graphs if key[0] == kind)

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None

    def run(self, tokens: Tensor, rows: int | None = None, width: int | None = None) -> Tensor:
        """One pass of ``tokens`` [B, k] in the graph of (rows, k) (rows >= B; default B), capturing it the
        first time; logits [B, width, V] (the first ``width`` tokens' rows, default all k) cloned out of the
        static buffer (callers may hold logits across calls)."""
        batch, k = tokens.shape
        rows = batch if rows is None else rows
        (logits,) = self.replay(("step", rows, k), lambda static: (self._step(static),), tokens, rows)
        return logits[:batch, :k if width is None else width].clone()

    def ensure(self, key: Hashable, program: Program, inputs: Tensor, rows: int) -> None:
        """Capture the graph of ``key`` if it is missing, without replaying it (``Model.warm_up``): the capture's
        warm-up runs restore ``lengths`` and write K/V only to slots at or past them (dead), so it is safe while
        sequences are running."""
        if key not in self._graphs:
            self._graphs[key] = self._capture(program, inputs, rows)
            graph = self._graphs[key][0]
            if graph is not None and not int(self._lengths(rows).count_nonzero()):
                graph.replay()   # every row is padding (nothing live): the first replay's one-time cost, now

    def replay(self, key: Hashable, program: Program, inputs: Tensor, rows: int) -> tuple[Tensor, ...]:
        """Replay the graph of ``key`` (capturing ``program`` the first time) with ``inputs`` [B, ...] (any
        device; B <= rows) copied into the leading rows of its [rows, ...] input buffer. Returns the
        program's static outputs: views that the next replay of ANY graph of this cache may overwrite
        (a graph captured later can hold its outputs where this one keeps intermediates): copy them first.

        On a CPU cache (no CUDA graphs) the program runs eagerly on the same padded input buffer: the
        capture-free path of exactly this code, which the CPU tests exercise."""
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(program, inputs, rows)
            self._graphs[key] = entry
        else:
            copy_into(entry[1], inputs)
        graph, static, outputs = entry
        if graph is None:
            return tuple(program(static))
        graph.replay()
        return outputs

    def _capture(self, program: Program, inputs: Tensor, rows: int):
        self.captures += 1
        device = self._lengths(rows).device
        static = torch.zeros((rows, *inputs.shape[1:]), dtype=inputs.dtype, device=device)
        copy_into(static, inputs)
        if device.type != "cuda":
            return None, static, ()
        lengths = self._lengths(rows)
        saved = lengths.clone()
        # Warm up on a side stream (cuBLAS handles, SDPA kernel choice, Triton compiles); the warm-up writes
        # the same K/V the real replay will write (same inputs), then lengths are put back so the replay below
        # is the one that counts.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                program(static)
                lengths.copy_(saved)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph, outputs = capture(lambda: program(static), self._pool)
        lengths.copy_(saved)  # capture does not execute, but be explicit: replay advances lengths
        return graph, static, tuple(outputs)


def capture(body: Callable[[], Tensor], pool) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """(graph, output) of ``body()`` captured into memory pool ``pool`` (its warm-up already done)."""
    graph = torch.cuda.CUDAGraph()
    # No cyclic GC inside the capture: a collected cycle (e.g. an old Model and its GraphCache, which
    # hold each other) can free CUDA graphs or memory mid-capture, which invalidates the capture
    # ("operation failed due to a previous error during capture"). torch.cuda.graph collects first.
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = body()
    finally:
        if gc_enabled:
            gc.enable()
    return graph, out


# ------------------------------------------------------------------------------------------ prefill
def pack_prefill(prompts: list[list[int]], T: int, first_row: int) -> Tensor:
    """The prefill's whole input as ONE host int64 tensor [n*T + n + 1] (one host -> device copy):
    n prompts right-padded with 0 to T tokens | each prompt's last index | the cache row of prompt 0.
    e.g. prompts [[5, 6, 7], [8]], T=4, first_row=2 -> [5, 6, 7, 0, 8, 0, 0, 0, 2, 0, 2]."""
    n = len(prompts)
    buf = torch.zeros(n * T + n + 1, dtype=torch.long)
    for b, p in enumerate(prompts):
        buf[b * T: b * T + len(p)] = torch.as_tensor(p, dtype=torch.long)
    buf[n * T: n * T + n] = torch.as_tensor([len(p) - 1 for p in prompts], dtype=torch.long)
    buf[-1] = first_row
    return buf


def unpack_prefill(buf: Tensor, n: int, T: int) -> tuple[Tensor, Tensor, Tensor]:
    """``pack_prefill``'s tensor (on any device) -> views tokens [n, T], last [n], first_row [1]."""
    return buf[: n * T].view(n, T), buf[n * T: n * T + n], buf[n * T + n:]


class PrefillGraphs:
    """CUDA graphs of the admission prefill: one per (prompts n, token bucket T), captured on first use.

    A graph reads ``pack_prefill``'s tensor from a static input buffer, so one graph serves every prompt of up
    to T tokens and every cache row: ``last`` and ``first_row`` are device values. It writes the prompts' K/V
    into cache rows [first_row, first_row + n), slots [0, T) (the padded tail's K/V land in dead slots past
    each prompt's length; causal attention keeps them out of the real tokens' results), and leaves logits
    [n, V] at each prompt's last token in a static output. Replay = one copy in, replay, clone the logits out.
    Prefill changes no ``lengths`` (``StaticKVCache.admit`` sets them on the host), so the warm-up passes only
    write the same K/V the replay writes again.
    """

    def __init__(self, prefill: Callable[[Tensor, Tensor, Tensor], Tensor]):
        self._prefill = prefill        # (tokens [n, T], last [n], first_row [1]) -> logits [n, V]
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor, Tensor]] = {}
        self._pool = None
        self.captures = 0              # graphs captured over this cache's life

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None

    def run(self, packed: Tensor, n: int, T: int) -> Tensor:
        """packed: ``pack_prefill(prompts, T, first_row)`` on the device -> logits [n, V] (a fresh tensor)."""
        entry = self._graphs.get((n, T))
        if entry is None:
            entry = self._graphs[(n, T)] = self._capture(packed, n, T)
        graph, static_in, static_logits = entry
        static_in.copy_(packed)
        graph.replay()
        return static_logits.clone()

    def ensure(self, packed: Tensor, n: int, T: int) -> None:
        """Capture the graph of (n, T) if it is missing, without replaying it (``Model.warm_up``). Its warm-up runs
        write K/V into the cache row ``packed`` names: call it on a row that holds no sequence."""
        if (n, T) not in self._graphs:
            self._graphs[(n, T)] = self._capture(packed, n, T)
            self._graphs[(n, T)][0].replay()   # the first replay's one-time cost, now (it writes the same free row)

    def _capture(self, packed: Tensor, n: int, T: int):
        self.captures += 1
        static_in = packed.clone()
        args = unpack_prefill(static_in, n, T)
        # Warm up on a side stream: Triton compilation, cuBLAS handles and SDPA's kernel choice happen outside
        # the capture.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._prefill(*args)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph, static_logits = capture(lambda: self._prefill(*args), self._pool)
        return graph, static_in, static_logits
