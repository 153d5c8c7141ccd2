"""The verispec random stream: counter-based Philox-4x32-10, shared by every backend.

Sampling in verispec never consumes a stateful generator inside a kernel. Every random
number is a pure function of ``(seed, offset, row, col, purpose)``, so the torch reference,
the Triton kernels and the CUDA kernels can all draw *the same* numbers without passing
them through memory, and a CUDA graph replays reproducibly when ``seed``/``offset`` live in
device tensors.

    x       = philox4x32_10(key=(seed_lo, seed_hi), counter=(col, row, offset, purpose))[0]
    uniform = ((x >> 9) * 2 + 1) * 2**-24          # in (0, 1); exact in float32

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


def philox4x32(c0, c1, c2, c3, seed: int, n_rounds: int = 10):
    """Philox-4x32 on int64 tensors holding uint32 values; returns the 4 output words."""
    k0 = seed & _M32
    k1 = (seed >> 32) & _M32
    for _ in range(n_rounds):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _M32
        k1 = (k1 + _KEY_B) & _M32
    return c0, c1, c2, c3


def uniform(seed: int, offset: int, row: torch.Tensor | int, col: torch.Tensor | int, purpose: int) -> torch.Tensor:
    """Uniforms in (0, 1), float32, for broadcastable integer ``row``/``col`` tensors.

    >>> u = uniform(1234, 0, torch.arange(2)[:, None], torch.arange(3)[None, :], RACE)   # [2, 3]
    >>> u
    tensor([[0.8923, 0.0577, 0.3993],
            [0.3023, 0.3409, 0.6810]])
    >>> torch.equal(u[1, 2], uniform(1234, 0, 1, 2, RACE))   # one counter, one number, any shape
    True
    """
    row_t = torch.as_tensor(row, dtype=torch.int64)
    col_t = torch.as_tensor(col, dtype=torch.int64)
    row_t, col_t = torch.broadcast_tensors(row_t, col_t)
    c2 = torch.full_like(row_t, offset & _M32)
    c3 = torch.full_like(row_t, purpose & _M32)
    x, _, _, _ = philox4x32(col_t & _M32, row_t & _M32, c2, c3, seed)
    return (((x >> 9) * 2 + 1).to(torch.float32)) * UNIFORM_SCALE


def seed_from(generator: torch.Generator | None) -> int:
    """A 63-bit stream seed drawn from ``generator`` (or torch's default generator)."""
    return int(torch.randint(0, 2**63 - 1, (), generator=generator, dtype=torch.int64))
