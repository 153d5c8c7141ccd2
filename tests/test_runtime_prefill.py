"""The fused-kernel prefill (``Transformer.prefill_kernels``, ``ops.prefill_rope_kv_write``) and its CUDA graphs
(``Model.admit`` -> ``PrefillGraphs``) against the torch path of ``Transformer.prefill``.

On the CPU the kernel path runs under TRITON_INTERPRET=1 (tiny shapes, fp32); on the GPU the public
``Model.admit`` is checked in fp32 (1e-4) and bf16 (2e-2) with graphs, through admissions into a running
batch, padded buckets, the eager fallback, and graph reuse / invalidation."""
import copy

import pytest
import torch

from triton_interpreter import DEVICE, INTERPRET
from verispec.runtime import ModelConfig, load_model, ops
from verispec.runtime.graphs import pack_prefill, unpack_prefill
from verispec.runtime.model import PREFILL_BUCKETS, PREFILL_GRAPH_MAX_PROMPTS, Model

BASE = dict(vocab_size=97, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=96, rope_theta=10000.0)
CONFIGS = {
    "llama": ModelConfig(**BASE),
    "qwen3": ModelConfig(**{**BASE, "num_kv_heads": 1, "attention_bias": True, "qk_norm": True}),
}
needs_kernels = pytest.mark.skipif(not ops.AVAILABLE or not (INTERPRET or torch.cuda.is_available()),
                                   reason="the Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRET, reason="needs a CUDA GPU")
SENTINEL = 7.0          # what the cache holds before the prefill: any slot still 7.0 afterwards was not written


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def random_prompts(lens, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lens]


def test_pack_prefill_worked_example():
    buf = pack_prefill([[5, 6, 7], [8]], T=4, first_row=2)
    assert buf.tolist() == [5, 6, 7, 0, 8, 0, 0, 0, 2, 0, 2]
    tokens, last, first_row = unpack_prefill(buf, 2, 4)
    assert tokens.tolist() == [[5, 6, 7, 0], [8, 0, 0, 0]] and last.tolist() == [2, 0] and first_row.tolist() == [2]


@needs_kernels
@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("lens, first_row, T", [([5, 13, 1], 2, 16), ([9], 0, 9), ([3, 20], 4, 32)])
def test_prefill_kernels_match_torch_path_fp32(arch, lens, first_row, T):
    """Ragged prompts admitted at ``first_row``, padded to T >= the longest (a graph bucket): the logits at each
    last token, and the K/V of every slot the torch path writes, equal the torch path's; only rows
    [first_row, first_row + n), slots [0, T) are written."""
    cfg = CONFIGS[arch]
    m = load_model(cfg, device=DEVICE, dtype=torch.float32, seed=1, use_graphs=False)
    n, longest = len(lens), max(lens)
    m.setup_cache(first_row + n + 1, 40)
    for buf in m.cache.k + m.cache.v:
        buf.fill_(SENTINEL)
    cache_t, cache_k = m.cache, copy.deepcopy(m.cache)
    tokens, last, row = unpack_prefill(pack_prefill(random_prompts(lens, cfg.vocab_size), T, first_row).to(DEVICE),
                                       n, T)
    with torch.no_grad():
        ref = m.net._prefill_torch(tokens[:, :longest], last, m._rope, cache_t, cfg.num_layers, first_row)
        got = m.net.prefill_kernels(tokens, last, m._rope, cache_k, cfg.num_layers, row)
    assert got.shape == ref.shape == (n, cfg.vocab_size)
    assert rel(got, ref) <= 1e-4
    rows = slice(first_row, first_row + n)
    for i in range(cfg.num_layers):
        for got_buf, ref_buf in ((cache_k.k[i], cache_t.k[i]), (cache_k.v[i], cache_t.v[i])):
            torch.testing.assert_close(got_buf[rows, :, :longest], ref_buf[rows, :, :longest], rtol=1e-5, atol=1e-5)
            assert (got_buf[rows, :, longest:T] != SENTINEL).all()       # the padded tail: dead slots, written
            untouched = torch.ones_like(got_buf, dtype=torch.bool)
            untouched[rows, :, :T] = False
            assert (got_buf[untouched] == SENTINEL).all()


def test_prefill_bucket_rule():
    """The bucket is the smallest of PREFILL_BUCKETS holding the longest prompt, capped at the cache capacity;
    None (eager) without graphs or kernels, for too many prompts, or past the largest bucket."""
    m = load_model(ModelConfig(**BASE), device="cpu", dtype=torch.float32)
    m.setup_cache(PREFILL_GRAPH_MAX_PROMPTS + 1, 700)                   # capacity 704
    assert m.prefill_bucket(1, 5) is None                               # CPU: no graphs
    m.use_graphs, m.net.use_kernels = True, True
    assert [m.prefill_bucket(1, t) for t in (1, 16, 17, 100, 300, 500, 512)] == [16, 16, 32, 128, 384, 512, 512]
    assert m.prefill_bucket(1, PREFILL_BUCKETS[-1] + 1) is None
    assert m.prefill_bucket(PREFILL_GRAPH_MAX_PROMPTS, 10) == 16
    assert m.prefill_bucket(PREFILL_GRAPH_MAX_PROMPTS + 1, 10) is None
    m.setup_cache(1, 40)                                                # capacity 64
    assert m.prefill_bucket(1, 40) == 64 and m.prefill_bucket(1, 10) == 16
    m.net.use_kernels = False
    assert m.prefill_bucket(1, 10) is None


# ------------------------------------------------------------------------------------------------ GPU
GPU_CFG = ModelConfig(vocab_size=1000, num_layers=3, hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=32,
                      intermediate_size=512, rope_theta=10000.0, attention_bias=True, qk_norm=True)


def admissions(m, cfg, steps):
    """Admit prompt groups one after another into a running batch, then one decode step of every row:
    [logits of each admission..., decode logits]."""
    out = []
    for lens, seed in steps:
        out.append(m.admit(random_prompts(lens, cfg.vocab_size, seed)))
    tok = torch.randint(0, cfg.vocab_size, (m.batch_size, 1), generator=torch.Generator().manual_seed(9))
    out.append(m.decode(tok.cuda())[:, 0])
    return out


@needs_gpu
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_admit_graphs_match_torch_path_gpu(dtype, tol):
    """Graph-bucketed admissions at rows 0, 1-2 and 3, an eager long one at row 4, then a decode step of all
    rows (it reads every admitted row's K/V): equal to the torch-path prefill of the same weights."""
    graphed = load_model(GPU_CFG, device="cuda", dtype=dtype, seed=1)
    torch_path = load_model(GPU_CFG, device="cuda", dtype=dtype, seed=1, use_graphs=False)
    torch_path.net.use_kernels = False
    steps = [([17], 0), ([5, 40], 1), ([64], 2), ([600], 3)]
    outs = {}
    for name, m in (("graphed", graphed), ("torch", torch_path)):
        m.setup_cache(6, 700, empty=True)
        outs[name] = admissions(m, GPU_CFG, steps)
    for a, b in zip(outs["graphed"], outs["torch"]):
        assert rel(a, b) <= tol
    # the prompts' lengths, plus the one decode step of ``admissions``
    assert graphed.lengths.tolist() == torch_path.lengths.tolist() == [18, 6, 41, 65, 601]
    # (1, 32), (2, 64), (1, 64); the 600-token prompt ran eagerly
    assert len(graphed._prefill_graphs) == 3


@needs_gpu
def test_prefill_graph_serves_every_row_and_is_deterministic():
    """One graph admits a prompt at any cache row with bit-identical logits (first_row is a device value; the
    same prompts always take the same path), and the graphs survive a reused cache but not a new one."""
    m = load_model(GPU_CFG, device="cuda", dtype=torch.bfloat16, seed=2)
    prompt = random_prompts([50], GPU_CFG.vocab_size, seed=4)
    other = random_prompts([3, 30], GPU_CFG.vocab_size, seed=5)
    m.setup_cache(4, 128, empty=True)
    at_row0 = m.admit(prompt)
    m.admit(other)
    at_row3 = m.admit(prompt)
    assert torch.equal(at_row0, at_row3)
    k_row0 = [buf[0, :, :50].clone() for buf in m.cache.k]
    assert all(torch.equal(buf[3, :, :50], k) for buf, k in zip(m.cache.k, k_row0))
    count = len(m._prefill_graphs)
    m.setup_cache(2, 100, empty=True)                 # fits the same buffers: graphs kept
    assert torch.equal(m.admit(prompt), at_row0) and len(m._prefill_graphs) == count
    m.setup_cache(2, 4096, empty=True)                # new buffers: graphs dropped, captured again
    assert len(m._prefill_graphs) == 0
    assert torch.equal(m.admit(prompt), at_row0) and len(m._prefill_graphs) == 1


@needs_gpu
@pytest.mark.parametrize("T", [100, 1500])
def test_prefill_kernels_bf16_real_heads_gpu(T):
    """Real head sizes (D=128, G=4), bf16, a bucketed and a long eager prompt: vs the torch path, and both vs
    an fp32 copy (the kernel path may not be much less accurate than the torch path)."""
    cfg = ModelConfig(vocab_size=1000, num_layers=2, hidden_size=512, num_heads=16, num_kv_heads=4,
                      head_dim=128, intermediate_size=1024, rope_theta=500000.0)
    m = load_model(cfg, device="cuda", dtype=torch.bfloat16, seed=3)
    ref32 = Model(copy.deepcopy(m.net).float(), None, use_graphs=False)
    prompts = random_prompts([T], cfg.vocab_size, seed=T)
    m.setup_cache(1, 2048)
    new = m.prefill(prompts)
    m.net.use_kernels = False
    old = m.prefill(prompts)
    ref32.setup_cache(1, 2048)
    exact = ref32.prefill(prompts)
    assert rel(new, old) <= 2e-2
    assert rel(new, exact) <= 2 * rel(old, exact) + 1e-3


def test_prefill_attention_is_causal_gqa():
    """ops.prefill_attention: query head h reads KV head h // G, token t sees tokens <= t (vs a masked softmax)."""
    torch.manual_seed(0)
    B, H, KV, T, D = 2, 6, 2, 9, 16
    q, k, v = torch.randn(B, H, T, D), torch.randn(B, KV, T, D), torch.randn(B, KV, T, D)
    kk, vv = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    scores = (q @ kk.transpose(-1, -2)) / D ** 0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(ops.prefill_attention(q, k, v), scores.softmax(-1) @ vv, rtol=1e-5, atol=1e-5)


@needs_gpu
def test_prefill_cudnn_attention_switch_gpu(monkeypatch):
    """ops.PREFILL_CUDNN_MIN_TOKENS: the cuDNN attention (K/V repeated to H heads) gives the default path's
    logits within bf16 noise; prompts below the threshold keep the default attention."""
    cfg = ModelConfig(vocab_size=1000, num_layers=2, hidden_size=512, num_heads=16, num_kv_heads=4,
                      head_dim=128, intermediate_size=1024, rope_theta=500000.0)
    m = load_model(cfg, device="cuda", dtype=torch.bfloat16, seed=6, use_graphs=False)
    m.setup_cache(1, 1024)
    long, short = random_prompts([700, 100], cfg.vocab_size, seed=6)
    default = [m.prefill([long]), m.prefill([short])]
    monkeypatch.setattr(ops, "PREFILL_CUDNN_MIN_TOKENS", 512)
    try:
        cudnn_long = m.prefill([long])
    except RuntimeError as e:
        pytest.skip(f"SDPA's cuDNN backend is unavailable here: {str(e)[:200]}")
    assert rel(cudnn_long, default[0]) <= 2e-2
    assert torch.equal(m.prefill([short]), default[1])
