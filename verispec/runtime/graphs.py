"""CUDA graphs for the decode / verify pass and for short prefills, captured lazily on first use.

Decode / verify (``GraphCache``): one graph per (rows, k) bucket: ``model.Model`` pads a batch up to its bucket
(see ``Model.graph_rows``).

A captured pass reads ``tokens`` from a static input buffer and ``lengths`` from the cache's fixed
lengths buffer, computes positions and the attention mask on the device, writes K/V, advances
``lengths`` by k and leaves logits in a static output buffer. Replay = copy tokens in, replay, clone the
logits out (callers may hold logits across calls). Nothing here reads a device value on the host.

Prefill (``PrefillGraphs``): one graph per (prompts n, token bucket T) of ``Model.admit``; see the class.

The graphs of one ``GraphCache`` (of one ``PrefillGraphs``) share one memory pool: they are replayed one at a
time, so their intermediates may overlap; each graph's output buffer stays alive because the graph holds it.
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
        graph, static_logits = capture(lambda: self._step(static_tokens), self._pool)
        lengths.copy_(saved)  # capture does not execute, but be explicit: replay advances lengths
        return graph, static_tokens, static_logits


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

    def _capture(self, packed: Tensor, n: int, T: int):
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
