"""A request and the host-side state of its sequence: what was asked, what was emitted, when it ends.

A ``Request`` is what a caller submits (token ids, sampling settings, limits, stop strings, a callback
for streamed tokens). The scheduler turns it into a ``Sequence`` when it is admitted; ``Sequence.emit``
applies the end rules (max tokens, EOS, stop strings) to every chunk of emitted tokens; stop strings are
found by an incremental detokenizer (``detokenize.StopScanner``) that decodes only the new tokens' window.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

from ..drafters.base import Sampling
from ..verify.sampling import is_greedy
from .detokenize import StopScanner
from .stats import Generation, Stats

_ids = itertools.count()


@dataclass
class Request:
    """One generation request. ``prompt`` is token ids (encode text with the model's tokenizer first)."""

    prompt: list[int]
    max_new_tokens: int = 128
    temperature: float = 0.0       # 0 = greedy
    top_k: int = 0                 # 0 = off
    top_p: float = 1.0             # 1 = off
    seed: int = 0                  # keys this request's verification stream (and its drafts' draws)
    stop: tuple[str, ...] = ()     # stop strings (need a tokenizer)
    on_tokens: Callable[["Request", list[int]], None] | None = None   # called with each emitted chunk
    id: int = field(default_factory=lambda: next(_ids))
    submitted_at: float = field(default_factory=time.perf_counter)

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    @property
    def sampling(self) -> Sampling:
        """Its settings and seed, as one row of a batch's ``SamplingParams``."""
        return Sampling(float(self.temperature), int(self.top_k), float(self.top_p), int(self.seed))


@dataclass
class Sequence:
    """A request in the engine: the tokens it emitted so far, why it ended (None while running), and the state
    the engine keeps about it between rounds (``rounds_done``: its stream offset; ``k_state``). One object per
    request: the running batch is a list of them (``round.RunningBatch``), so compacting it moves each whole."""

    request: Request
    stats: Stats
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None       # the message when finish_reason == "error"
    text_cut: int | None = None    # characters of the text to keep when a stop string ended the run
    rounds_done: int = 0           # rounds this sequence took part in
    stop_scanner: StopScanner | None = field(default=None, repr=False)   # incremental text, for stop strings
    k_state: object = None         # the k policy's own state for this request (k="auto": ``auto_k.RowState``)

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt

    @property
    def tokens_left(self) -> int:
        """The tokens it may still emit (max_new_tokens less those generated)."""
        return self.request.max_new_tokens - len(self.generated)

    @property
    def stream_offset(self) -> int:
        """The offset of its next round in its verification stream: 0 was its first token (admission), round r
        (counted from 1) draws at offset r."""
        return self.rounds_done + 1

    def emit(self, chunk: list[int], eos: set[int], decode: Callable[[list[int]], str] | None) -> list[int]:
        """Append ``chunk`` up to this sequence's end (length, EOS, stop string); return what was kept."""
        kept = []
        for t in chunk[:self.tokens_left]:
            kept.append(t)
            if t in eos:
                self.finish_reason = "eos"
                break
        body = kept[:-1] if self.finish_reason == "eos" else kept      # the EOS has no text
        if self.request.stop and decode is not None and body:
            if self.stop_scanner is None:
                self.stop_scanner = StopScanner(decode, self.request.stop)
            hit = self.stop_scanner.scan(body)
            if hit is not None:                 # cut after the token that completed the stop string
                n, self.text_cut = hit
                kept, self.finish_reason = kept[:n], "stop"
        self.generated += kept
        if self.finish_reason is None and len(self.generated) >= self.request.max_new_tokens:
            self.finish_reason = "length"
        self.stats.new_tokens = len(self.generated)
        return kept

    def result(self, decode: Callable[[list[int]], str] | None) -> Generation:
        """The ``Generation`` of a finished (or cancelled) sequence."""
        body = self.generated[:-1] if self.finish_reason == "eos" else self.generated
        text = decode(body) if decode is not None else ""
        if self.text_cut is not None:
            text = text[: self.text_cut]
        return Generation(self.generated, text, self.stats, self.finish_reason or "length", self.request.prompt,
                          self.error)
