"""packed.cu v3's lane layout on the CPU: packed_v3.cuh (what each lane loads of a unit of 256 weights of every type,
the exact bf16 integers and scales it decodes, the x it pairs them with) compiled for the host with the warp's mma.sync
m16n8k16 emulated from the PTX fragment layout (tests/packed_v3_host.cpp, the kernel's loop mirrored), against the
torch dequantizer + matmul. A wrong column, nibble, scale byte or fragment slot is off by the weights' whole size;
the tolerance only covers rounding. The GPU runs the kernel itself (tests/test_quant_gpu.py)."""
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from host_build import build_host_driver  # noqa: E402
from test_quant_formats import edge_blocks  # noqa: E402
from verispec.runtime.quant import dequantize
from verispec.runtime.quant.formats import block_format


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Path:
    return build_host_driver("packed_v3_host.cpp", tmp_path_factory.mktemp("v3"))


def v3_host(exe: Path, tmp: Path, blocks: torch.Tensor, qtype: int, x: torch.Tensor) -> torch.Tensor:
    """y [M, N] fp32 of x [M, K] bf16 @ W^T, W = blocks uint8 [N, row bytes], through the host build of v3."""
    (M, K), N = x.shape, blocks.shape[0]
    head = np.array([qtype, K, N, M], dtype=np.int32).tobytes()
    (tmp / "in.bin").write_bytes(head + blocks.numpy().tobytes() + x.view(torch.int16).numpy().tobytes())
    r = subprocess.run([str(exe), str(tmp / "in.bin"), str(tmp / "out.bin")], capture_output=True, timeout=120)
    assert r.returncode == 0, r
    return torch.from_numpy(np.fromfile(tmp / "out.bin", dtype=np.float32)).view(M, N)


def random_rows(name: str, N: int, K: int, seed: int) -> torch.Tensor:
    """uint8 [N, row bytes]: random bytes (every nibble, 6-bit scale and int8 scale value) with finite f16 fields."""
    fmt = block_format(name)
    n = N * K // fmt.block_size
    return edge_blocks(name, n=2 * n, seed=seed)[n:].reshape(N, -1)


# K = 768: 3 units of 256 weights (fewer than the 8 slices; Q6_K rows of 630 bytes, so every other row is 2 mod 4
# aligned); K = 2560: 10 (slices 0 and 1 chain two); K = 576 (SmolLM2's width, simple types only): 2 units and a short
# third of 2 blocks. N = 40, M = 11: a partial row tile and a partial token tile.
@pytest.mark.parametrize("name, K", [("Q4_K", 768), ("Q4_K", 2560), ("Q6_K", 768), ("Q6_K", 2560), ("Q4_0", 576),
                                     ("Q4_1", 576), ("Q8_0", 576), ("Q8_0", 2560)])
def test_v3_lane_layout_computes_the_matmul(emulator, tmp_path, name, K):
    """Tolerance: v3 regroups each chunk's sum (Q4_K / Q4_1: scale * sum(q x) + offset * sum(x); Q6_K: per 16-weight
    scale group), so its terms are bounded by |x| @ (|scale q| + |offset|) rather than |x| @ |W|, up to about 4x larger
    for these blocks; 2^-14 * (|x| @ |W|^T) is 2^-16 on that 4x (the bound the packed.cu tests state for v1 / v2)."""
    qtype = block_format(name).ggml_type
    N, M = 40, 11
    blocks = random_rows(name, N, K, seed=K)
    W = dequantize(blocks, qtype).double()                                   # [N, K]
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = v3_host(emulator, tmp_path, blocks, qtype, x).double()
    ref = x.double() @ W.T
    scale = x.double().abs() @ W.abs().T
    err = (y - ref).abs()
    assert bool((err <= 2.0 ** -14 * scale + 1e-30).all()), (err / scale).max()
    # each token's row alone (M = 1) is the same bits: the layout gives a token's column nothing of the others'
    assert torch.equal(v3_host(emulator, tmp_path, blocks, qtype, x[4:5]), y[4:5].float())
