"""The Triton decode/verify kernels of verispec.runtime (ops.py) against the torch path of
``Transformer.append``: on the CPU under TRITON_INTERPRET=1 (tiny shapes, fp32), on the GPU in fp32 and bf16.

The model uses the kernels on CUDA only; these tests pin them to the torch path (the one checked against
transformers) on ragged lengths, verify blocks (T > 1), GQA, q/k/v bias and qk-norm, split-KV attention with
several splits and the KV cache contents they write."""
import copy

import pytest
import torch

from verispec.runtime import ModelConfig, load_model
from verispec.runtime import ops

pytestmark = pytest.mark.skipif(not ops.AVAILABLE, reason="needs triton")

BASE = dict(vocab_size=97, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=96, rope_theta=10000.0)
CONFIGS = {
    "llama": ModelConfig(**BASE),
    "qwen3": ModelConfig(**{**BASE, "num_kv_heads": 1, "attention_bias": True, "qk_norm": True}),
}


def _devices():
    devs = []
    if torch.cuda.is_available():
        devs.append("cuda")
    import os
    if os.environ.get("TRITON_INTERPRET") == "1":
        devs.append("cpu")
    return devs


def run_both(cfg, device, dtype, lens, T, cap, steps=2, seed=0):
    """Prefill ragged prompts, then ``steps`` appends of T tokens through both paths; returns logits and caches."""
    m = load_model(cfg, device=device, dtype=dtype, seed=seed, use_graphs=False)
    g = torch.Generator().manual_seed(seed)
    m.setup_cache(len(lens), cap)
    m.prefill([torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in lens])
    cache_t, cache_k = m.cache, copy.deepcopy(m.cache)
    out = {"torch": [], "kernels": []}
    for _ in range(steps):
        tok = torch.randint(0, cfg.vocab_size, (len(lens), T), generator=g).to(device)
        for name, cache in (("torch", cache_t), ("kernels", cache_k)):
            f = m.net.append_kernels if name == "kernels" else m.net._append_torch
            out[name].append(f(tok, cache.lengths, m._rope, cache, cfg.num_layers).float())
            cache.lengths.add_(T)
    return out, cache_t, cache_k


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("T", [1, 3])
def test_kernels_match_torch_path_fp32(device, arch, T):
    cfg = CONFIGS[arch]
    out, ct, ck = run_both(cfg, device, torch.float32, lens=[5, 40, 1], T=T, cap=80)
    for a, b in zip(out["kernels"], out["torch"]):
        assert rel(a, b) <= 1e-4
    for i in range(cfg.num_layers):      # the live slots of the cache hold the same K/V
        for b, n in enumerate(ct.lengths.tolist()):
            torch.testing.assert_close(ck.k[i][b, :, :n], ct.k[i][b, :, :n], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ck.v[i][b, :, :n], ct.v[i][b, :, :n], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [1, 4, 8])
@pytest.mark.parametrize("B", [1, 3])
def test_kernels_match_torch_path_gpu_bf16_long(T, B):
    """Real head sizes (D=128, G=4) and a long cache (many splits), bf16."""
    cfg = ModelConfig(vocab_size=1000, num_layers=2, hidden_size=512, num_heads=16, num_kv_heads=4,
                      head_dim=128, intermediate_size=1024, rope_theta=500000.0)
    out, _, _ = run_both(cfg, "cuda", torch.bfloat16, lens=[700, 3, 1500][:B], T=T, cap=1600, seed=B)
    for a, b in zip(out["kernels"], out["torch"]):
        assert rel(a, b) <= 2e-2


@pytest.mark.parametrize("device", _devices())
def test_decode_attention_dead_splits_and_capacity(device):
    """A cache of three splits where the rows' live slots end in split 0, 1 and 2: each row equals attention over
    its live prefix, whatever number of programs walks the splits (bit for bit), and equals, bit for bit, the same
    row computed in a cache of one split (the splits past a row's live slots are neither stored nor read)."""
    torch.manual_seed(0)
    B, KV, G, T, D = 3, 2, 2, 2, 16
    S = 3 * ops.ATTN_SPLIT
    lengths = torch.tensor([5, ops.ATTN_SPLIT + 40, 2 * ops.ATTN_SPLIT + 9], device=device)
    kc = torch.randn(B, KV, S, D, device=device)
    vc = torch.randn(B, KV, S, D, device=device)
    q = torch.randn(B * T, KV * G, D, device=device)
    o = ops.decode_attention(q, kc, vc, lengths, T, D ** -0.5).view(B, T, KV * G, D)
    for b in range(B):
        n = int(lengths[b]) + T
        qb = q.view(B, T, KV * G, D)[b].transpose(0, 1)                              # [H, T, D]
        k = kc[b, :, :n].repeat_interleave(G, 0)
        v = vc[b, :, :n].repeat_interleave(G, 0)
        mask = torch.arange(n, device=device)[None, :] <= (n - T + torch.arange(T, device=device))[:, None]
        ref = torch.nn.functional.scaled_dot_product_attention(qb, k, v, attn_mask=mask)
        assert rel(o[b].transpose(0, 1), ref) <= 1e-5, b
    for programs in (1, 2, 3):
        again = ops.decode_attention(q, kc, vc, lengths, T, D ** -0.5, programs=programs)
        assert torch.equal(again.view(B, T, KV * G, D), o), programs
    with pytest.raises(ValueError, match="programs must be >= 1"):
        ops.decode_attention(q, kc, vc, lengths, T, D ** -0.5, programs=0)
    small = ops.decode_attention(q.view(B, T, -1, D)[:1].reshape(T, -1, D), kc[:1, :, :ops.ATTN_SPLIT].contiguous(),
                                 vc[:1, :, :ops.ATTN_SPLIT].contiguous(), lengths[:1], T, D ** -0.5)
    assert torch.equal(small.view(T, KV * G, D), o[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("D", [64, 128])
def test_decode_attention_vs_sdpa_gpu(D):
    """The split-KV attention kernel alone against SDPA on the live prefix, fp32 and bf16."""
    torch.manual_seed(D)
    B, KV, G, T, S = 3, 4, 4, 5, 1000
    lengths = torch.tensor([10, 537, 990], device="cuda")
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        kc = torch.randn(B, KV, S, D, device="cuda", dtype=dtype)
        vc = torch.randn(B, KV, S, D, device="cuda", dtype=dtype)
        q = torch.randn(B * T, KV * G, D, device="cuda", dtype=dtype)
        o = ops.decode_attention(q, kc, vc, lengths, T, D ** -0.5).view(B, T, KV * G, D)
        for b in range(B):
            n = int(lengths[b]) + T
            qb = q.view(B, T, KV * G, D)[b].transpose(0, 1).float()               # [H, T, D]
            k = kc[b, :, :n].float().repeat_interleave(G, 0)
            v = vc[b, :, :n].float().repeat_interleave(G, 0)
            mask = torch.arange(n, device="cuda")[None, :] <= (n - T + torch.arange(T, device="cuda"))[:, None]
            ref = torch.nn.functional.scaled_dot_product_attention(qb, k, v, attn_mask=mask)
            assert rel(o[b].transpose(0, 1).float(), ref) <= tol
