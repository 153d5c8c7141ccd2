"""The ``backend="cuda"`` verification kernels: the Python launchers over one JIT-built extension.

Sources, side by side (llm.c style; each file's header says what each version changes):
    common.cuh         16-byte row loads, warp-shuffle argmax / softmax statistics, Philox, the status word
    verify_greedy.cu   row argmax: chunked v2 / v3 (+ block-size and loads-in-flight variants) and balanced
                       (one wave, equal bytes a block) + the acceptance scan: v1 naive (a thread a sequence),
                       v2 warp ballot, v3 segmented ballot (several sequences a warp)
    verify_sample.cu   rejection sampling: softmax statistics, then the accept tests and the race, one block
                       per sequence (v1) or split over vocabulary chunks (v2), then a warp per sequence
    sample_args.h      the arguments of one sampling launch (shared by the .cu and the binding)
    binding.cpp        torch glue, built only on a CUDA machine

The extension ``verispec_verify`` is built on first use by ``verispec.jit`` (the build directory and the
CPU-CI compile check are described there).

Every launcher returns ``VerifyOutput`` with ``status`` [B] int32 filled (``verispec.verify.status``),
computed in the kernels' own reads of the data: no second pass over the logits, no host sync.

Entry points (all CUDA-graph safe except where a host check is noted):
    verify_greedy_cuda(batch, variant, argmax)          variant "naive" | "ballot" | "segment";
                                                        argmax one of ARGMAX_VARIANTS
    verify_sample_cuda(batch, race_blocks_per_sm, check_draft_probs)   0: one block a sequence races V;
                                                        N: the race split, ~N blocks an SM; top-k / top-p:
                                                        NotImplementedError
    target_argmax_cuda / target_argmax_partial_cuda / greedy_scan_cuda   (benchmarks, tests)

The defaults are the fastest versions measured (benchmarks/results/cuda_verify_sweep.md, ablation.md).
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
# argmax versions of verify_greedy.cu (its VS_ARGMAX_VERSIONS): name -> code. "v*": a block per (row, vocab
# chunk); "bal-*": one wave of blocks, each an equal slice of all R x V elements. tN: threads a block,
# uN: 16-byte loads in flight a thread.
ARGMAX_VARIANTS = {"v2": 2, "v3": 3, "v3-t512": 4, "v3-u16": 5,
                   "bal-t256-u8": 10, "bal-t512-u8": 11, "bal-t256-u16": 12, "bal-t1024-u4": 13}
DEFAULT_ARGMAX = None   # None: ``default_argmax``'s rule by row count
# From this many logits rows on, greedy verification takes 512-thread argmax blocks: on an H100
# (benchmarks/results/cuda_verify_sweep.md, 2026-11-23) B=128 K=8 (1152 rows) fell from 220.8 us (v3) to
# 198.2 us (1.01x the floor) in fp32 and from 138.3 to 109.8 us in bf16, while at 288 rows and fewer v3 was
# as fast or faster.
WIDE_ARGMAX_MIN_ROWS = 1024


def default_argmax(num_rows: int) -> str:
    """The argmax version for ``num_rows`` logits rows (see WIDE_ARGMAX_MIN_ROWS)."""
    return "v3-t512" if num_rows >= WIDE_ARGMAX_MIN_ROWS else "v3"
# The sampling race (verify_sample.cu pass 2) spreads each sequence's emitted row over about this many blocks
# an SM in all (0: one block per sequence races all of V, the v1 kernel).
RACE_BLOCKS_PER_SM = 8


def load(verbose: bool = False):
    """Build (first call; cached on disk afterwards) and return the ``verispec_verify`` extension."""
    return load_extension("verispec_verify", [_SRC / s for s in _SOURCES], [_SRC], what="backend='cuda'",
                          verbose=verbose)


def _output(tokens: torch.Tensor, num_accepted: torch.Tensor, num_emitted: torch.Tensor,
            status: torch.Tensor) -> VerifyOutput:
    return VerifyOutput(tokens, num_accepted, num_emitted, status)


def _choice(value: str, options: dict, name: str) -> int:
    if value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got {value!r}")
    return options[value]


# ---- verification ------------------------------------------------------------------------
def verify_greedy_cuda(batch, variant: str = DEFAULT_GREEDY, argmax: str | None = DEFAULT_ARGMAX) -> VerifyOutput:
    """Greedy verification of a ``verify.VerifyBatch``: row argmax + acceptance scan, with the status word.

    variant: "naive" (thread per sequence), "ballot" (a warp per sequence, one ballot finds the first
    rejection) or "segment" (32 / next_pow2(max_k) sequences per warp). argmax: one of ARGMAX_VARIANTS
    (see verify_greedy.cu); None: ``default_argmax`` for the batch's rows.
    """
    scan = _choice(variant, GREEDY_VARIANTS, "variant")
    version = _choice(argmax or default_argmax(batch.target_logits.shape[0]), ARGMAX_VARIANTS, "argmax")
    return _output(*load().verify_greedy(
        batch.target_logits, batch.draft_tokens, batch.num_draft, batch.cu_num_draft,
        batch.max_num_draft + 1, scan, version,
    ))


def target_argmax_cuda(target_logits: torch.Tensor, argmax: str = "v3") -> torch.Tensor:
    """[R, V] float -> [R] int32 argmax (lowest index on ties), one block per row (no chunking); a chunked
    version only."""
    _, idx, _ = load().argmax_partial(target_logits, 1, _choice(argmax, ARGMAX_VARIANTS, "argmax"))
    return idx


def target_argmax_partial_cuda(target_logits: torch.Tensor, argmax: str = "v3"):
    """(part_val, part_idx, part_flag) [R * chunks] of a chunked version with the automatic vocabulary split
    (benchmarks, tests)."""
    return load().argmax_partial(target_logits, 0, _choice(argmax, ARGMAX_VARIANTS, "argmax"))


def greedy_scan_cuda(target_argmax: torch.Tensor, batch, variant: str = DEFAULT_GREEDY) -> VerifyOutput:
    """The acceptance scan alone, over a precomputed [R] int32 target argmax (benchmarks). Its status has the
    draft and layout bits only (the logits are not read)."""
    return _output(*load().greedy_scan(
        _choice(variant, GREEDY_VARIANTS, "variant"), target_argmax, batch.vocab_size, batch.draft_tokens,
        batch.num_draft, batch.cu_num_draft, batch.max_num_draft + 1,
    ))


def verify_sample_cuda(batch, race_blocks_per_sm: int = RACE_BLOCKS_PER_SM,
                       check_draft_probs: bool = True) -> VerifyOutput:
    """Rejection-sampling verification of a ``verify.VerifyBatch`` (temperature per sequence), with the status.

    ``batch.seed`` / ``batch.offset``: [B] int64 device tensors, each sequence's Philox key and
    offset; the kernel draws at rows local to each sequence (``verispec.verify.rng``).
    race_blocks_per_sm: 0 = one block per sequence races the whole vocabulary (v1); N > 0 = the race is
    split over vocabulary chunks, about N blocks an SM in all (v2; v1 again from B >= N * SMs on). Every
    setting gives the same tokens, bit for bit.
    check_draft_probs: pass 1 also reads every draft_probs row to check it is a distribution (NaN, negative,
    sum); without it only q(x) of each draft is checked (the read the accept test makes anyway).

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
    if not isinstance(race_blocks_per_sm, int) or race_blocks_per_sm < 0:
        raise ValueError(f"race_blocks_per_sm must be an int >= 0, got {race_blocks_per_sm!r}")
    return _output(*load().verify_sample(
        batch.target_logits, batch.draft_tokens, batch.draft_probs, batch.num_draft, batch.cu_num_draft,
        batch.max_num_draft + 1, batch.temperature, batch.top_k, batch.top_p, batch.seed, batch.offset,
        race_blocks_per_sm, check_draft_probs,
    ))
