"""Incremental detokenization: the text of a growing token list in time linear in its length.

Decoding token by token is wrong: in byte-level BPE a character's UTF-8 bytes may span tokens, and a
SentencePiece decoder drops the leading space of the first token it sees. Decoding the whole list after
every chunk is right but quadratic. As in vLLM and HF TGI, decode only a *window* of recent tokens that
starts at a point where the text is complete, and emit what the new tokens added to the window's text:

    ids     .. 17  952  | 3061  88 | 2231  40 ..
                 start ^    read ^          ^ end            (indices into ids)
    window_text = decode(ids[start:read])                     (cached: no decode)
    text        = decode(ids[start:end])                      (ONE decode per add)
    new text    = text[len(window_text):]                     final unless it ends in U+FFFD

e.g. "é" = bytes C3 A9 as two tokens: decode([C3]) = "\\ufffd" (incomplete: nothing is emitted, read stays),
decode([C3, A9]) = "é" (emitted; read moves past both).

Why it is exact: ``read`` only moves to a point where the decoded text ends in a complete character, so a
UTF-8 decoder's state is clean there and the bytes after it decode the same whatever came before. The
window keeps at least one token before ``read`` (SentencePiece's leading space is stripped from the
window's first token only, never from the new ones). When the window has grown past ``WINDOW`` tokens it
slides forward (start = read - 1; one extra decode of a single token), so each add decodes at most
WINDOW + 1 + (the tokens added) + (tokens whose text is still an incomplete character) ids.

If a tokenizer breaks the assumption (the window's text is not a prefix of the longer window's text), this
detokenizer switches to decoding the whole list for the rest of the sequence: slower, never wrong.
"""
from __future__ import annotations

from typing import Callable

REPLACEMENT = "\ufffd"     # what a UTF-8 decoder writes for an incomplete or invalid byte sequence
WINDOW = 8                 # tokens kept before ``read`` before the window slides (bounds one decode's length)


class IncrementalDetokenizer:
    """Feed token ids with ``add``; it returns the text that became final with them.

    ``pending`` is the text decoded after the final text, up to a trailing incomplete character (it is
    final too, but the tokens that produced it are not all done). ``flush()`` ends the sequence: it returns
    the rest of the text, an incomplete character as U+FFFD (as a full decode writes it). The concatenation
    of every ``add`` and ``flush`` equals ``decode(all ids)``.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.start = 0             # the window's first token
        self.read = 0              # tokens before this index have their text emitted
        self.window_text = ""      # decode(ids[start:read])
        self.pending = ""
        self.whole = False         # the tokenizer broke the window assumption: decode the whole list
        self.emitted = 0           # characters returned so far (whole-list mode slices at this offset)
        self.decoded_ids = 0       # ids passed to decode so far (what the per-token cost test counts)

    def _decode(self, ids: list[int]) -> str:
        self.decoded_ids += len(ids)
        return self.decode(ids)

    def add(self, tokens: list[int]) -> str:
        """The text that became final with ``tokens`` ("" while a character is incomplete)."""
        self.ids += tokens
        if self.whole:
            return self._add_whole()
        text = self._decode(self.ids[self.start:])
        if not text.startswith(self.window_text):
            self.whole = True
            return self._add_whole()
        new = text[len(self.window_text):]
        if new.endswith(REPLACEMENT):      # the next token may complete the character: hold it back
            self.pending = new.rstrip(REPLACEMENT)
            return ""
        self.read, self.window_text, self.pending = len(self.ids), text, ""
        if self.read - self.start > WINDOW:
            self.start = self.read - 1
            self.window_text = self._decode(self.ids[self.start:self.read])
        self.emitted += len(new)
        return new

    def _add_whole(self) -> str:
        text = self._decode(self.ids)
        if text.endswith(REPLACEMENT):
            self.pending = text[self.emitted:].rstrip(REPLACEMENT)
            return ""
        new, self.emitted, self.pending = text[self.emitted:], len(text), ""
        return new

    def flush(self) -> str:
        """The sequence ended: the text not yet returned (an incomplete last character as U+FFFD)."""
        if self.read == len(self.ids) and not self.whole:
            return ""
        text = self._decode(self.ids if self.whole else self.ids[self.start:])
        rest = text[self.emitted:] if self.whole else text[len(self.window_text):]
        self.read, self.pending = len(self.ids), ""
        self.emitted += len(rest)
        return rest

    def snapshot(self) -> tuple:
        """The state before the next ``add`` (``restore`` undoes the adds since)."""
        return (len(self.ids), self.start, self.read, self.window_text, self.pending, self.whole, self.emitted)

    def restore(self, state: tuple) -> None:
        n, self.start, self.read, self.window_text, self.pending, self.whole, self.emitted = state
        del self.ids[n:]


class StopScanner:
    """Finds where a stop string first appears in a growing generation, looking only at the new text plus
    the last len(longest stop) - 1 characters before it (an occurrence that ends in the new text starts no
    earlier), so each chunk costs its own length, not the generation's.

    ``scan(tokens)`` -> None, or (n, cut): the n-th token of this chunk is the first whose text completes a
    stop string, which starts at character ``cut`` of the generation's text (the text to keep is [:cut]).
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: tuple[str, ...]):
        self.detok = IncrementalDetokenizer(decode)
        self.stops = stops
        self.keep = max(len(s) for s in stops) - 1
        self.tail = ""             # the last ``keep`` characters of the final text
        self.offset = 0            # characters of final text before ``tail``

    def scan(self, tokens: list[int]) -> tuple[int, int] | None:
        state = (self.detok.snapshot(), self.tail, self.offset)
        hit = self._step(tokens)
        if hit is None or len(tokens) == 1:
            return None if hit is None else (1, hit)
        # a stop string completed in this chunk: replay it one token at a time to find the token that did it
        # (once per sequence: the run ends here)
        snap, self.tail, self.offset = state
        self.detok.restore(snap)
        for n, t in enumerate(tokens, 1):
            at = self._step([t])
            if at is not None:
                return n, at
        return len(tokens), hit        # not reached: the last step sees the same text as the whole chunk

    def _step(self, tokens: list[int]) -> int | None:
        new = self.detok.add(tokens)
        # the pending text (before a trailing incomplete character) is final: a stop string inside it counts
        # now, as in a full decode of the tokens so far
        hay = self.tail + new + self.detok.pending
        hits = [i for i in (hay.find(s) for s in self.stops) if i >= 0]
        if hits:
            return self.offset + min(hits)
        text = self.tail + new
        cut = max(len(text) - self.keep, 0)
        self.offset += cut
        self.tail = text[cut:]
        return None
