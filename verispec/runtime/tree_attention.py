"""Split-KV attention of a token-tree pass (``Model.append_tree``), batch-invariant like ``ops.decode_attention``.

In a tree pass the new tokens of a sequence sit in consecutive cache slots, but a token must see only the
committed prefix and its own ancestors, at the positions they would have in a chain. So the kernel reads the
cache through *virtual slots*: for the query row of token i (depth d_i, ancestors a_0 = root, a_1, ..., a_d = i,
as node offsets from the root's slot R):

    virtual slot v < R                -> physical slot v                (the prefix: shared by every row)
    virtual slot v = R + t, t <= d_i  -> physical slot R + a_t          (its root-to-node path)
    virtual slot v > R + d_i          -> masked

e.g. R = 10, tree root(0) -> {1, 2}, 2 -> {3}: token 3 (depth 2, path [0, 2, 3]) reads slots 0..9, 10, 12, 13 as
virtual slots 0..12, exactly what a chain pass of root, node 2, node 3 at slots 10..12 would read.

Why virtual slots rather than a mask over the physical ones: the chain kernel's result for a row depends on where
each key sits in its blocks (the online softmax meets blocks of BLOCK_N slots in order, splits of ATTN_SPLIT from
slot 0). Reading the path at the chain's slots puts every key in the block and the column a chain pass (and plain
decoding) would put it in, so the same products are summed in the same order. Blocks wholly below R are read
once per tile, as in ``ops._attn_split_kernel``. A block that reaches R is read token by token: the query rows are
token-major (row i * GR + g: the G heads of one token side by side; GR = G packs 16 / G tokens in a tile of 16 rows,
GR = G padded to 16 gives each token a tile of its own: ``tree_tile_rows`` picks), and for each token of the tile
one dot of the same [16, D] x [D, BLOCK_N] shape as the chain's runs on the tile with the other tokens' rows zeroed,
against that token's own keys; its result is kept for that token's rows (an MMA computes each output element from
its own row and column alone, so the zeroed rows and the row's lane change nothing). The values then go through the
chain's online-softmax update; the P V product likewise. A mixed block costs a dot per token of the tile for K and
again for V instead of one (packed, Llama-3 8B: G = 4, 4 each; padded: 1 each, as a chain's decode step, at the
price of reading the prefix once per token): at most two mixed blocks per split for trees of <= 64 nodes.
(Under the CPU interpreter numpy's BLAS rounds by lane, so there the bits match the chain kernel only where a row
keeps its lane; tests/test_tree_runtime.py checks both, and the bf16 GPU test checks every node.)

The splits' partial results are merged by the chain's combine (``ops._attn_combine``, same [rows] layout), and the
key blocks below the root and the online-softmax step are the chain kernel's own code (``ops._attn_block``,
``ops._attn_softmax_step``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import ops

if ops.AVAILABLE:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def _token_path(depth_ptr, path_ptr, b, T, P, R, token, i, row_ok, slots, smask):
        """Where one token of the tile reads a block that reaches the root: -> (mine [BLOCK_M] its query rows,
        phys [BLOCK_N] int64 the physical slot behind each virtual slot, ok [BLOCK_N] the virtual slots on its path
        or below the root). Called for the K and again for the V of the same block."""
        tok = tl.minimum(token, T - 1)
        mine = (i == token) & row_ok
        dep_j = tl.load(depth_ptr + b * T + tok).to(tl.int32)
        t = slots - R
        on_path = (t >= 0) & (t <= dep_j)
        node = tl.load(path_ptr + (b * T + tok).to(tl.int64) * P + tl.minimum(tl.maximum(t, 0), P - 1),
                       mask=on_path, other=0)
        phys = tl.where(slots < R, slots, R + node).to(tl.int64)
        ok = (slots <= R + dep_j) & smask
        return mine, phys, ok

    @triton.jit
    def _tree_attn_split_kernel(q_ptr, k_ptr, v_ptr, root_ptr, depth_ptr, path_ptr, acc_ptr, ml_ptr,
                                T, H, KV, NSPLIT, NPROG, ROWS, P, s_cb, s_ch, s_cs, scale_log2,
                                G: tl.constexpr, GR: tl.constexpr, TOKENS: tl.constexpr, D: tl.constexpr,
                                SPLIT: tl.constexpr,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
                                PDL: tl.constexpr):
        if PDL:                                        # see ops.use_pdl: start early, wait for the predecessor
            gdc_launch_dependents()
            gdc_wait()
        bk = tl.program_id(0)                          # b * KV + kv head
        prog = tl.program_id(1)                        # walks the live splits prog, prog + NPROG, ... (as ops')
        rt = tl.program_id(2)                          # tile of BLOCK_M query rows
        b = bk // KV
        kvh = bk % KV
        rows = rt * BLOCK_M + tl.arange(0, BLOCK_M)    # token-major: row r = i * GR + g (token i, query head g)
        g = rows % GR                                  # GR = G (packed) or G padded to whole tiles (tree_tile_rows)
        i = rows // GR
        row_ok = (g < G) & (i < T)
        i_safe = tl.where(row_ok, i, 0)
        R = tl.load(root_ptr + b).to(tl.int32)         # the root's slot: position of depth 0
        dep = tl.load(depth_ptr + b * T + i_safe).to(tl.int32)
        qpos = R + dep                                 # [BLOCK_M] position of each row's token
        offs_d = tl.arange(0, D)
        n_tok = (b * T + i_safe).to(tl.int64)
        nlive = tl.minimum((R + P + SPLIT - 1) // SPLIT, NSPLIT)   # splits with live (virtual) slots (ops' reasons)
        q = tl.load(q_ptr + ((n_tok * H + kvh * G + g) * D)[:, None] + offs_d[None, :],
                    mask=row_ok[:, None] & (prog < nlive), other=0.0)
        kbase = k_ptr + b.to(tl.int64) * s_cb + kvh.to(tl.int64) * s_ch
        vbase = v_ptr + b.to(tl.int64) * s_cb + kvh.to(tl.int64) * s_ch
        for sp in range(prog, nlive, NPROG):
            start = sp * SPLIT
            end = tl.minimum(start + SPLIT, R + P)     # virtual slots past every row's path are masked
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D], tl.float32)
            # blocks wholly below the root: the prefix, one shared key tile (the chain kernel's loop body)
            shared_end = tl.minimum(end, start + (tl.maximum(R - start, 0) // BLOCK_N) * BLOCK_N)
            for j0 in range(start, shared_end, BLOCK_N):
                m_i, l_i, acc = ops._attn_block(q, kbase, vbase, offs_d, j0, end, qpos, s_cs, scale_log2, m_i, l_i,
                                                acc, BLOCK_N, PREC)
            # blocks that reach the tree: the tile's rows of one token at a time read that token's path (see the
            # module docstring); the other rows of the dot are zeros and its result is kept for that token's rows
            first = (rt * BLOCK_M) // GR               # the tile's first token; TOKENS covers the rest
            for j0 in range(shared_end, end, BLOCK_N):
                slots = j0 + tl.arange(0, BLOCK_N)
                smask = slots < end
                s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for j in tl.static_range(TOKENS):
                    mine, phys, ok_j = _token_path(depth_ptr, path_ptr, b, T, P, R, first + j, i, row_ok, slots,
                                                   smask)
                    k_j = tl.load(kbase + phys[:, None] * s_cs + offs_d[None, :], mask=ok_j[:, None], other=0.0)
                    q_j = tl.where(mine[:, None], q, tl.zeros_like(q))                  # keeps q's dtype
                    s = tl.where(mine[:, None], tl.dot(q_j, tl.trans(k_j), input_precision=PREC), s)
                pr, alpha, m_new, l_i = ops._attn_softmax_step(s * scale_log2, slots, smask, qpos, m_i, l_i)
                scaled = acc * alpha[:, None]
                for j in tl.static_range(TOKENS):
                    mine, phys, ok_j = _token_path(depth_ptr, path_ptr, b, T, P, R, first + j, i, row_ok, slots,
                                                   smask)
                    v_j = tl.load(vbase + phys[:, None] * s_cs + offs_d[None, :], mask=ok_j[:, None], other=0.0)
                    pr_j = tl.where(mine[:, None], pr, 0.0).to(v_j.dtype)
                    acc = tl.where(mine[:, None], scaled + tl.dot(pr_j, v_j, input_precision=PREC), acc)
                m_i = m_new
            # partials in the chain kernel's row layout (g * T + i), which ops._attn_combine_kernel reads
            part = (bk * NSPLIT + sp).to(tl.int64) * ROWS + g * T + i_safe
            tl.store(acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None])
            tl.store(ml_ptr + part * 2, m_i, mask=row_ok)
            tl.store(ml_ptr + part * 2 + 1, l_i, mask=row_ok)


TILES = "auto"   # tree_tile_rows: "auto", or "packed" / "padded" everywhere (benchmarks/trees.py times both)
TILE_LAYOUTS = ("auto", "packed", "padded")


def padded_token_rows(G: int) -> int:
    """A token's G query rows padded to whole tiles of ATTN_BLOCK_M: the padded layout's rows per token."""
    return -(-G // ops.ATTN_BLOCK_M) * ops.ATTN_BLOCK_M


def tree_tile_rows(G: int, groups: int, device: torch.device) -> int:
    """Query rows a token takes in the split kernel's tiles (its ``GR``): G packed (ATTN_BLOCK_M / G tokens a tile),
    or G padded to whole tiles (one token a tile: a block that reaches the root costs one dot for K and one for V, as
    in a chain's decode step, but every token's program reads the prefix). Padded while ``groups`` = sequences x KV
    heads x tokens is at most the SM count (a latency-bound pass: one sequence of a few nodes), packed beyond: on an
    H200 padded was 1.5-1.6x faster for 1 sequence of 3-13 nodes at 200 cached tokens and up to 1.25x slower for 17
    nodes at 512-1500 or 8 sequences of 3-7 nodes at 1500 (benchmarks/results/trees.md, "The tree attention"). The
    choice changes no result: each output element of a dot comes from its own row and column (module docstring)."""
    if TILES not in TILE_LAYOUTS:
        raise ValueError(f"tree_attention.TILES must be one of {TILE_LAYOUTS}, got {TILES!r}")
    padded = padded_token_rows(G)
    if TILES != "auto":
        return padded if TILES == "padded" else G
    sms = ops.sm_count(device) if device.type == "cuda" else 1
    return padded if groups <= sms else G


def tile_tokens(GR: int) -> int:
    """The most tokens one tile of ATTN_BLOCK_M rows touches when a token takes GR rows (the kernel's TOKENS is this
    or the pass's T, whichever is smaller: a tile never holds more tokens than the pass has)."""
    m = ops.ATTN_BLOCK_M
    if m % GR == 0:
        return m // GR
    if GR % m == 0:
        return 1
    return (m - 1) // GR + 2


def tree_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, root: Tensor, depth: Tensor, path: Tensor,
                   scale: float, programs: int | None = None, token_rows: int | None = None) -> Tensor:
    """q [N=B*T, H, D] (the pass's tokens, their K/V already in the cache), root [B] int64 (each sequence's root
    slot), depth [B, T] int64, path [B, T, P] int64 (node offsets from the root of each token's root-to-token path,
    root first; entries past the token's depth are not read) -> o [N, H*D]: softmax(q K^T * scale) V over the
    prefix slots < root and the token's path. Same blocks and splits as ``ops.decode_attention``.
    ``token_rows``: the tiles' rows a token takes (G or G padded to a multiple of ATTN_BLOCK_M; default
    ``tree_tile_rows``'s choice): the grid only, never the result."""
    N, H, D = q.shape
    B, T = depth.shape
    P = path.shape[2]
    KV, S = k_cache.shape[1], k_cache.shape[2]
    G = H // KV
    assert N == B * T and q.is_contiguous() and depth.is_contiguous() and path.is_contiguous()
    assert k_cache.stride(3) == 1 and k_cache.stride() == v_cache.stride()
    assert D == ops._pow2(D) and D >= 16, "head_dim must be a power of two >= 16"
    GR = tree_tile_rows(G, B * KV * T, q.device) if token_rows is None else token_rows
    if GR != G and GR % ops.ATTN_BLOCK_M or GR < G:
        raise ValueError(f"tree_attention: token_rows must be {G} (packed) or a multiple of {ops.ATTN_BLOCK_M} "
                         f">= {G}, got {GR}")
    fp32 = q.dtype == torch.float32
    nsplit, _, rows, acc, ml = ops._attn_partials(q, B, KV, G, T, S)
    tiles = -(-(GR * T) // ops.ATTN_BLOCK_M)
    nprog = ops.split_programs(nsplit, B * KV * tiles, q.device, programs)
    _tree_attn_split_kernel[(B * KV, nprog, tiles)](
        q, k_cache, v_cache, root, depth, path, acc, ml, T, H, KV, nsplit, nprog, rows, P,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), scale * 1.4426950408889634,
        G=G, GR=GR, TOKENS=min(tile_tokens(GR), T), D=D, SPLIT=ops.ATTN_SPLIT, BLOCK_M=ops.ATTN_BLOCK_M,
        BLOCK_N=ops.attention_block_n(q.dtype, D),
        PREC="ieee" if fp32 else "tf32", num_warps=4, **ops._launch_options(q.device))
    return ops._attn_combine(q, acc, ml, B, T, KV, G, nsplit, rows, root, P)
