"""The ``backend="cuda"`` verification kernels: the Python launchers over one JIT-built extension.

Sources, side by side (llm.c style; each file's header says what each version changes):
    common.cuh         16-byte row loads, warp-shuffle argmax / softmax statistics, Philox
    verify_greedy.cu   row argmax v2 (one warp-shuffle reduction a block) / v3 (streaming loads)
                       + the acceptance scan: v1 naive (a thread a sequence), v2 warp ballot,
                       v3 segmented ballot (several sequences a warp)
    verify_sample.cu   rejection sampling: softmax statistics + ballot accept tests + race
    binding.cpp        torch glue, built only on a CUDA machine

The extension ``verispec_verify`` is built on first use by ``verispec.jit`` (the build directory and the
CPU-CI compile check are described there).

Entry points (all CUDA-graph safe except where a host check is noted):
    verify_greedy_cuda(batch, variant=DEFAULT_GREEDY)   "naive" | "ballot" | "segment"
    verify_sample_cuda(batch)                           top-k / top-p: NotImplementedError
    target_argmax_cuda(logits, version) / greedy_scan_cuda(target_argmax, batch, variant)  (benchmarks)

The defaults are the fastest versions measured in benchmarks/results/ablation.md.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...device import is_capturing
from ...jit import load_extension
from ..reference import VerifyOutput

_SRC = Path(__file__).resolve().parent
_SOURCES = ("binding.cpp", "verify_greedy.cu", "verify_sample.cu")
GREEDY_VARIANTS = {"naive": 0, "ballot": 1, "segment": 2}
DEFAULT_GREEDY = "ballot"
DEFAULT_ARGMAX = 3


def load(verbose: bool = False):
    """Build (first call; cached on disk afterwards) and return the ``verispec_verify`` extension."""
    return load_extension("verispec_verify", [_SRC / s for s in _SOURCES], [_SRC], what="backend='cuda'",
                          verbose=verbose)


def _output(tokens: torch.Tensor, num_accepted: torch.Tensor, num_emitted: torch.Tensor) -> VerifyOutput:
    return VerifyOutput(tokens, num_accepted, num_emitted)


# ---- verification ------------------------------------------------------------------------
def verify_greedy_cuda(batch, variant: str = DEFAULT_GREEDY, argmax_version: int = DEFAULT_ARGMAX) -> VerifyOutput:
    """Greedy verification of a ``verify.VerifyBatch``: row argmax + acceptance scan.

    variant: "naive" (thread per sequence), "ballot" (a warp per sequence, one ballot finds the first rejection) or "segment"
    (32 / next_pow2(max_k) sequences per warp). argmax_version: 2 or 3 (see verify_greedy.cu).
    """
    if variant not in GREEDY_VARIANTS:
        raise ValueError(f"variant must be one of {tuple(GREEDY_VARIANTS)}, got {variant!r}")
    if argmax_version not in (2, 3):
        raise ValueError(f"argmax_version must be 2 or 3, got {argmax_version!r}")
    ext = load()
    tokens, num_accepted, num_emitted = ext.verify_greedy(
        batch.target_logits, batch.draft_tokens, batch.num_draft, batch.cu_num_draft,
        batch.max_num_draft + 1, GREEDY_VARIANTS[variant], argmax_version,
    )
    return _output(tokens, num_accepted, num_emitted)


def target_argmax_cuda(target_logits: torch.Tensor, version: int = DEFAULT_ARGMAX) -> torch.Tensor:
    """[R, V] float -> [R] int32 argmax (lowest index on ties), one block per row (no chunking)."""
    _, idx = load().argmax_partial(target_logits, 1, version)
    return idx


def target_argmax_partial_cuda(target_logits: torch.Tensor, version: int = DEFAULT_ARGMAX):
    """(part_val, part_idx) [R * chunks] with the automatic vocabulary split (benchmarks, tests)."""
    return load().argmax_partial(target_logits, 0, version)


def greedy_scan_cuda(target_argmax: torch.Tensor, batch, variant: str = DEFAULT_GREEDY) -> VerifyOutput:
    """The acceptance scan alone, over a precomputed [R] int32 target argmax (benchmarks)."""
    tokens, num_accepted, num_emitted = load().greedy_scan(
        GREEDY_VARIANTS[variant], None, target_argmax, 1, batch.draft_tokens, batch.num_draft,
        batch.cu_num_draft, batch.max_num_draft + 1,
    )
    return _output(tokens, num_accepted, num_emitted)


def verify_sample_cuda(batch) -> VerifyOutput:
    """Rejection-sampling verification of a ``verify.VerifyBatch`` (temperature per sequence).

    ``batch.seed`` / ``batch.offset``: [B] int64 device tensors, each sequence's Philox key and
    offset; the kernel draws at rows local to each sequence (``verispec.verify.rng``).

    top-k / top-p are not implemented here: a batch that uses them raises NotImplementedError
    (checked on the host, which syncs; under CUDA-graph capture the check is impossible and such
    sequences come back with num_accepted = -1 instead).
    """
    vocab = batch.vocab_size
    if not is_capturing():
        # NOTE: host sync (two tiny reductions) to refuse filters we do not implement.
        uses_top_k = bool(((batch.top_k > 0) & (batch.top_k < vocab) & (batch.temperature > 0)).any())
        uses_top_p = bool(((batch.top_p < 1) & (batch.temperature > 0)).any())
        if uses_top_k or uses_top_p:
            raise NotImplementedError(
                "backend='cuda' verify_sample does not implement top-k / top-p yet; "
                "use backend='triton' or 'torch' for batches with top_k or top_p set"
            )
    ext = load()
    tokens, num_accepted, num_emitted = ext.verify_sample(
        batch.target_logits, batch.draft_tokens, batch.draft_probs, batch.num_draft, batch.cu_num_draft,
        batch.max_num_draft + 1, batch.temperature, batch.top_k, batch.top_p, batch.seed, batch.offset,
    )
    return _output(tokens, num_accepted, num_emitted)
