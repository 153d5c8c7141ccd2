"""verispec.verify: verification of drafts (the maths, the reference, the kernels). Imports nothing of
verispec but the bottom layer (``verispec.device``, ``verispec.jit``).

    api.py         verify_greedy / verify_sample: validation, canonical layout, backend dispatch
    backend.py     the default backend: the measured fastest, from backend_table.json
    reference.py   the PyTorch reference semantics: the oracle every backend is tested against
    tree_api.py    verify_tree_greedy / verify_tree_sample: draft trees (validation of the tree, dispatch)
    tree_reference.py  the reference semantics of tree verification (the trees' oracle)
    status.py      the status word every backend writes: what was wrong with a sequence's inputs
    sampling.py    temperature / top-k / top-p as value thresholds (one definition for every backend)
    rng.py         the counter-based Philox stream every backend draws from
    workloads.py   synthetic verification batches with known answers (tests, benchmarks)
    triton/        the Triton kernels, each beside its launcher
    cuda/          the CUDA C++ kernels (versions side by side) and their launchers
"""
from .api import VerifyBatch, verify_greedy, verify_sample
from .reference import VerifyOutput
from .tree_api import verify_tree_greedy, verify_tree_sample
from .tree_reference import TreeVerifyOutput

__all__ = ["verify_greedy", "verify_sample", "VerifyOutput", "VerifyBatch", "verify_tree_greedy", "verify_tree_sample",
           "TreeVerifyOutput"]
