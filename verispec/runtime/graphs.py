"""CUDA graphs for the decode / verify pass, captured lazily on first use.

One graph per (rows, k) bucket: ``model.Model`` pads a batch up to its bucket (see ``Model.graph_rows``).

A captured pass reads ``tokens`` from a static input buffer and ``lengths`` from the cache's fixed
lengths buffer, computes positions and the attention mask on the device, writes K/V, advances
``lengths`` by k and leaves logits in a static output buffer. Replay = copy tokens in, replay, clone the
logits out (callers may hold logits across calls). Nothing here reads a device value on the host.

All graphs of one model share one memory pool: they are replayed one at a time, so their
intermediates may overlap; each graph's output buffer stays alive because the graph holds it.
"""
from __future__ import annotations

import gc
from typing import Callable

import torch
from torch import Tensor


class GraphCache:
    def __init__(self, step: Callable[[Tensor], Tensor], lengths: Callable[[int], Tensor]):
        self._step = step              # tokens [R, k] -> logits [R, k, V]; advances lengths by k
        self._lengths = lengths        # rows -> the [rows] lengths view the step uses (restored after warm-up)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor, Tensor]] = {}
        self._pool = None

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None

    def run(self, tokens: Tensor, out_rows: int | None = None) -> Tensor:
        """Replay the graph of tokens' shape (capturing it the first time); logits of the first
        ``out_rows`` rows (default all), cloned out of the static buffer."""
        key = tuple(tokens.shape)
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._capture(tokens)
            self._graphs[key] = entry
        graph, static_tokens, static_logits = entry
        static_tokens.copy_(tokens)
        graph.replay()
        return static_logits[:out_rows].clone()

    def _capture(self, tokens: Tensor):
        static_tokens = tokens.clone()
        lengths = self._lengths(tokens.shape[0])
        saved = lengths.clone()
        # Warm up on a side stream (cuBLAS handles, SDPA kernel choice); the warm-up writes the same K/V the
        # real pass will write, then lengths are put back so the replay below is the one that counts.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(static_tokens)
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
                static_logits = self._step(static_tokens)
        finally:
            if gc_enabled:
                gc.enable()
        lengths.copy_(saved)  # capture does not execute, but be explicit: replay advances lengths
        return graph, static_tokens, static_logits
