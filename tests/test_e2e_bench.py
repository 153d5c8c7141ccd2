"""benchmarks/e2e.py's steady-state window on the fake runtime: it closes when the first sequence ends, also
when the sequences stop early at EOS (the window's end mark used to stay None there: a TypeError)."""
from __future__ import annotations

from benchmarks import e2e
from fakes import FakeModel
from verispec.drafters import PromptLookup
from verispec.engine import SpeculativeDecoder

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7], [7, 8, 9, 10, 11, 7, 8]]


def test_steady_window_closes_when_every_sequence_stops_at_eos():
    model = FakeModel(seed=0, eos_bias=2.0)
    decoder = SpeculativeDecoder(model, PromptLookup(min_ngram=1), k=4)
    out = decoder.generate(PROMPTS, max_new_tokens=64)
    lengths = [len(g.tokens) for g in out]
    assert all(g.finish_reason == "eos" for g in out) and max(lengths) < 64 and min(lengths) > 1, lengths
    assert e2e._steady_throughput(decoder, PROMPTS, 64) > 0
