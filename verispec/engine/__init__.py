"""verispec.engine: the speculative loop. See decoder.py."""
from .decoder import Generation, SpeculativeDecoder, Stats, generate

__all__ = ["generate", "SpeculativeDecoder", "Generation", "Stats"]
