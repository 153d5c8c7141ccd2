"""benchmarks/step_kernels.py on the CPU: each stand-in returns what the kernel it replaces returns (shape, dtype),
the functions are put back, the page renders, and bad flags or a machine without a GPU get a usage error."""
from __future__ import annotations

import pytest
import torch

from benchmarks import step_kernels
from verispec.runtime import ops

pytestmark = pytest.mark.skipif(not ops.AVAILABLE, reason="needs triton (the interpreter on the CPU)")


def test_each_stand_in_matches_its_kernel_s_output():
    torch.manual_seed(0)
    N, H, KV, D, E, I = 3, 4, 2, 16, 32, 24
    x, delta, w = torch.randn(N, E), torch.randn(N, E), torch.rand(E)
    real = ops.add_rmsnorm(x, delta, w, 1e-5)
    fake = step_kernels._no_norm(x, delta, w, 1e-5)
    assert [t.shape for t in fake] == [t.shape for t in real] and [t.dtype for t in fake] == [t.dtype for t in real]
    gu = torch.randn(N, 2 * I)
    assert step_kernels._no_silu(gu).shape == ops.silu_mul(gu).shape
    qkv = torch.randn(N, (H + 2 * KV) * D)
    rope = torch.randn(64, 2, D)
    k_cache, v_cache = torch.zeros(1, KV, 64, D), torch.zeros(1, KV, 64, D)
    pos = torch.arange(N)
    q = ops.rope_kv_write(qkv, rope, pos, k_cache, v_cache, N, H, KV, D)
    assert step_kernels._no_rope(qkv, rope, pos, k_cache, v_cache, N, H, KV, D).shape == q.shape
    out = ops.decode_attention(q, k_cache, v_cache, torch.zeros(1, dtype=torch.long), N, D ** -0.5)
    nsplit, tiles, rows, acc, ml = ops._attn_partials(q, 1, KV, H // KV, N, 64)
    fake = step_kernels._no_combine(q, acc, ml, 1, N, KV, H // KV, nsplit, rows, torch.zeros(1, dtype=torch.long), N)
    assert fake.shape == out.shape and fake.dtype == out.dtype


def test_removed_puts_the_functions_back_even_on_error():
    before = {name: getattr(ops, name) for name in step_kernels.REMOVED["all four"]}
    with pytest.raises(RuntimeError, match="inside"):
        with step_kernels.removed(step_kernels.REMOVED["all four"]):
            assert ops.silu_mul is step_kernels._no_silu
            raise RuntimeError("inside")
    assert {name: getattr(ops, name) for name in before} == before


def test_a_cell_takes_each_variant_s_fastest_graph_and_the_model_s_floor():
    from verispec.runtime import ModelConfig, load_model
    cfg = ModelConfig(vocab_size=97, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=48, max_position_embeddings=128)
    model = load_model(cfg, device="cpu", dtype=torch.bfloat16, seed=0)
    row = step_kernels.cell("tiny", model, {"step": [12.0, 10.0], "silu_mul": [9.0, 9.5]}, bandwidth=1e9)
    assert row["us"] == {"step": 10.0, "silu_mul": 9.0} and row["layers"] == 2
    weights = model.weight_bytes - model.net.embed.numel() * 2 * (model.net.lm_head is not None)
    assert row["floor_us"] == pytest.approx(weights / 1e9 * 1e6)


def test_the_page_names_every_variant_and_the_change():
    res = dict(env=dict(device="cpu", date="d", torch="t", triton="tr", transformers="tf", python="p"),
               bandwidth=4e12, command="python benchmarks/step_kernels.py",
               rows=[dict(model="1b-bf16", layers=16, floor_us=578.0,
                          us={"step": 1000.0, "add_rmsnorm": 950.0, "rope_kv_write": 990.0, "attn combine": 980.0,
                              "silu_mul": 1005.0, "all four": 900.0})])
    page = step_kernels.markdown(res)
    assert "| 1b-bf16 | 1000.0 | 578.0 | 58% | 950.0 (-50.0 us, -5.0%) |" in page
    assert "1005.0 (+5.0 us, +0.5%)" in page and "900.0 (-100.0 us, -10.0%) |" in page
    for v in step_kernels.REMOVED:
        assert f"without {v}" in page


def test_bad_models_and_no_gpu_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        step_kernels.main(["--models", "1b-bf16,70b"])
    assert e.value.code == 2 and "--models" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            step_kernels.main(["--models", "1b-bf16"])
        assert e.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
