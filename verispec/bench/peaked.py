"""``make_peaked``: a random-weight model with a well-separated greedy argmax, for oracle-draft benchmarks.
It lives beside the oracle drafters (``verispec/drafters/oracle.py``), which the server uses too."""
from ..drafters.oracle import make_peaked

__all__ = ["make_peaked"]
