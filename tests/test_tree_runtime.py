"""Token trees in the runtime (verispec/runtime/tree.py, tree_attention.py): a tree pass scores each node as the
chain of its root-to-node path would, and ``accept_tree_path`` leaves the cache as if the accepted path had been
appended as a chain.

On the CPU (fp32, tiny model) the torch path is compared within 1e-5: its matmuls (the CPU's BLAS) are not
row-invariant, so a node's row in a wide tree pass and the last row of a narrower chain pass may round apart. The
tree attention kernel (under the interpreter) is bit-equal to the chain kernel where a row sits in the same lane of
its tile (a chain-shaped tree); elsewhere within 1e-6 (numpy's BLAS rounds by lane). On a GPU (bf16, the
batch-invariant kernels) every node is compared bit for bit."""
import copy
import os

import pytest
import torch

from verispec.runtime import ModelConfig, load_model, ops
from verispec.runtime import tree as trees

CFG = ModelConfig(vocab_size=97, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=96, rope_theta=10000.0)
TREE = (-1, 0, 0, 1, 1, 2, 3, 0)          # the root, three children, grandchildren, one great-grandchild
GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def _model(device="cpu", dtype=torch.float32, lens=(5, 40), cap=96, use_graphs=False, cfg=CFG):
    m = load_model(cfg, device=device, dtype=dtype, seed=0, use_graphs=use_graphs)
    g = torch.Generator().manual_seed(1)
    m.setup_cache(len(lens), cap)
    m.prefill([torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in lens])
    tokens = torch.randint(0, cfg.vocab_size, (len(lens), len(TREE)), generator=g)
    return m, tokens


def _restore(m, base) -> None:
    """Put the cache state ``base`` (a deep copy) back into the model's own cache buffers: captured CUDA graphs
    hold those buffers, so the cache object must not be swapped."""
    cache = m.cache
    for dst, src in zip(cache.k + cache.v, base.k + base.v):
        dst.copy_(src)
    cache._lengths.copy_(base._lengths)
    cache.live.copy_(base.live)
    cache.batch_size, cache.max_len_bound = base.batch_size, base.max_len_bound


def _chain_logits(m, base, tokens, path, append):
    """Last-row logits of the chain pass of ``path`` (node indices) from the cache state ``base``."""
    _restore(m, base)
    return append(tokens[:, path].to(m.device))[:, -1]


def test_layout_of_a_small_tree():
    lay = trees.tree_layout(((-1, 0, 0, 1),), 4)
    assert lay.depth.tolist() == [[0, 1, 1, 2]] and lay.offset == 0
    assert lay.path.tolist() == [[[0, 0, 0, 0], [0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 3, 3]]]
    grown = trees.tree_layout(((-1, 0, 0, 1, 2),), 2)     # a draft model's second depth: nodes 3, 4
    assert grown.offset == 3 and grown.depth.tolist() == [[2, 2]]
    assert grown.path.tolist() == [[[0, 1, 3], [0, 2, 4]]]


def test_tree_pass_equals_each_path_as_a_chain_torch():
    m, tokens = _model()
    base = copy.deepcopy(m.cache)
    lengths = m.lengths.clone()
    logits = m.append_tree(tokens, [TREE, TREE])                                    # [B, T, V]
    assert torch.equal(m.lengths, lengths + len(TREE))
    for n, path in enumerate(trees.depths_and_paths(TREE)):
        chain = _chain_logits(m, base, tokens, path, m.append)
        torch.testing.assert_close(logits[:, n], chain, rtol=1e-5, atol=1e-5)


def _chain_attention(q, k, v, root, path, scale):
    """The chain kernel's output for the last node of ``path`` (node offsets from each row's root slot), that path's
    K/V laid out as a chain at slots R, R + 1, ... of a copy of the cache: q [B*T, H, D] -> [B, H*D]."""
    B, KV, _, D = k.shape
    kc, vc, idx = k.clone(), v.clone(), torch.tensor(path, device=k.device)
    for b, R in enumerate(root.tolist()):
        kc[b, :, R:R + len(path)], vc[b, :, R:R + len(path)] = k[b, :, R + idx], v[b, :, R + idx]
    qc = q.view(B, q.shape[0] // B, -1, D)[:, idx].reshape(-1, q.shape[1], D).contiguous()
    return ops.decode_attention(qc, kc, vc, root, len(path), scale).view(B, len(path), -1)[:, -1]


@pytest.mark.skipif(not ops.AVAILABLE or os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter run")
@pytest.mark.parametrize("G, parents", [(1, (-1, 0, 1, 2)), (3, TREE)])
@pytest.mark.parametrize("padded", [False, True])
def test_tree_attention_kernel_reads_each_path_as_the_chain_kernel(G, parents, padded):
    """Each node's attention output equals the chain kernel's over its path laid out at slots R, R + 1, ...; bit
    for bit where the node's query rows sit in the same lanes of their tiles in both (G = 1 packed and a
    chain-shaped tree: numpy's BLAS under the interpreter rounds by lane, an MMA does not), else within 1e-6. G = 3
    packed puts tokens across tile boundaries; padded gives each token a tile of its own."""
    from verispec.runtime.tree_attention import tree_attention

    torch.manual_seed(0)
    B, KV, D, S = 2, 2, 16, 320
    k, v = torch.randn(B, KV, S, D), torch.randn(B, KV, S, D)
    root = torch.tensor([30, 250])          # the second tree straddles a key block and the split at slot 256
    T = len(parents)
    lay = trees.tree_layout((parents, parents), T)
    q = torch.randn(B * T, KV * G, D)
    rows = ops.ATTN_BLOCK_M if padded else G
    o = tree_attention(q, k, v, root, lay.depth, lay.path, 0.25, token_rows=rows).view(B, T, -1)
    for programs in (1, 2):          # programs walking the live splits: the same partials, the same bits
        again = tree_attention(q, k, v, root, lay.depth, lay.path, 0.25, programs, token_rows=rows)
        assert torch.equal(again.view(B, T, -1), o)
    exact = G == 1 and parents == tuple(range(-1, T - 1)) and not padded
    for n, path in enumerate(trees.depths_and_paths(parents)):
        chain = _chain_attention(q, k, v, root, path, 0.25)
        if exact and n == T - 1:                       # the chain's last token: the same lanes, the same bits
            assert torch.equal(o[:, n], chain)
        torch.testing.assert_close(o[:, n], chain, rtol=1e-6, atol=1e-6)


def test_tree_attention_tiles(monkeypatch):
    """A token's rows in the split kernel's tiles: padded to whole tiles while the padded grid is small, packed
    beyond; the tokens one tile can touch; a layout that is neither is refused by name."""
    from verispec.runtime import tree_attention as tree_attention_module
    from verispec.runtime.tree_attention import tile_tokens, tree_attention, tree_tile_rows

    cpu = torch.device("cpu")
    assert tree_tile_rows(4, 1, cpu) == ops.ATTN_BLOCK_M          # a CPU counts as one SM
    assert tree_tile_rows(4, 2, cpu) == 4
    assert tree_tile_rows(20, 1, cpu) == 2 * ops.ATTN_BLOCK_M
    assert [tile_tokens(r) for r in (1, 4, 3, 5, 16, 32)] == [16, 4, 7, 5, 1, 1]
    lay = trees.tree_layout(((-1, 0),), 2)
    q, kv = torch.zeros(2, 4, 16), torch.zeros(1, 1, 64, 16)
    with pytest.raises(ValueError, match="token_rows must be 4"):
        tree_attention(q, kv, kv, torch.tensor([3]), lay.depth, lay.path, 1.0, token_rows=8)
    monkeypatch.setattr(tree_attention_module, "TILES", "paded")
    with pytest.raises(ValueError, match="TILES must be one of"):
        tree_tile_rows(4, 1, cpu)


@pytest.mark.skipif(not ops.AVAILABLE or os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter run")
def test_kernels_tree_pass_matches_the_torch_tree_pass():
    """The kernels path of a tree pass (RoPE at tree positions with K/V at the pass's slots, the tree attention)
    against the torch path: logits and the K/V it writes (fp32, interpreter)."""
    cfg = CFG.replace(num_layers=1)
    parents = (-1, 0, 0, 1)
    m, tokens = _model(cfg=cfg)
    tokens = tokens[:, :len(parents)]
    lay = trees.tree_layout((parents, parents), len(parents))
    out = {}
    for name, fn in (("torch", trees.tree_pass_torch), ("kernels", trees.tree_pass_kernels)):
        cache = copy.deepcopy(m.cache)
        L = cache.lengths.clone()
        out[name] = (fn(m.net, tokens, lay.depth, lay.path, L, L, m._rope, cache, 1), cache)
    torch.testing.assert_close(out["kernels"][0], out["torch"][0], rtol=1e-4, atol=1e-4)
    ct, ck = out["torch"][1], out["kernels"][1]
    for b, n in enumerate((ct.lengths + len(parents)).tolist()):
        torch.testing.assert_close(ck.k[0][b, :, :n], ct.k[0][b, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ck.v[0][b, :, :n], ct.v[0][b, :, :n], rtol=1e-5, atol=1e-5)


def test_accept_path_moves_exactly_the_accepted_entries():
    """Against a reference gather: slot R + t takes node path[t - 1]'s K/V for t <= num_accepted, every other
    slot below the new length is untouched, lengths = R + 1 + num_accepted."""
    m, tokens = _model()
    m.append_tree(tokens, [TREE, TREE])
    before = [(k.clone(), v.clone()) for k, v in zip(m.cache.k, m.cache.v)]
    roots = (m.lengths - len(TREE)).tolist()
    path = torch.tensor([[3, 6, 7], [2, 5, 0]])             # node offsets from the root; row 1 accepts 2
    num_accepted = torch.tensor([3, 2])
    m.accept_tree_path(path, num_accepted, len(TREE))
    assert m.lengths.tolist() == [r + 1 + a for r, a in zip(roots, num_accepted.tolist())]
    for (k0, v0), k1, v1 in zip(before, m.cache.k, m.cache.v):
        for b, R in enumerate(roots):
            want_k, want_v = k0[b].clone(), v0[b].clone()
            for t in range(1, int(num_accepted[b]) + 1):
                src = R + int(path[b, t - 1])
                want_k[:, R + t], want_v[:, R + t] = k0[b, :, src], v0[b, :, src]
            n = R + 1 + int(num_accepted[b])
            assert torch.equal(k1[b, :, :n], want_k[:, :n]) and torch.equal(v1[b, :, :n], want_v[:, :n])


def test_after_accepting_a_path_the_next_pass_sees_the_chain():
    m, tokens = _model()
    base = copy.deepcopy(m.cache)
    m.append_tree(tokens, [TREE, TREE])
    m.accept_tree_path(torch.tensor([[1, 3, 6], [2, 5, 0]]), torch.tensor([3, 2]), len(TREE))
    nxt = torch.tensor([[7], [11]])
    after_tree = m.append(nxt)[:, 0]
    for b, path in enumerate(([0, 1, 3, 6], [0, 2, 5])):
        _restore(m, base)
        m.cache.keep([b])
        m.append(tokens[b:b + 1, path])
        torch.testing.assert_close(m.append(nxt[b:b + 1])[0, 0], after_tree[b], rtol=1e-5, atol=1e-5)


def test_bad_trees_are_refused_with_their_reason():
    m, tokens = _model()
    with pytest.raises(ValueError, match="node 0 is its root"):
        m.append_tree(tokens[:, :2], [(0, 0), (-1, 0)])
    with pytest.raises(ValueError, match="must be an earlier node"):
        m.append_tree(tokens[:, :3], [(-1, 2, 0), (-1, 0, 0)])
    with pytest.raises(ValueError, match="same number of nodes"):
        m.append_tree(tokens[:, :2], [(-1, 0), (-1, 0, 0)])
    with pytest.raises(ValueError, match="2 trees for a batch of 1|tokens must be"):
        m.cache.keep([0])
        m.append_tree(tokens[:1, :2], [(-1, 0), (-1, 0)])
    with pytest.raises(ValueError, match="1..64 tokens"):
        trees.tree_width(65)
    with pytest.raises(ValueError, match="path must be"):
        m.accept_tree_path(torch.zeros(2, 3, dtype=torch.long), torch.zeros(1, dtype=torch.long), 4)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (the batch-invariant kernels)")
@pytest.mark.parametrize("use_graphs", [False, True])
def test_gpu_bf16_tree_pass_is_bit_equal_to_each_path_as_a_chain(use_graphs):
    """The kernels path in bf16 (real head sizes, a cache long enough for several splits): every node's logits
    are the bits of the chain pass of its root-to-node path, eager and in the CUDA graphs."""
    cfg = ModelConfig(vocab_size=1000, num_layers=2, hidden_size=512, num_heads=16, num_kv_heads=4, head_dim=128,
                      intermediate_size=1024, rope_theta=500000.0)
    m, tokens = _model("cuda", torch.bfloat16, lens=(700, 3, 250), cap=1024, use_graphs=use_graphs, cfg=cfg)
    base = copy.deepcopy(m.cache)
    logits = m.append_tree(tokens.cuda(), [TREE] * 3)
    for n, path in enumerate(trees.depths_and_paths(TREE)):
        chain = _chain_logits(m, base, tokens, path, m.append)
        assert torch.equal(logits[:, n], chain), f"node {n} (path {path})"


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (the MMA's bits do not depend on the lane)")
def test_gpu_tree_attention_layouts_are_the_chain_kernels_bits():
    """bf16 on the GPU, 8B heads (G = 4, D = 128): packed tiles and padded tiles give every node the bits of the
    chain kernel over its root-to-node path, in splits before, across and after the split boundary."""
    from verispec.runtime.tree_attention import tree_attention

    torch.manual_seed(0)
    B, KV, G, D, S = 3, 8, 4, 128, 1024
    k = torch.randn(B, KV, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    root = torch.tensor([5, 250, 700], device="cuda")
    T = len(TREE)
    lay = trees.tree_layout((TREE,) * B, T)
    depth, path = lay.depth.cuda(), lay.path.cuda()
    q = torch.randn(B * T, KV * G, D, device="cuda", dtype=torch.bfloat16)
    outs = [tree_attention(q, k, v, root, depth, path, 0.125, token_rows=r).view(B, T, -1) for r in (G, 16)]
    assert torch.equal(outs[0], outs[1])
    for n, p in enumerate(trees.depths_and_paths(TREE)):
        chain = _chain_attention(q, k, v, root, p, 0.125)
        assert torch.equal(outs[0][:, n], chain), f"node {n} (path {p})"


@pytest.mark.skipif(not ops.AVAILABLE or os.environ.get("TRITON_INTERPRET") != "1" and not GPU,
                    reason="needs triton (the interpreter or a GPU)")
def test_accept_path_kernel_equals_the_torch_moves():
    """The one-launch compaction (every layer's K and V from the buffer table) leaves the cache exactly as the
    torch gather/scatter does."""
    device = "cuda" if GPU else "cpu"
    m, tokens = _model(device)
    m.append_tree(tokens.to(device), [TREE, TREE])
    path = torch.tensor([[2, 5, 7], [1, 4, 0]], device=device)
    num_accepted = torch.tensor([3, 2], device=device)
    results = []
    for kernel in (False, True):
        cache = copy.deepcopy(m.cache)
        trees.accept_path(cache, 2, path, num_accepted, len(TREE), kernel=kernel)
        results.append(cache)
    torch_moves, one_launch = results
    assert torch.equal(torch_moves.lengths, one_launch.lengths)
    for a, b in zip(torch_moves.k + torch_moves.v, one_launch.k + one_launch.v):
        assert torch.equal(a, b)


@pytest.mark.skipif(not ops.AVAILABLE or os.environ.get("TRITON_INTERPRET") != "1" and not GPU,
                    reason="needs triton (the interpreter or a GPU)")
def test_warm_accept_path_moves_nothing():
    """The warm-up launch (one row, nothing accepted) leaves every K/V bit and every length as they were, with rows
    running: ``Model.warm_up_tree`` calls it while sequences run."""
    device = "cuda" if GPU else "cpu"
    m, tokens = _model(device)
    m.append_tree(tokens.to(device), [TREE, TREE])
    before = copy.deepcopy(m.cache)
    trees.warm_accept_path(m.cache, kernel=True)
    assert torch.equal(m.cache.lengths, before.lengths)
    for a, b in zip(m.cache.k + m.cache.v, before.k + before.v):
        assert torch.equal(a, b)


@pytest.mark.skipif(not GPU, reason="Triton compiles kernels only on a GPU")
def test_tree_rounds_of_any_depth_compile_nothing_after_the_warm_up():
    """After ``Model.warm_up_tree`` the compaction of a tree of any depth (a draft model's paths are one node shorter
    than the target's: depth 1 among them) compiles no kernel inside a round (one did, ~80 ms on the H200)."""
    import triton

    m, tokens = _model("cuda", torch.bfloat16, lens=(5, 40, 17))
    m.warm_up_tree(3, TREE, len(TREE))
    compiled = []
    hook, triton.knobs.runtime.jit_post_compile_hook = (triton.knobs.runtime.jit_post_compile_hook,
                                                        lambda **kw: compiled.append(kw["repr"]))
    try:
        for D in (1, 2, 3, 4, 5):
            path = torch.ones(3, D, dtype=torch.long, device="cuda")
            trees.accept_path(m.cache, 3, path, torch.zeros(3, dtype=torch.long, device="cuda"), 1)
        torch.cuda.synchronize()
    finally:
        triton.knobs.runtime.jit_post_compile_hook = hook
    assert compiled == []
