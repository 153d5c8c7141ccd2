"""CUDA graphs of the model's passes, captured lazily on first use.

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

    def run(self, tokens: Tensor, rows: int | None = None) -> Tensor:
        """One pass of ``tokens`` [B, k] in the graph of (rows, k) (rows >= B; default B), capturing it the
        first time; logits [B, k, V] cloned out of the static buffer (callers may hold logits across calls)."""
        batch, k = tokens.shape
        rows = batch if rows is None else rows
        (logits,) = self.replay(("step", rows, k), lambda static: (self._step(static),), tokens, rows)
        return logits[:batch].clone()

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
        graph = torch.cuda.CUDAGraph()
        # No cyclic GC inside the capture: a collected cycle (e.g. an old Model and its GraphCache, which
        # hold each other) can free CUDA graphs or memory mid-capture, which invalidates the capture
        # ("operation failed due to a previous error during capture"). torch.cuda.graph collects first.
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = program(static)
        finally:
            if gc_enabled:
                gc.enable()
        lengths.copy_(saved)  # capture does not execute, but be explicit: replay advances lengths
        return graph, static, tuple(outputs)
