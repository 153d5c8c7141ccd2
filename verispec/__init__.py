"""verispec: exact speculative decoding with fast batched verification.

    from verispec import verify_greedy, verify_sample
"""

from .reference import VerifyOutput
from .verify import verify_greedy, verify_sample

__all__ = ["VerifyOutput", "verify_greedy", "verify_sample"]
