"""verispec.verify: verification of drafts (the maths, the reference, the kernels). Imports nothing of
verispec but the bottom layer (``verispec.device``, ``verispec.jit``).

    api.py         verify_greedy / verify_sample: validation, canonical layout, backend dispatch
    backend.py     the default backend: the measured fastest, from backend_table.json
    reference.py   the PyTorch reference semantics: the oracle every backend is tested against
    status.py      the status word every backend writes: what was wrong with a sequence's inputs
    sampling.py    temperature / top-k / top-p as value thresholds (one definition for every backend)
    rng.py         the counter-based Philox stream every backend draws from
    workloads.py   synthetic verification batches with known answers (tests, benchmarks)
    triton/        the Triton kernels, each beside its launcher
    cuda/          the CUDA C++ kernels (versions side by side) and their launchers
"""
from .api import VerifyBatch, verify_greedy, verify_sample
from .reference import VerifyOutput

__all__ = ["verify_greedy", "verify_sample", "VerifyOutput", "VerifyBatch"]
