"""The K-quant quantizers (verispec/runtime/quant/kquants.py) against tests/kquant_reference.py, ggml's
quantize_row_q4_K_ref / quantize_row_q6_K_ref restated as scalar fp32 loops: the same bytes block for block, on
ordinary and awkward blocks (zeros, constants, a spike, ties on a grid, tiny and huge values, heavy tails)."""
import sys

import numpy as np
import pytest
import torch

from kquant_reference import q4_k_block, q6_k_block
from verispec.runtime.quant import quantize
from verispec.runtime.quant.kquants import nearest_int


def awkward_blocks(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(14, 256, generator=g)
    x[0] = 0
    x[1] = -0.3                                                           # constant: max == min sub-blocks
    x[2] = torch.randn(8, 1, generator=g).expand(8, 32).reshape(256)      # constant sub-blocks, different ones
    x[3] = 0
    x[3, 77] = 1.0                                                        # one spike in zeros
    x[4] = torch.randint(-8, 8, (256,), generator=g) * 0.125              # a grid: rounding ties
    x[5] = x[5].abs() + 0.5                                               # positive: min clamps to 0
    x[6] = -x[6].abs()
    x[7] *= 1e-6
    x[8] *= 1e4
    x[9, ::37] *= 50                                                      # outliers
    x[10] = torch.randn(256, generator=g) / torch.randn(2, 256, generator=g).pow(2).mean(0).sqrt()   # Student t, 2 dof
    x[11, :128] = 0                                                       # half zeros (Q6_K all-zero sub-blocks)
    x[12] *= 0.02                                                         # a typical weight matrix's scale
    # two normal blocks where Q4_K's search keeps its last trial (t = 20): a search one trial short fails on them
    last = torch.randn(234, 256, generator=torch.Generator().manual_seed(5))[[34, 233]]
    return torch.cat([x, last])


@pytest.mark.parametrize("name, oracle", [("Q4_K", q4_k_block), ("Q6_K", q6_k_block)])
def test_kquant_equals_the_scalar_reference(name, oracle):
    x = awkward_blocks()
    got = quantize(x, name).numpy()
    for i, row in enumerate(x.numpy()):
        assert got[i].tobytes() == oracle(row), f"{name} block {i} differs from ggml's reference rounding"


def test_nearest_int_is_ggmls_round_half_even():
    v = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 2.4999998, 1e6 + 0.5, -3.5])
    assert nearest_int(v).tolist() == [0, 2, 2, 0, -2, 2, 1000000, -4]


def test_kquant_blocks_are_row_independent(monkeypatch):
    """Quantizing rows in chunks (as ``quantize`` does for big matrices) gives the same bytes as all at once."""
    blocks = awkward_blocks(1)                                            # [n, 256]
    x = blocks.repeat(3, 2)                                               # [3n, 512]: each row two blocks
    whole = quantize(x, "Q4_K")
    monkeypatch.setattr(sys.modules["verispec.runtime.quant.quantize"], "CHUNK_WEIGHTS", 256 * 5)
    assert torch.equal(quantize(x, "Q4_K"), whole)
    assert np.array_equal(whole[:len(blocks), :144].numpy(), quantize(blocks, "Q4_K").numpy())
