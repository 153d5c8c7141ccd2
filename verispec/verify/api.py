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

Validation has two parts. Shape/dtype/device/type checks read only metadata (and Python
arguments) and always run. Value checks (NaN / +inf logits, rows entirely -inf, logits / T
overflowing, tensor temperatures out of range, token ids out of range, ``sum(num_draft)`` vs
rows) need a device->host sync, so they are skipped while a CUDA graph is being captured and
when ``check_values=False``: then the caller vouches for the values (the engine does, for the
logits of its own passes).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from . import rng
from ..device import is_capturing, to_device
from .backend import BACKENDS, choose_backend, fallback_backend, filters_possible
from .reference import VerifyOutput, reference_verify_greedy, reference_verify_sample
from .sampling import MIN_TEMPERATURE, check_seed, check_temperature, check_top_k, check_top_p

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
    name ``name``. Tensor values are checked for dtype here and for range by the value checks.
    """
    if value is None:
        value = default
    if isinstance(value, (list, tuple)):
        if len(value) not in (1, batch):
            raise ValueError(f"{name} has {len(value)} entries for a batch of B={batch} sequences")
        value = [default if v is None else check(v, f"{name}[{i}]") for i, v in enumerate(value)]
        if dtype == torch.int32:   # top_k: values >= V mean "off"; clamp so int32 cannot wrap
            value = [min(v, 2**31 - 1) for v in value]
        return torch.tensor(value, dtype=dtype).expand(batch).contiguous().to(device)
    if isinstance(value, torch.Tensor):
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
        return to_device(value, device, dtype).expand(batch).contiguous()
    value = check(value, name)
    if dtype == torch.int32:
        value = min(value, 2**31 - 1)
    return torch.full((batch,), value, dtype=dtype, device=device)


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


MAX_SCALED_LOGIT = 2.0**30   # the largest |logit / T| a sampled row may have (see check_rows)


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


def canonical_batch(target_logits, draft_tokens, num_draft, max_num_draft, check_values) -> VerifyBatch:
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 2:
        shape = tuple(target_logits.shape) if isinstance(target_logits, torch.Tensor) else type(target_logits).__name__
        raise ValueError(f"target_logits must be a 2-D [sum(num_draft + 1), V] tensor, got {shape}")
    if target_logits.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"target_logits must be float16, bfloat16 or float32, got {target_logits.dtype}")
    device = target_logits.device
    if not isinstance(num_draft, torch.Tensor):
        num_draft = torch.tensor(list(num_draft), dtype=torch.int32)
    if num_draft.dim() != 1 or num_draft.shape[0] == 0:
        raise ValueError(f"num_draft must be a non-empty 1-D [B] tensor, got shape {tuple(num_draft.shape)}")
    if num_draft.dtype.is_floating_point or num_draft.dtype == torch.bool:
        raise ValueError(f"num_draft must be an integer tensor, got {num_draft.dtype}")
    if not isinstance(draft_tokens, torch.Tensor):
        draft_tokens = torch.tensor(list(draft_tokens), dtype=torch.int64)
    if draft_tokens.dim() != 1:
        raise ValueError(f"draft_tokens must be a 1-D [sum(num_draft)] tensor, got shape {tuple(draft_tokens.shape)}")
    if draft_tokens.dtype.is_floating_point or draft_tokens.dtype == torch.bool:
        raise ValueError(f"draft_tokens must be an integer tensor, got {draft_tokens.dtype}")
    if draft_tokens.device != device and draft_tokens.numel() > 0:
        raise ValueError(f"draft_tokens is on {draft_tokens.device} but target_logits is on {device}")
    batch = num_draft.shape[0]
    vocab = target_logits.shape[1]
    if vocab < 1:
        raise ValueError("target_logits has an empty vocabulary dimension")
    num_rows = target_logits.shape[0]
    if draft_tokens.shape[0] + batch != num_rows:
        raise ValueError(
            f"target_logits has {num_rows} rows but draft_tokens has {draft_tokens.shape[0]} tokens for "
            f"B={batch} sequences: expected sum(num_draft) + B rows (one bonus row per sequence)"
        )
    host_num_draft = None
    if check_values or max_num_draft is None:
        host_num_draft = num_draft.cpu()
        if bool((host_num_draft < 0).any()):
            raise ValueError(f"num_draft must be >= 0, got {host_num_draft.tolist()}")
        if int(host_num_draft.sum()) != draft_tokens.shape[0]:
            raise ValueError(
                f"num_draft sums to {int(host_num_draft.sum())} but draft_tokens has {draft_tokens.shape[0]} tokens"
            )
        if max_num_draft is None:
            max_num_draft = int(host_num_draft.max())
        elif max_num_draft < int(host_num_draft.max()):
            raise ValueError(f"max_num_draft={max_num_draft} is smaller than max(num_draft)={int(host_num_draft.max())}")
    if check_values:
        if draft_tokens.numel() and bool(((draft_tokens < 0) | (draft_tokens >= vocab)).any()):
            bad = draft_tokens[(draft_tokens < 0) | (draft_tokens >= vocab)][:5].tolist()
            raise ValueError(f"draft_tokens must be in [0, V={vocab}), got e.g. {bad}: is the draft on the target's tokenizer?")
    num_draft = to_device(num_draft, device, torch.int32)
    cu_num_draft = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    torch.cumsum(num_draft, 0, out=cu_num_draft[1:])
    if target_logits.stride(1) != 1:
        target_logits = target_logits.contiguous()
    return VerifyBatch(
        target_logits=target_logits,
        draft_tokens=to_device(draft_tokens, device, torch.int64),
        num_draft=num_draft,
        cu_num_draft=cu_num_draft,
        max_num_draft=int(max_num_draft),
    )


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
        check_values: run the value checks that need a host sync (NaN, id range, sums).

    Returns:
        VerifyOutput(tokens [B, max_k+1] int32 (-1 padded), num_accepted [B], num_emitted [B]).

    Example:
        >>> import torch
        >>> logits = torch.tensor([[0., 5, 0], [0, 0, 5], [5, 0, 0],   # seq 0: two drafts + bonus
        ...                        [0, 5, 0]])                         # seq 1: no drafts, bonus only
        >>> out = verify_greedy(logits, torch.tensor([1, 0]), [2, 0])
        >>> out.tokens.tolist(), out.num_accepted.tolist()
        ([[1, 2, -1], [1, -1, -1]], [1, 0])
    """
    check_values = check_values and not is_capturing()
    batch = canonical_batch(target_logits, draft_tokens, num_draft, max_num_draft, check_values)
    if check_values:
        check_rows(batch.target_logits)
    chosen = pick_backend(backend, batch.target_logits.device, batch)
    if chosen == "torch":
        return reference_verify_greedy(batch.target_logits, batch.draft_tokens, batch.num_draft, batch.max_num_draft)
    if chosen == "triton":
        from .triton.greedy import verify_greedy_triton

        return verify_greedy_triton(batch)
    from .cuda import verify_greedy_cuda

    return verify_greedy_cuda(batch)


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


def _check_sampling_values(batch: VerifyBatch) -> None:
    """The value checks of a sampling batch (they read the device: a host sync): temperatures, the logits
    rows at their temperature (``check_rows``), top-k / top-p, and q rows that are distributions giving
    their own draft a positive probability."""
    size = batch.batch_size
    temps = batch.temperature.cpu()
    if bool((temps < 0).any()) or not bool(torch.isfinite(temps).all()) or \
            bool(((temps > 0) & (temps < MIN_TEMPERATURE)).any()):
        raise ValueError(f"temperature must be 0 (greedy) or finite and >= {MIN_TEMPERATURE:g}, "
                         f"got {temps.tolist()}")
    seq_of_row = torch.repeat_interleave(torch.arange(size), batch.num_draft.cpu().long() + 1)
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
    capturing = is_capturing()
    check_values = check_values and not capturing
    batch = canonical_batch(target_logits, draft_tokens, num_draft, max_num_draft, check_values)
    device = batch.target_logits.device
    size = batch.batch_size
    batch.temperature = per_sequence(temperature, size, torch.float32, device, "temperature", 1.0, check_temperature)
    batch.top_k = per_sequence(top_k, size, torch.int32, device, "top_k", 0, check_top_k)
    batch.top_p = per_sequence(top_p, size, torch.float32, device, "top_p", 1.0, check_top_p)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if draft_probs is not None:
        batch.draft_probs = _checked_draft_probs(draft_probs, batch)
    if check_values:
        _check_sampling_values(batch)
    if seed is None:
        seed = rng.seed_from(generator)
    batch.seed = stream_keys(seed, size, device, "seed", rng.sequence_seeds)
    batch.offset = stream_keys(offset, size, device, "offset", _broadcast)
    chosen = pick_backend(backend, device, batch, greedy=False, filters=filters_possible(top_k, top_p))
    if chosen == "torch":
        return reference_verify_sample(
            batch.target_logits, batch.draft_tokens, batch.num_draft, batch.max_num_draft, batch.draft_probs,
            batch.temperature.cpu(), batch.top_k.cpu(), batch.top_p.cpu(), batch.seed.cpu(), batch.offset.cpu(),
        )
    if chosen == "triton":
        from .triton.rejection import verify_sample_triton

        return verify_sample_triton(batch)
    from .cuda import verify_sample_cuda

    return verify_sample_cuda(batch)
