"""verispec.engine: the speculative loop.

    round.py       one round as a unit: draft -> target pass -> verification -> commit (``run_round``)
    scheduler.py   continuous batching: requests join between rounds and leave when they end
    decoder.py     the static-batch driver over the scheduler: ``generate`` / ``SpeculativeDecoder``
    request.py     a request and its sequence's host state (emission, stop strings)
    detokenize.py  incremental detokenization (linear in the output) and the stop-string scan
    stats.py       ``Stats`` and ``Generation``
"""
from .decoder import GenerationError, SpeculativeDecoder, generate
from .request import Request, Sequence
from .scheduler import QueueFull, Scheduler, SchedulerConfig
from .stats import Generation, Stats

__all__ = ["generate", "SpeculativeDecoder", "GenerationError", "Generation", "Stats", "Request", "Sequence", "Scheduler",
           "SchedulerConfig", "QueueFull"]
