"""Incremental detokenization for streaming: text that is final, emitted once, in order.

Decoding token by token is wrong for byte-level BPE (a character may span tokens), so each update decodes
the whole generated list and emits the new suffix. Held back: a trailing U+FFFD (an incomplete UTF-8
sequence that the next token may complete) and the last len(longest stop string) - 1 characters (they may
begin a stop string, which must not reach the client). ``finish(text)`` emits the rest of the final text.
"""
from __future__ import annotations

from typing import Callable


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str], eos: set[int], stop: tuple[str, ...]):
        self.decode, self.eos = decode, eos
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.tokens: list[int] = []
        self.sent = ""

    def add(self, tokens: list[int]) -> str:
        """Tokens just emitted -> the text that became final with them ("" if none)."""
        self.tokens += tokens
        text = self.decode([t for t in self.tokens if t not in self.eos])
        text = text.rstrip("\ufffd")
        if self.hold:
            text = text[: max(len(text) - self.hold, 0)]
        return self._advance(text)

    def finish(self, final_text: str) -> str:
        """The sequence ended with ``final_text`` (its Generation.text) -> the text not yet sent."""
        return self._advance(final_text)

    def _advance(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new
