"""The exact-widths rule (CPU): ``ops.matmul_path`` against the table in docs/runtime.md ("Exact widths"), the
width buckets of the captured passes, and the cache's room for their padding."""
from pathlib import Path

import pytest
import torch

from verispec.runtime import cache as cache_mod
from verispec.runtime import model as model_mod
from verispec.runtime import ops

DOC = Path(__file__).resolve().parents[1] / "docs" / "runtime.md"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _table() -> list[dict]:
    """The rows of the "Exact widths" table as dicts of its columns (backticks stripped)."""
    text = DOC.read_text().split("## Exact widths", 1)[1].split("\n## ", 1)[0]     # this section only
    table = text.split("\n\n| ", 1)[1].split("\n\n", 1)[0]                         # its first table
    lines = ["| " + ln if i == 0 else ln for i, ln in enumerate(table.splitlines()) if i == 0 or ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for ln in lines[1:]:
        cells = [c.strip().strip("`") for c in ln.strip("|").split("|")]
        rows.append(dict(zip(header, cells)))
    return rows


def _cases(row: dict):
    """(device, dtype, K, batch, tokens, mode) samples that the row covers."""
    mode = row["`VERISPEC_MATMUL`"] if "`VERISPEC_MATMUL`" in row else row["VERISPEC_MATMUL"]
    dtypes = [DTYPES[d.strip()] for d in row["dtype"].split(",")]
    Ks = {"K % 8 == 0": (576, 4096, 14336), "K % 4 == 0": (576, 4100), "16-byte rows": (576, 4096),
          "any": (576, 4096, 1001)}[row["K"]]
    widths = {"any": [(1, 1), (1, 9), (8, 5), (32, 5), (64, 17), (3, 64)],
              "B = 1, <= 8 tokens": [(1, 1), (1, 4), (1, 8)]}[row["rows"]]
    for dtype in dtypes:
        for K in Ks:
            for batch, tokens in widths:
                yield row["device"], dtype, K, batch, tokens, mode


def test_the_table_names_every_path_once():
    paths = [r["path"] for r in _table()]
    assert sorted(set(paths)) == sorted({ops.PATH_INVARIANT, ops.PATH_GEMV_CHUNKS, ops.PATH_GEMV, ops.PATH_TORCH})
    assert len(_table()) == 5


@pytest.mark.parametrize("row", _table(), ids=lambda r: f"{r['device']}-{r['path']}")
def test_matmul_path_follows_the_table(row):
    for device, dtype, K, batch, tokens, mode in _cases(row):
        assert ops.matmul_path(device, dtype, K, batch, tokens, mode=mode) == row["path"], (device, dtype, K, batch,
                                                                                           tokens, mode)
    exact = row["exact across widths"].startswith("yes")
    assert exact == (row["path"] in (ops.PATH_INVARIANT, ops.PATH_GEMV_CHUNKS))


def test_the_gemv_rule_leaves_wider_passes_to_cublas():
    assert ops.matmul_path("cuda", torch.bfloat16, 4096, 1, 9, mode="gemv") == ops.PATH_TORCH
    assert ops.matmul_path("cuda", torch.bfloat16, 4096, 2, 1, mode="gemv") == ops.PATH_TORCH
    assert ops.matmul_path("cuda", torch.bfloat16, 4100, 1, 1, mode="invariant") == ops.PATH_TORCH   # K % 8 != 0
    assert ops.matmul_path("cuda", torch.bfloat16, 4096, 1, 1, extension=False) == ops.PATH_TORCH


def test_a_bad_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="VERISPEC_MATMUL.*invariant"):
        ops.matmul_path("cuda", torch.bfloat16, 4096, mode="fastest")


def test_width_buckets_and_the_room_for_their_padding():
    buckets = model_mod.WIDTH_BUCKETS
    assert list(buckets) == sorted(buckets) and buckets[0] == 1
    assert buckets[-1] >= model_mod.GRAPH_MAX_TOKENS + 1            # every captured k + 1 has a bucket
    pads = [next(w for w in buckets if w >= k) - k for k in range(1, buckets[-1] + 1)]
    assert max(pads) <= cache_mod.PAD_SLOTS                           # padding K/V stays inside the capacity
    for max_seq_len in (1, 63, 64, 100, 4096):
        assert cache_mod.capacity(max_seq_len) >= max_seq_len + cache_mod.PAD_SLOTS


def test_graph_width_rule():
    from verispec.runtime import ModelConfig, load_model

    cfg = ModelConfig(vocab_size=32, num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=32)
    m = load_model(cfg, device="cpu")
    assert m.graph_width(4) is None                                   # no graphs on the CPU: exact widths
    m.use_graphs = True
    assert [m.graph_width(k) for k in (1, 2, 3, 4, 5, 6, 9, 10, 17)] == [1, 2, 3, 5, 5, 9, 9, 17, 17]
    assert m.graph_width(18) is None


def test_cpu_padded_pass_keeps_lengths_and_logits():
    """A pass run in a wider bucket (CPU model forced through the graph path) returns the k real tokens' logits
    and advances lengths by k, like the exact-width pass; the padding's K/V stay past the live slots."""
    from verispec.runtime import ModelConfig, load_model

    cfg = ModelConfig(vocab_size=50, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=48)
    m = load_model(cfg, device="cpu", seed=3)
    prompts = [[1, 2, 3, 4], [5, 6]]
    tokens = torch.tensor([[7, 8, 9, 10], [11, 12, 13, 14]])
    m.setup_cache(2, 40)
    m.prefill(prompts)
    exact = m.append(tokens)
    m.use_graphs = True
    m.setup_cache(2, 40)
    m.prefill(prompts)
    padded = m.append(tokens)                                         # width 4 -> bucket 5
    assert padded.shape == exact.shape == (2, 4, 50)
    assert m.lengths.tolist() == [8, 6]
    torch.testing.assert_close(padded, exact, rtol=1e-4, atol=1e-5)   # CPU BLAS: not bitwise across widths


def test_the_cluster_kernel_is_picked_only_past_32_rows_of_long_wide_matrices():
    """``invariant_variant``: the cluster kernel (speed only; same bits) never runs a decode or a short verify pass
    (<= 32 rows, where the slice-warp kernel is within 1.2x cuBLAS), nor rows shorter than CLUSTER_MIN_K (its blocks
    would walk a few steps each), and it does run the 8B shape's wide matrices at 64 rows."""
    from verispec.runtime import gemv

    shapes = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096), (3072, 2048), (2048, 8192),
              (49152, 576), (3072, 576)]
    def slice_warp(M, N, K):
        return gemv.invariant_variant(M, N, K) not in gemv.CLUSTER_VARIANTS

    for M in (1, 2, 8, 9, 16, 17, 32):
        assert all(slice_warp(M, N, K) for N, K in shapes), M
    for M in (33, 64, 65, 128, 129, 512):
        assert slice_warp(M, 49152, 576) and slice_warp(M, 3072, 576)
    assert [gemv.invariant_variant(64, N, 4096) for N in (6144, 28672, 128256)] == [gemv.CLUSTER_VARIANT] * 3
    assert slice_warp(64, 4096, 4096)


def test_the_variant_rule_names_a_variant_for_every_shape_and_uses_its_three_width_bands():
    """``invariant_variant`` picks by rows and by the matrix's width in three bands (N <= 4096, <= 8192, wider): a
    variant of the extension's range for every (M, N) (its last row unbounded), and at one row the 8B qkv (N = 6144)
    on another variant than its o (N = 4096) and its gate/up (N = 28672) -- the H200 sweep's winners differ there."""
    from verispec.runtime import gemv

    for M in (1, 7, 8, 9, 16, 17, 32, 33, 64, 65, 4096):
        for N in (64, 4096, 4097, 8192, 8193, 128256):
            assert 1 <= gemv.invariant_variant(M, N, 4096) <= 20, (M, N)
    assert len({gemv.invariant_variant(1, N, 4096) for N in (4096, 6144, 28672)}) == 3
    assert gemv.VARIANT_RULE[-1][0] >= 1 << 31
