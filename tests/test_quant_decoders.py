"""packed.cu's block decoders on the CPU: verispec/runtime/gemv/packed_decoders.cuh compiled for the host (with the
driver tests/packed_decoders_host.cpp) decodes random blocks -- f16 scales through 0, -0, subnormals, +-65504, +-inf
and NaN -- to exactly the torch dequantizer's values (itself gguf-py's bit for bit), in both variants: v1 (byte loads,
the decoders checked on an H100) and v2 (aligned word loads, the 2^23 trick), with the rows at every byte alignment
v2's word loads can meet. The GPU tests compare the kernels themselves (tests/test_quant_gpu.py)."""
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from host_build import build_host_driver  # noqa: E402
from test_quant_formats import assert_same_bits, edge_blocks  # noqa: E402
from verispec.runtime.quant import dequantize
from verispec.runtime.quant.formats import block_format


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    return build_host_driver("packed_decoders_host.cpp", tmp_path_factory.mktemp("decoders"))


def decode(exe: Path, tmp: Path, blocks: torch.Tensor, qtype: int, K: int, offset: int) -> tuple[torch.Tensor, ...]:
    """(v1, v2) fp32 [N, K] of blocks uint8 [N, row bytes] decoded by the host build, rows ``offset`` bytes past a
    64-byte boundary."""
    N = blocks.shape[0]
    head = np.array([qtype, K, N, offset], dtype=np.int32).tobytes()
    (tmp / "in.bin").write_bytes(head + blocks.numpy().tobytes())
    r = subprocess.run([str(exe), str(tmp / "in.bin"), str(tmp / "out.bin")], capture_output=True, timeout=60)
    assert r.returncode == 0, r
    out = torch.from_numpy(np.fromfile(tmp / "out.bin", dtype=np.float32)).view(2, N, K)
    return out[0], out[1]


@pytest.mark.parametrize("name, K", [("Q4_0", 96), ("Q4_1", 96), ("Q8_0", 96), ("Q4_K", 512), ("Q6_K", 512)])
def test_both_variants_decode_as_the_reference(decoder, tmp_path, name, K):
    fmt = block_format(name)
    blocks = edge_blocks(name, n=240 * K // fmt.block_size, seed=7).view(240, -1)   # 240 rows of K weights
    ref = dequantize(blocks, fmt.ggml_type).numpy()                                  # [240, K]
    for offset in range(4):
        v1, v2 = decode(decoder, tmp_path, blocks, fmt.ggml_type, K, offset)
        assert_same_bits(v1, ref)
        assert_same_bits(v2, ref)
