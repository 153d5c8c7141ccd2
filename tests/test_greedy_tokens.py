"""``drafters.base.greedy_tokens``: the drafters' greedy choice, ``argmax`` in two passes over long rows on CUDA; the
same index as ``torch.argmax`` (the first maximum, NaN as the maximum) on ties, -inf rows, NaN, any piece count."""
from __future__ import annotations

import pytest
import torch

from verispec.drafters.base import _split, _two_pass_argmax, greedy_tokens


def _hard_rows(V: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, V, generator=g)
    x[1] = 0.0                                        # all tied: index 0
    x[2, [5, V - 1]] = float("nan")                   # NaN wins, the first one
    x[3] = float("-inf")
    x[4, [7, V // 2, V - 1]] = 100.0                  # a tie across pieces: the first
    x[5, V - 1] = 100.0                               # the last index
    x[6, (V // _split(V)) - 1: (V // _split(V)) + 1] = 50.0   # a tie straddling two pieces
    return x


@pytest.mark.parametrize("V", [128256, 49152, 32000, 50257, 8192])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_two_passes_give_argmax(V, dtype):
    x = _hard_rows(V, V).to(dtype)
    assert torch.equal(_two_pass_argmax(x, _split(V)), x.argmax(dim=-1))
    assert torch.equal(_two_pass_argmax(x[:, None], _split(V)), x[:, None].argmax(dim=-1))   # [B, 1, V]


def test_the_pieces_divide_the_row():
    for V in (128256, 49152, 32000, 50257, 8192, 4099, 16):
        parts = _split(V)
        assert parts == 1 or (V % parts == 0 and 16 <= parts <= 512 and V // parts >= 128), V
    assert _split(4099) == 1                          # a prime: one pass


def test_on_the_cpu_it_is_torchs_argmax():
    x = _hard_rows(32000, 1)
    assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the two passes run on CUDA only")
@pytest.mark.parametrize("V", [128256, 49152, 4099])
def test_on_cuda_it_equals_argmax(V):
    x = _hard_rows(V, 3).cuda().bfloat16()
    assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))
