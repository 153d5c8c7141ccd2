"""The verispec random stream: counter-based Philox-4x32-10, shared by every backend.

Sampling in verispec never consumes a stateful generator inside a kernel. Every random
number is a pure function of one sequence's ``(seed, offset)`` and ``(row, col, purpose)``,
so the torch reference, the Triton kernels and the CUDA kernels can all draw *the same*
numbers without passing them through memory, and a CUDA graph replays reproducibly when the
seeds / offsets live in device tensors.

For sequence b of a batch, with its key ``seed_b`` and its offset ``offset_b``:

    x       = philox4x32_10(key=(seed_b mod 2**32, seed_b >> 32),
                            counter=(col, row, offset_b mod 2**32, purpose))[0]
    uniform = ((x >> 9) * 2 + 1) * 2**-24          # in (0, 1); exact in float32

``row`` is the *local* row i in [0, k_b] of that sequence (draft position i; the bonus row is
i = k_b), never the row's index in the batch's ragged target_logits. So a sequence's random
numbers, hence its tokens, depend only on its own (seed, offset, logits, drafts): not on the
other sequences of the batch, nor on where it sits in it.

Keys: ``verify_sample`` takes ``seed`` as a [B] integer tensor (one key per sequence, used as
is: the way to get batch-position independence, e.g. a server that gives each request its own
seed) or as one scalar S for the whole batch, which is expanded to
``seed_b = sequence_seeds(S, B)[b]``, the (b + 1)-th output of SplitMix64 seeded with S. That
keeps the sequences of one call independent of each other, but sequence b's key then depends on
b. ``offset`` is a [B] tensor or a scalar that every sequence shares.

The uniform map keeps 23 random bits and sets the lowest bit, so 0 and 1 are never produced
(``-log(u)`` is always finite and positive) and the float32 value is exact on every backend.

Purposes:
    ACCEPT (0): one uniform per draft row (col = 0) for the accept test ``u * q(x) < p(x)``.
    RACE   (1): one uniform per (row, vocab id) for the exponential race that samples the
                recovered / bonus token: ``argmax_v w_v / E_v`` with ``E_v = -log(u_v)``.

This is the same Philox that ``triton.language.philox`` computes (same constants, same key
schedule, uint32 counters); ``tests/test_rng.py`` checks the two agree bit for bit.
"""

from __future__ import annotations

import torch

ACCEPT = 0
RACE = 1

_M32 = 0xFFFFFFFF
_ROUND_A = 0xD2511F53
_ROUND_B = 0xCD9E8D57
_KEY_A = 0x9E3779B9
_KEY_B = 0xBB67AE85
UNIFORM_SCALE = 2.0**-24


def _mul_hi_lo(const: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(const * x) >> 32 and (const * x) & M32 for uint32 values held in int64.

    The unsigned 64-bit product does not fit int64, but int64 multiplication wraps modulo
    2**64, so the bit pattern is the unsigned product's: an arithmetic shift plus a mask
    recovers the high word. tests/test_rng.py checks this against Python integers.
    """
    product = x * const
    return (product >> 32) & _M32, product & _M32


def philox4x32(c0, c1, c2, c3, seed, n_rounds: int = 10):
    """Philox-4x32 on int64 tensors holding uint32 values; returns the 4 output words.

    ``seed``: the 64-bit key, an int or an int64 tensor broadcastable with the counters.
    Each round writes into four buffers of the counters' shape (the products as ``_mul_hi_lo``
    computes them): no tensor is allocated per round, which on a CPU is most of the cost.
    """
    words = (c0, c1, c2, c3, seed)
    device = next((v.device for v in words if isinstance(v, torch.Tensor)), None)
    c0, c1, c2, c3, seed = torch.broadcast_tensors(*(torch.as_tensor(v, dtype=torch.int64, device=device)
                                                     for v in words))
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    c0, c1, c2, c3 = (c.clone() for c in (c0, c1, c2, c3))
    prod_a, prod_b, spare = torch.empty_like(c0), torch.empty_like(c0), torch.empty_like(c0)
    for _ in range(n_rounds):
        torch.mul(c2, _ROUND_B, out=prod_b)
        torch.mul(c0, _ROUND_A, out=prod_a)
        # (c0, c1, c2, c3) <- (hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a)
        torch.bitwise_right_shift(prod_b, 32, out=spare)
        spare.bitwise_and_(_M32).bitwise_xor_(c1).bitwise_xor_(k0)
        c0, spare = spare, c0
        torch.bitwise_and(prod_b, _M32, out=c1)
        torch.bitwise_right_shift(prod_a, 32, out=spare)
        spare.bitwise_and_(_M32).bitwise_xor_(c3).bitwise_xor_(k1)
        c2, spare = spare, c2
        torch.bitwise_and(prod_a, _M32, out=c3)
        k0 = (k0 + _KEY_A) & _M32
        k1 = (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


# On a CPU, ``uniform`` draws this many numbers at a time: eight int64 buffers of it stay in the cache (a
# [64, 49152] race at once runs ~3x slower, memory-bound).
CPU_CHUNK = 1 << 17


def uniform(seed, offset, row, col, purpose: int) -> torch.Tensor:
    """Uniforms in (0, 1), float32.

    ``seed`` / ``offset`` (ints, or int64 tensors holding 64-bit patterns) and ``row`` / ``col``
    (integers or integer tensors) broadcast together; ``purpose`` is ACCEPT or RACE.

    >>> u = uniform(1234, 0, torch.arange(2)[:, None], torch.arange(3)[None, :], RACE)   # [2, 3]
    >>> u
    tensor([[0.8923, 0.0577, 0.3993],
            [0.3023, 0.3409, 0.6810]])
    >>> torch.equal(u[1, 2], uniform(1234, 0, 1, 2, RACE))   # one counter, one number, any shape
    True
    """
    words = (seed, offset, row, col)
    device = next((v.device for v in words if isinstance(v, torch.Tensor)), None)   # ints join the tensors' device
    seed_t, offset_t, row_t, col_t = torch.broadcast_tensors(*(torch.as_tensor(v, dtype=torch.int64, device=device)
                                                               for v in words))
    shape = seed_t.shape
    flat = [t.reshape(-1) for t in (seed_t, offset_t, row_t, col_t)]
    n = flat[0].numel()
    chunk = CPU_CHUNK if seed_t.device.type == "cpu" else max(n, 1)
    out = torch.empty(n, dtype=torch.float32, device=seed_t.device)
    for start in range(0, n, chunk):
        s, o, r, c = (t[start:start + chunk] for t in flat)
        x, _, _, _ = philox4x32(c & _M32, r & _M32, o & _M32, torch.full_like(r, purpose & _M32), s)
        out[start:start + chunk] = (((x >> 9) * 2 + 1).to(torch.float32)) * UNIFORM_SCALE
    return out.reshape(shape)


# SplitMix64 (Steele, Lea, Flood 2014): state advances by GAMMA, each output is the finalizer
# of the state. Constants as 64-bit patterns.
_M64 = 0xFFFFFFFFFFFFFFFF
_SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
_SPLITMIX_MUL_A = 0xBF58476D1CE4E5B9
_SPLITMIX_MUL_B = 0x94D049BB133111EB


def as_int64(value: int) -> int:
    """The signed int64 with the bit pattern of ``value mod 2**64``."""
    value &= _M64
    return value - (1 << 64) if value >> 63 else value


def _splitmix_host(state: int) -> int:
    z = state & _M64
    z = ((z ^ (z >> 30)) * _SPLITMIX_MUL_A) & _M64
    z = ((z ^ (z >> 27)) * _SPLITMIX_MUL_B) & _M64
    return z ^ (z >> 31)


def _shift_right_logical(z: torch.Tensor, bits: int) -> torch.Tensor:
    """``z >> bits`` on the unsigned 64-bit pattern held in an int64 tensor."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix_device(state: torch.Tensor) -> torch.Tensor:
    """The SplitMix64 finalizer on int64 tensors (products wrap modulo 2**64, as in _mul_hi_lo)."""
    z = state
    z = (z ^ _shift_right_logical(z, 30)) * as_int64(_SPLITMIX_MUL_A)
    z = (z ^ _shift_right_logical(z, 27)) * as_int64(_SPLITMIX_MUL_B)
    return z ^ _shift_right_logical(z, 31)


def sequence_seeds(seed: int | torch.Tensor, batch: int) -> torch.Tensor:
    """The [B] int64 per-sequence keys that one batch seed S stands for.

        seed_b = splitmix64_finalize(S + (b + 1) * GAMMA mod 2**64)     (b = 0 .. B-1)

    i.e. the first B outputs of SplitMix64 seeded with S. An int S (taken modulo 2**64) is
    expanded on the host (a CPU tensor); a 0-d integer tensor S on its own device, with no host
    sync (CUDA-graph capturable). Both give the same keys.
    """
    if isinstance(seed, torch.Tensor):
        steps = torch.arange(1, batch + 1, dtype=torch.int64, device=seed.device)
        return _splitmix_device(seed.to(torch.int64) + steps * as_int64(_SPLITMIX_GAMMA))
    keys = [as_int64(_splitmix_host(seed + (b + 1) * _SPLITMIX_GAMMA)) for b in range(batch)]
    return torch.tensor(keys, dtype=torch.int64)


def seed_from(generator: torch.Generator | None) -> int:
    """A 63-bit stream seed drawn from ``generator`` (or torch's default generator)."""
    return int(torch.randint(0, 2**63 - 1, (), generator=generator, dtype=torch.int64))
