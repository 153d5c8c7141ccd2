"""Public verification API: input validation, canonical layout, backend dispatch.

    verify_greedy(target_logits, draft_tokens, num_draft)              -> VerifyOutput
    verify_sample(target_logits, draft_tokens, num_draft, draft_probs) -> VerifyOutput

The layout and the semantics are documented in ``verispec.verify.reference`` (the oracle); every
backend returns exactly what the reference returns (sampling: for the same ``seed``/``offset``,
up to float rounding at near-ties, see docs/verification.md). Sampling draws each sequence's
random numbers from its own key and offset (``verispec.verify.rng``), so with per-sequence seeds
a sequence's tokens do not depend on what else is in the batch.

Backends: ``"torch"`` (the reference), ``"triton"`` and ``"cuda"`` (GPU kernels; triton also
runs on CPU tensors under ``TRITON_INTERPRET=1``). ``backend=None`` picks the one measured fastest
on this GPU for the batch's B, K, V, dtype and mode (``verispec.verify.backend``).

Validation has two parts, and neither reads the logits a second time:
- metadata (shapes, dtypes, devices, the type and range of Python arguments, and num_draft when it is
  given on the host) is checked on the host before the launch;
- values (NaN / +inf / all -inf rows, logits / T overflowing, draft ids out of range, tensor settings out of
  range, q rows, num_draft on the device vs rows) are checked by the kernels in their own read of the data,
  which writes ``VerifyOutput.status`` (``verispec.verify.status``).
With ``check_values=True`` (the default) the call then reads the status back -- its one device->host read --
and raises the error naming the first bad sequence. With ``check_values=False``, or while a CUDA graph is
being captured, nothing is read back: the caller reads ``out.status`` where it syncs anyway (the engine does,
at its one read per round).
"""

from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass

import torch

from . import rng
from ..device import to_device
from .backend import BACKENDS, choose_backend, fallback_backend, filters_possible
from .reference import VerifyOutput, reference_verify_greedy, reference_verify_sample
from .sampling import MIN_TEMPERATURE, check_seed, check_temperature, check_top_k, check_top_p
from .status import MAX_SCALED_LOGIT, raise_for_status

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class VerifyBatch:
    """Validated, canonical inputs handed to a backend (all tensors on the logits' device).

    target_logits: [R, V] float, R = sum(num_draft) + B, last dim contiguous
    draft_tokens:  [N] int64, N = sum(num_draft)
    num_draft:     [B] int32
    cu_num_draft:  [B + 1] int32, exclusive prefix sum of num_draft
    max_num_draft: host int, width of the output is max_num_draft + 1
    draft_probs:   [N, V] float or None (point-mass drafts)
    temperature:   [B] float32 (0 = greedy row)      top_k: [B] int32 (0 = off)
    top_p:         [B] float32 (1 = off)
    seed, offset:  [B] int64, each sequence's Philox key and counter offset (verify.rng)
    """

    target_logits: torch.Tensor
    draft_tokens: torch.Tensor
    num_draft: torch.Tensor
    cu_num_draft: torch.Tensor
    max_num_draft: int
    draft_probs: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    seed: torch.Tensor | None = None
    offset: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.num_draft.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.target_logits.shape[1]


def per_sequence(value, batch: int, dtype: torch.dtype, device, name: str, default, check) -> torch.Tensor:
    """A [B] tensor of ``dtype`` on ``device`` from a scalar, a list/tuple or a tensor of 1 or B values.

    Python values go through ``check`` (e.g. ``sampling.check_temperature``): type and range errors
    name ``name``. Tensor values are checked for dtype here and for range by the kernels (SETTINGS).
    Python values are cached by value and type (the checks and the host->device copy run once per distinct
    value, e.g. temperature=1.0), except while a CUDA graph is being captured: a captured graph must own
    its tensors.
    """
    if value is None:
        value = default
    if isinstance(value, torch.Tensor):
        return _tensor_setting(value, batch, dtype, device, name)
    if isinstance(value, list):
        value = tuple(value)
    types = tuple(map(type, value)) if isinstance(value, tuple) else type(value)
    build = _host_setting.__wrapped__ if _capturing(device) or not _hashable(value) else _host_setting
    return build(value, types, batch, dtype, device, name, default, check)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is capturing a graph (then nothing may be read back or cached)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@functools.lru_cache(maxsize=1024)
def _host_setting(value, types, batch: int, dtype: torch.dtype, device, name: str, default, check) -> torch.Tensor:
    """``per_sequence`` of a Python scalar or tuple (``types`` is part of the cache key only: True == 1)."""
    if isinstance(value, tuple):
        if len(value) not in (1, batch):
            raise ValueError(f"{name} has {len(value)} entries for a batch of B={batch} sequences")
        value = [default if v is None else check(v, f"{name}[{i}]") for i, v in enumerate(value)]
        if dtype == torch.int32:   # top_k: values >= V mean "off"; clamp so int32 cannot wrap
            value = [min(v, 2**31 - 1) for v in value]
        return to_device(torch.tensor(value, dtype=dtype).expand(batch).contiguous(), device)
    value = check(value, name)
    if dtype == torch.int32:
        value = min(value, 2**31 - 1)
    return torch.full((batch,), value, dtype=dtype, device=device)


def _tensor_setting(value: torch.Tensor, batch: int, dtype: torch.dtype, device, name: str) -> torch.Tensor:
    if value.dim() == 0:
        value = value.reshape(1)
    if value.dim() != 1 or value.shape[0] not in (1, batch):
        raise ValueError(f"{name} must be a scalar or a [B]={batch} tensor, got shape {tuple(value.shape)}")
    if value.dtype == torch.bool or value.is_complex():
        raise TypeError(f"{name} must be a real-valued tensor, got {value.dtype}")
    if dtype == torch.int32:
        if value.dtype.is_floating_point:
            raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
        if value.dtype == torch.int64:   # values >= V mean "off"; clamp so int32 cannot wrap
            value = value.clamp(max=2**31 - 1)
    value = to_device(value, device, dtype)
    return value if value.shape[0] == batch else value.expand(batch).contiguous()


def stream_keys(value, batch: int, device, name: str, expand_scalar) -> torch.Tensor:
    """``seed`` / ``offset`` as a [B] int64 tensor on ``device``, without a host sync.

    Accepted: a Python int or a 0-d integer tensor (one value for the batch, turned into B values
    by ``expand_scalar``), or a [B] integer tensor (one per sequence, used as is). A [1] tensor
    for B > 1 is refused: it would be unclear whether it is a batch value or a sequence's.
    """
    if not isinstance(value, torch.Tensor):
        value = check_seed(value, name)   # an int of 64 bits: floats and bools are refused, never truncated
        return to_device(expand_scalar(value, batch), device, torch.int64)
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
    if value.dim() == 0:
        return expand_scalar(to_device(value, device, torch.int64), batch)
    if value.shape != (batch,):
        raise ValueError(
            f"{name} must be an int, a 0-d tensor (one for the batch) or a [B]={batch} tensor (one per "
            f"sequence), got shape {tuple(value.shape)}"
        )
    return to_device(value, device, torch.int64).contiguous()


def _broadcast(value, batch: int):
    """A scalar offset: every sequence uses it."""
    if isinstance(value, torch.Tensor):
        return value.reshape(1).expand(batch).contiguous()
    return torch.full((batch,), rng.as_int64(value), dtype=torch.int64)


def check_rows(target_logits: torch.Tensor, scale: torch.Tensor | None = None) -> None:
    """Value checks of target_logits [R, V]: no NaN, no +inf, no row entirely -inf (nothing could be
    emitted: argmax would silently say token 0), and, with ``scale`` [R] (1/T of sampled rows, 1 for
    greedy rows), no row whose |max logit * scale| exceeds ``MAX_SCALED_LOGIT``.

    NOTE: the kernels form (z - m) / T in float32 as z * (log2(e) / T) - m * (log2(e) / T), which the GPU
    contracts into one FMA: for the row's maximum the two products round differently, leaving an error of
    about |m / T| * 2^-24 in the exponent instead of 0. Below 2^30 that error stays under ~90, so exp2 of
    it neither underflows nor overflows and the softmax stays exact to float rounding; at |m / T| = 2e30
    (measured on an H100) the maximum's own term underflowed to 0 and the sampled token was wrong."""
    if bool(torch.isnan(target_logits).any()):
        rows = torch.isnan(target_logits).any(dim=1).nonzero().flatten()[:5].tolist()
        raise ValueError(f"target_logits contains NaN (rows {rows})")
    if bool(torch.isposinf(target_logits).any()):
        rows = torch.isposinf(target_logits).any(dim=1).nonzero().flatten()[:5].tolist()
        raise ValueError(f"target_logits contains +inf (rows {rows})")
    row_max = target_logits.float().amax(dim=1) if target_logits.shape[0] else target_logits.new_zeros(0).float()
    dead = torch.isneginf(row_max)
    if bool(dead.any()):
        raise ValueError(f"target_logits rows {dead.nonzero().flatten()[:5].tolist()} are entirely -inf: "
                         f"no token can be emitted from such a row")
    if scale is not None:
        scaled = row_max.double() * scale.to(row_max.device).double()
        big = scaled.abs() > MAX_SCALED_LOGIT
        if bool(big.any()):
            r = int(big.nonzero()[0])
            raise ValueError(f"target_logits row {r}: max logit {float(row_max[r]):g} / temperature is beyond "
                             f"2**30 (|logit / T| must stay <= {MAX_SCALED_LOGIT:g} for the sampled softmax to be "
                             f"exact in float32): raise the temperature or rescale the logits")


@functools.lru_cache(maxsize=1024)
def _host_layout(num_draft: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_draft [B] int32, cu_num_draft [B + 1] int32) on ``device`` from host values, e.g. (2, 0, 3) ->
    [2, 0, 3], [0, 2, 2, 5]: both in ONE host->device copy, and cached by value (an engine's rounds repeat a
    few layouts), so a repeated layout costs no copy at all."""
    packed = to_device(torch.tensor(num_draft + (0, *itertools.accumulate(num_draft)), dtype=torch.int32), device)
    return packed[:len(num_draft)], packed[len(num_draft):]


def _check_host_num_draft(num_draft: tuple[int, ...], num_drafts_total: int, max_num_draft: int | None) -> int:
    """The checks of a host num_draft (free: no device read); returns max_num_draft (default max(num_draft))."""
    if min(num_draft) < 0:
        b = next(b for b, k in enumerate(num_draft) if k < 0)
        raise ValueError(f"sequence {b}: num_draft must be >= 0, got {num_draft[b]}")
    if sum(num_draft) != num_drafts_total:
        raise ValueError(f"num_draft sums to {sum(num_draft)} but draft_tokens has {num_drafts_total} tokens")
    longest = max(num_draft)
    if max_num_draft is None:
        return longest
    if max_num_draft < longest:
        raise ValueError(f"max_num_draft={max_num_draft} is smaller than max(num_draft)={longest}")
    return max_num_draft


def canonical_batch(target_logits, draft_tokens, num_draft, max_num_draft=None, check_values=False) -> VerifyBatch:
    """The metadata checks and the canonical layout of a call (no device read unless said below).

    num_draft given on the host (a list / tuple, or a CPU tensor for logits on an accelerator) is checked
    here for free (k_b >= 0, sum = len(draft_tokens), max_num_draft). A num_draft tensor on the logits'
    device is left to the kernels (NUM_DRAFT in the status), unless ``max_num_draft`` is None (the output
    width must be known: a device->host read) or ``check_values`` asks for the host checks (a read too).
    """
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 2:
        shape = tuple(target_logits.shape) if isinstance(target_logits, torch.Tensor) else type(target_logits).__name__
        raise ValueError(f"target_logits must be a 2-D [sum(num_draft + 1), V] tensor, got {shape}")
    if target_logits.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"target_logits must be float16, bfloat16 or float32, got {target_logits.dtype}")
    device = target_logits.device
    num_rows, vocab = target_logits.shape
    if vocab < 1:
        raise ValueError("target_logits has an empty vocabulary dimension")
    if not isinstance(draft_tokens, torch.Tensor):
        draft_tokens = torch.tensor(list(draft_tokens), dtype=torch.int64)
    if draft_tokens.dim() != 1:
        raise ValueError(f"draft_tokens must be a 1-D [sum(num_draft)] tensor, got shape {tuple(draft_tokens.shape)}")
    if draft_tokens.dtype.is_floating_point or draft_tokens.dtype == torch.bool:
        raise ValueError(f"draft_tokens must be an integer tensor, got {draft_tokens.dtype}")
    if draft_tokens.device != device:
        if draft_tokens.numel() > 0:
            raise ValueError(f"draft_tokens is on {draft_tokens.device} but target_logits is on {device}")
        draft_tokens = draft_tokens.to(device)
    if draft_tokens.dtype != torch.int64 or not draft_tokens.is_contiguous():
        draft_tokens = draft_tokens.long().contiguous()
    num_drafts_total = draft_tokens.shape[0]
    on_device = isinstance(num_draft, torch.Tensor) and num_draft.device == device
    if isinstance(num_draft, torch.Tensor):
        if num_draft.dim() != 1 or num_draft.shape[0] == 0:
            raise ValueError(f"num_draft must be a non-empty 1-D [B] tensor, got shape {tuple(num_draft.shape)}")
        if num_draft.dtype.is_floating_point or num_draft.dtype == torch.bool:
            raise ValueError(f"num_draft must be an integer tensor, got {num_draft.dtype}")
        if not on_device or max_num_draft is None or check_values:
            num_draft = num_draft.tolist()   # a device->host read when the tensor is on an accelerator
            on_device = False
    if not on_device:
        try:
            num_draft = tuple(map(operator.index, num_draft))   # ints only: a float count is refused, never truncated
        except TypeError:
            raise TypeError(f"num_draft must hold integers (one k_b per sequence), got {num_draft!r}") from None
        if not num_draft:
            raise ValueError("num_draft must be a non-empty 1-D [B] tensor, got shape (0,)")
    batch = len(num_draft)
    if num_drafts_total + batch != num_rows:
        raise ValueError(
            f"target_logits has {num_rows} rows but draft_tokens has {num_drafts_total} tokens for "
            f"B={batch} sequences: expected sum(num_draft) + B rows (one bonus row per sequence)"
        )
    if on_device:
        if num_draft.dtype != torch.int32 or not num_draft.is_contiguous():
            num_draft = num_draft.to(torch.int32).contiguous()
        cu_num_draft = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        torch.cumsum(num_draft, 0, out=cu_num_draft[1:])
        max_num_draft = operator.index(max_num_draft)
        if max_num_draft < 0:
            raise ValueError(f"max_num_draft must be >= 0, got {max_num_draft}")
    else:
        max_num_draft = _check_host_num_draft(num_draft, num_drafts_total,
                                              None if max_num_draft is None else operator.index(max_num_draft))
        capturing = target_logits.is_cuda and torch.cuda.is_current_stream_capturing()
        layout = _host_layout.__wrapped__ if capturing else _host_layout
        num_draft, cu_num_draft = layout(num_draft, device)
    if target_logits.stride(1) != 1:
        target_logits = target_logits.contiguous()
    return VerifyBatch(target_logits, draft_tokens, num_draft, cu_num_draft, max_num_draft)


def _host_value_checks(batch: VerifyBatch) -> None:
    """The value checks for a backend that writes no status word (``out.status is None``): the same guarantees
    on the host, at the price of reading the inputs back (a second pass and several syncs)."""
    counts = batch.num_draft.cpu()
    _check_host_num_draft(tuple(counts.tolist()), batch.draft_tokens.shape[0], batch.max_num_draft)
    vocab, drafts = batch.vocab_size, batch.draft_tokens
    if drafts.numel() and bool(((drafts < 0) | (drafts >= vocab)).any()):
        bad = drafts[(drafts < 0) | (drafts >= vocab)][:5].tolist()
        raise ValueError(f"draft_tokens must be in [0, V={vocab}), got e.g. {bad}: is the draft on the target's tokenizer?")
    if batch.temperature is None:
        check_rows(batch.target_logits)
        return
    temps = batch.temperature.cpu()
    if bool((temps < 0).any()) or not bool(torch.isfinite(temps).all()) or \
            bool(((temps > 0) & (temps < MIN_TEMPERATURE)).any()):
        raise ValueError(f"temperature must be 0 (greedy) or finite and >= {MIN_TEMPERATURE:g}, "
                         f"got {temps.tolist()}")
    seq_of_row = torch.repeat_interleave(torch.arange(batch.batch_size), counts.long() + 1)
    scale = torch.where(temps > 0, 1.0 / temps.double().clamp(min=MIN_TEMPERATURE), 1.0)[seq_of_row]
    check_rows(batch.target_logits, scale)
    if bool((batch.top_k.cpu() < 0).any()):
        raise ValueError(f"top_k must be >= 0 (0 = off), got {batch.top_k.tolist()}")
    top_ps = batch.top_p.cpu()
    if bool(((top_ps <= 0) | (top_ps > 1) | torch.isnan(top_ps)).any()):
        raise ValueError(f"top_p must be in (0, 1], got {top_ps.tolist()}")
    q = batch.draft_probs
    if q is not None and q.numel():
        if bool(torch.isnan(q).any()) or bool((q < 0).any()):
            raise ValueError("draft_probs must be non-negative and free of NaN")
        sums = q.float().sum(dim=-1)
        if bool(((sums - 1).abs() > 1e-2).any()):
            raise ValueError(f"each draft_probs row must sum to 1, got sums like {sums[:4].tolist()}")
        q_of_draft = q.gather(1, batch.draft_tokens[:, None]).squeeze(1)
        if bool((q_of_draft <= 0).any()):
            raise ValueError("draft_probs gives probability 0 to a drafted token: q must be the distribution "
                             "the draft was sampled from")


def _checked(out: VerifyOutput, batch: VerifyBatch, check_values: bool) -> VerifyOutput:
    """``out`` after the value checks the caller asked for: the status read back and raised on."""
    if not check_values or (batch.target_logits.is_cuda and torch.cuda.is_current_stream_capturing()):
        return out
    if out.status is None:
        _host_value_checks(batch)
    else:
        raise_for_status(out.status.tolist())   # NOTE: the call's one device->host read (it waits for the kernels)
    return out


def pick_backend(backend: str | None, device: torch.device, batch: VerifyBatch | None = None, *,
                 greedy: bool = True, filters: bool = False) -> str:
    """``backend`` checked, or for None the measured choice for ``batch`` (``backend.choose_backend``; without a
    batch, the device's fallback). ``filters``: top-k / top-p may be in play (sampling)."""
    if backend is None:
        if batch is None:
            return fallback_backend(device)
        return choose_backend(device, batch.batch_size, batch.max_num_draft, batch.vocab_size,
                              batch.target_logits.dtype, greedy, filters=filters)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if backend == "cuda" and device.type != "cuda":
        raise ValueError("backend='cuda' needs CUDA tensors; use backend='torch' (or 'triton' under TRITON_INTERPRET=1) on CPU")
    return backend


def verify_greedy(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    *,
    max_num_draft: int | None = None,
    backend: str | None = None,
    check_values: bool = True,
) -> VerifyOutput:
    """Greedy verification of ragged drafts.

    Args:
        target_logits: [sum(k_b + 1), V] float16/bfloat16/float32; per sequence, k_b rows scoring
            its drafts, then its bonus row.
        draft_tokens: [sum(k_b)] integer draft token ids.
        num_draft: [B] integer k_b >= 0 (tensor or list).
        max_num_draft: output width - 1; required only when num_draft lives on the GPU and no
            host sync is allowed (CUDA-graph capture). Default max(num_draft).
        backend: "torch" | "triton" | "cuda" | None (the measured fastest, ``verispec.verify.backend``).
        check_values: read the status back (one device->host read) and raise ValueError naming the first
            bad sequence (``verispec.verify.status``); False: the caller reads ``out.status`` itself.

    Returns:
        VerifyOutput(tokens [B, max_k+1] int32 (-1 padded), num_accepted [B], num_emitted [B], status [B]).

    Example:
        >>> import torch
        >>> logits = torch.tensor([[0., 5, 0], [0, 0, 5], [5, 0, 0],   # seq 0: two drafts + bonus
        ...                        [0, 5, 0]])                         # seq 1: no drafts, bonus only
        >>> out = verify_greedy(logits, torch.tensor([1, 0]), [2, 0])
        >>> out.tokens.tolist(), out.num_accepted.tolist()
        ([[1, 2, -1], [1, -1, -1]], [1, 0])
    """
    batch = canonical_batch(target_logits, draft_tokens, num_draft, max_num_draft)
    chosen = pick_backend(backend, batch.target_logits.device, batch)
    if chosen == "torch":
        out = reference_verify_greedy(batch.target_logits, batch.draft_tokens, batch.num_draft, batch.max_num_draft)
    elif chosen == "triton":
        from .triton.greedy import verify_greedy_triton

        out = verify_greedy_triton(batch)
    else:
        from .cuda import verify_greedy_cuda

        out = verify_greedy_cuda(batch)
    return _checked(out, batch, check_values)


def _checked_draft_probs(draft_probs, batch: VerifyBatch) -> torch.Tensor:
    """draft_probs after the metadata checks: [sum(num_draft), V] float on the logits' device, last dim
    contiguous."""
    vocab, device = batch.vocab_size, batch.target_logits.device
    if not isinstance(draft_probs, torch.Tensor) or draft_probs.dim() != 2:
        raise ValueError("draft_probs must be a 2-D [sum(num_draft), V] tensor or None")
    if draft_probs.shape != (batch.draft_tokens.shape[0], vocab):
        raise ValueError(
            f"draft_probs has shape {tuple(draft_probs.shape)}, expected [sum(num_draft), V] = "
            f"[{batch.draft_tokens.shape[0]}, {vocab}] (draft vocab must equal the target vocab)"
        )
    if draft_probs.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"draft_probs must be a float tensor, got {draft_probs.dtype}")
    if draft_probs.device != device:
        raise ValueError(f"draft_probs is on {draft_probs.device} but target_logits is on {device}")
    return draft_probs if draft_probs.stride(1) == 1 else draft_probs.contiguous()


def verify_sample(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor = 0,
    max_num_draft: int | None = None,
    backend: str | None = None,
    check_values: bool = True,
) -> VerifyOutput:
    """Rejection-sampling verification (Leviathan et al.) of ragged drafts; exact in distribution.

    The emitted tokens are distributed exactly as the target distribution p (after temperature,
    top-k, top-p; see ``verispec.verify.sampling``) whatever the drafts were, provided ``draft_probs``
    are the distributions the drafts were actually drawn from.

    Args:
        target_logits, draft_tokens, num_draft, max_num_draft, backend, check_values: as in
            ``verify_greedy``.
        draft_probs: [sum(k_b), V] float, the draft distribution q of each draft position, or None
            for point-mass drafts (prompt lookup / n-gram): accept x with probability p(x).
        temperature: float, list of B floats or [B] tensor; 0 makes that sequence greedy, else
            finite and >= ``sampling.MIN_TEMPERATURE`` (1e-6).
        top_k: None/int, list or [B] integer tensor; 0 or None = no top-k (>= V: no top-k either).
        top_p: None/float, list or [B] tensor in (0, 1]; None or 1 = no top-p.
        generator: a torch.Generator the batch seed is drawn from (when ``seed`` is None).
        seed: the Philox keys (``verispec.verify.rng``). A [B] integer tensor gives sequence b the
            key seed[b]: its tokens then depend only on its own seed, offset, logits and drafts,
            never on the other sequences or its position in the batch (what a continuous-batching
            server needs). An int or 0-d tensor S is one seed for the batch, expanded to the keys
            ``rng.sequence_seeds(S, B)`` (SplitMix64): sequences of one call stay independent, but
            sequence b's key depends on b. Device tensors keep the call CUDA-graph capturable.
        offset: int, 0-d or [B] integer tensor (a scalar is shared by every sequence); advance a
            sequence's offset between calls that share its seed. Taken modulo 2**32.

    Returns:
        VerifyOutput as in ``verify_greedy``.

    Example (sequence 0 samples at T = 1, sequence 1 is greedy; the seed fixes the stream):
        >>> import torch
        >>> logits = torch.tensor([[1., 1, 0], [0, 0, 0], [2, 0, 0],   # seq 0: two draft rows + bonus
        ...                        [0, 1, 2]])                         # seq 1: bonus row only
        >>> sample = lambda seed: verify_sample(logits, torch.tensor([1, 0]), [2, 0],
        ...                                     temperature=torch.tensor([1.0, 0.0]), seed=seed)
        >>> sample(16).tokens.tolist(), sample(16).num_accepted.tolist()
        ([[1, 2, -1], [2, -1, -1]], [1, 0])
        >>> sample(10).tokens.tolist()                                 # another stream: draft 1 rejected
        [[2, -1, -1], [2, -1, -1]]
    """
    batch = canonical_batch(target_logits, draft_tokens, num_draft, max_num_draft)
    device = batch.target_logits.device
    size = batch.batch_size
    batch.temperature = per_sequence(temperature, size, torch.float32, device, "temperature", 1.0, check_temperature)
    batch.top_k = per_sequence(top_k, size, torch.int32, device, "top_k", 0, check_top_k)
    batch.top_p = per_sequence(top_p, size, torch.float32, device, "top_p", 1.0, check_top_p)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if draft_probs is not None:
        batch.draft_probs = _checked_draft_probs(draft_probs, batch)
    if seed is None:
        seed = rng.seed_from(generator)
    batch.seed, batch.offset = _seed_and_offset(seed, offset, size, device)
    chosen = pick_backend(backend, device, batch, greedy=False, filters=filters_possible(top_k, top_p))
    if chosen == "torch":
        out = reference_verify_sample(
            batch.target_logits, batch.draft_tokens, batch.num_draft, batch.max_num_draft, batch.draft_probs,
            batch.temperature.cpu(), batch.top_k.cpu(), batch.top_p.cpu(), batch.seed.cpu(), batch.offset.cpu(),
        )
    elif chosen == "triton":
        from .triton.rejection import verify_sample_triton

        out = verify_sample_triton(batch, waves=False if check_values else None)   # waves skip rows: see status.py
    else:
        from .cuda import verify_sample_cuda

        out = verify_sample_cuda(batch)
    return _checked(out, batch, check_values)


def _seed_and_offset(seed, offset, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``stream_keys`` of seed and offset; two Python ints go to the device in ONE host->device copy."""
    if isinstance(seed, torch.Tensor) or isinstance(offset, torch.Tensor):
        return (stream_keys(seed, batch, device, "seed", rng.sequence_seeds),
                stream_keys(offset, batch, device, "offset", _broadcast))
    seed, offset = check_seed(seed, "seed"), check_seed(offset, "offset")
    keys = rng.sequence_seeds(seed if batch <= 8 else torch.tensor(seed), batch)   # a host loop only for small B
    packed = to_device(torch.cat([keys, torch.full((batch,), offset, dtype=torch.int64)]), device)
    return packed[:batch], packed[batch:]
