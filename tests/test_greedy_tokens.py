"""``drafters.base.greedy_tokens``: the drafters' greedy choice, ``ops.argmax_rows`` (one Triton program a row) on
CUDA; the same index as ``torch.argmax`` (the first maximum, NaN as the maximum) on ties, -inf rows, NaN, ties in
different blocks of the kernel's walk, rows shorter and longer than a block; and its draft-vocabulary map."""
from __future__ import annotations

import pytest
import torch

from verispec.drafters.base import greedy_tokens
from verispec.runtime import ops


def _hard_rows(V: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, V, generator=g)
    x[1] = 0.0                                        # all tied: index 0
    x[2, [5, V - 1]] = float("nan")                   # NaN wins, the first one
    x[3] = float("-inf")                              # index 0
    x[4, [7, V // 2, V - 1]] = 100.0                  # a tie across blocks: the first
    x[5, V - 1] = 100.0                               # the last index
    x[6, [V - 2, 3]] = 50.0                           # a tie, the later one seen first by its lane
    x[7, :V // 2] = float("-inf")
    x[7, V // 2 + 1] = float("nan")                   # NaN past a run of -inf
    x[8, 1:] = float("-inf")                          # the maximum in the first lane only
    return x


@pytest.mark.parametrize("V, block", [(128256, None), (32000, 1024), (49152, 4096), (4099, 512), (48, None),
                                      (1, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_gives_argmax(V, block, dtype, monkeypatch):
    if block is not None:   # several blocks a row: ties and NaN in different steps of the walk
        monkeypatch.setattr(ops, "ARGMAX_BLOCK", block)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = _hard_rows(V, V).to(device, dtype) if V > 8 else torch.randn(3, V).to(device, dtype)
    assert torch.equal(ops.argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(ops.argmax_rows(x[:, :V - 1] if V > 1 else x), (x[:, :V - 1] if V > 1 else x).argmax(-1))
    index_map = torch.randperm(V, generator=torch.Generator().manual_seed(1)).to(device)
    assert torch.equal(ops.argmax_rows(x, index_map), index_map[x.argmax(dim=-1)])


def test_a_strided_row_is_read_as_itself():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = _hard_rows(3000, 2).to(device)
    assert torch.equal(ops.argmax_rows(x[:, 100:2100]), x[:, 100:2100].argmax(-1))   # row stride 3000
    assert torch.equal(ops.argmax_rows(x.t().contiguous().t()), x.argmax(-1))        # column-major: copied


def test_no_rows_give_no_ids():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert ops.argmax_rows(torch.zeros(0, 50, device=device)).shape == (0,)


def test_on_the_cpu_it_is_torchs_argmax():
    x = _hard_rows(32000, 1)
    assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))
    index_map = torch.arange(32000) * 3
    assert torch.equal(greedy_tokens(x, index_map), x.argmax(dim=-1) * 3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: greedy_tokens takes the kernel on CUDA only")
@pytest.mark.parametrize("V", [128256, 49152, 4099])
def test_on_cuda_it_equals_argmax(V):
    x = _hard_rows(V, 3).cuda().bfloat16()
    assert torch.equal(greedy_tokens(x), x.argmax(dim=-1))
    assert torch.equal(greedy_tokens(x.view(3, 3, V)), x.view(3, 3, V).argmax(dim=-1))   # [B, T, V]
    assert greedy_tokens(x[:0]).shape == (0,)


def test_a_map_that_does_not_fit_is_refused_by_name():
    """The kernel reads index_map[argmax] unchecked: a map of the wrong length or dtype is refused before it runs."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(2, 50, device=device)
    for bad in (torch.arange(49, device=device), torch.arange(50, device=device, dtype=torch.int32)):
        with pytest.raises(ValueError, match="index_map must be"):
            ops.argmax_rows(x, bad)
