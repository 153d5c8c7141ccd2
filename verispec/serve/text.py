"""Streamed text: each chunk's text, final and in order, made on the event loop (``Handle.receive``).

Built on ``verispec.engine.detokenize.IncrementalDetokenizer``, so a chunk costs its own length, not the
generation's. Held back: a trailing incomplete UTF-8 character (the next token may complete it), the last
len(longest stop string) - 1 characters (they may begin a stop string) and a stop string that is complete
(its chunk arrives before the request's end): no part of a stop string reaches the client.
``finish(sequence)`` returns the rest when the request ends: up to the stop string's cut, if one ended it.
"""
from __future__ import annotations

from typing import Callable

from ..engine.detokenize import IncrementalDetokenizer


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str], eos: set[int], stop: tuple[str, ...]):
        self.detok = IncrementalDetokenizer(decode)
        self.eos = eos
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = 0              # characters sent so far
        self.base = 0              # characters of final text before ``unsent``
        self.unsent = ""           # final text from ``base`` on (base <= sent: what may still go out)

    def add(self, tokens: list[int]) -> str:
        """Tokens just emitted -> the text that became safe to send with them ("" if none)."""
        self.unsent += self.detok.add([t for t in tokens if t not in self.eos])
        known = self.unsent + self.detok.pending                  # starts at character ``base``
        end = self.base + max(len(known) - self.hold, 0)
        # the chunk that completes a stop string arrives before the end of the request: never send from the
        # stop string on (``known`` starts at or before what was sent, so an earlier one cannot be missed)
        hits = [i for i in (known.find(s) for s in self.stop) if i >= 0]
        if hits:
            end = min(end, self.base + min(hits))
        piece = known[self.sent - self.base:end - self.base] if end > self.sent else ""
        self.sent += len(piece)
        final_end = self.base + len(self.unsent)
        keep_from = min(self.sent, final_end)                       # drop what no later call needs
        self.unsent = self.unsent[keep_from - self.base:]
        self.base = keep_from
        return piece

    def finish(self, sequence) -> str:
        """The request ended (``sequence``: its engine Sequence) -> the text not yet sent."""
        text = self.unsent + self.detok.flush()
        end = self.base + len(text)
        if sequence.text_cut is not None:
            end = min(end, sequence.text_cut)
        return text[self.sent - self.base:end - self.base] if end > self.sent else ""
