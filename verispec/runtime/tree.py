"""Token trees in the target pass: the layout of a tree pass, the pass itself (torch and kernels), and the
accepted path's KV compaction.

A tree is given per sequence by ``parents``: node 0 is the root (the round's certain token, parent -1) and every
other node's parent comes before it. Its nodes occupy consecutive cache slots from the root's slot R: node n at
slot R + n. A node at depth d (the root has depth 0) sits at *position* R + d, the position it would have in a
chain, and attends to the committed prefix (slots < R) and to its own root-to-node path only.

A pass appends the *last* T nodes of the tree (``Model.append_tree``): the target scores a whole tree in one pass
(T = all nodes, the root included); a draft model grows its tree one depth per pass, the earlier nodes already in
its cache. The pass's token i is node n = N - T + i of an N-node tree, at slot lengths[b] + i, and the root's slot
is R = lengths[b] - (N - T).

    e.g. parents [-1, 0, 0, 1] (the root, two children, a grandchild under node 1), T = N = 4, lengths = [7]:
         slots 7, 8, 9, 10; depths [0, 1, 1, 2]; positions 7, 8, 8, 9;
         node 3 sees slots 0..6, 7 (the root), 8 (node 1) and itself (10) -- not its uncle at slot 9.

The layout on the device (``TreeLayout``), per pass token: its depth [B, T] and its path [B, T, P]: the node
offsets from the root of its ancestors, root first, itself at index depth (entries past the depth repeat the
node itself, so that a scatter of the path is harmless). After verification, ``accept_path`` moves the accepted
path's K/V to the chain slots R + 1, R + 2, ... and sets the lengths: the rejected nodes' slots are dead, and
the next pass overwrites them.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from . import ops
from .quant import packed
from .transformer import _write_hidden

# Tokens of one tree pass at most (the root and 63 nodes): the kernels' path table and the padding slots of the
# CUDA graph buckets are sized for it.
MAX_TREE_TOKENS = 64
# The token widths of the captured tree passes: a pass of T tokens replays the graph of the smallest width >= T,
# its extra tokens are padding nodes (children of the root, their logits dropped, their K/V in dead slots).
# Gaps of at most 16 padding tokens (<= cache.PAD_SLOTS).
TREE_WIDTHS = (1, 2, 3, 5, 9, 17, 25, 33, 49, 64)


def tree_width(num_tokens: int) -> int:
    """The graph width of a tree pass of ``num_tokens`` tokens: the smallest of TREE_WIDTHS >= it."""
    if not 1 <= num_tokens <= MAX_TREE_TOKENS:
        raise ValueError(f"a tree pass takes 1..{MAX_TREE_TOKENS} tokens per sequence, got {num_tokens}")
    return next(w for w in TREE_WIDTHS if w >= num_tokens)


def check_parents(parents: tuple[int, ...]) -> None:
    """One sequence's tree: parents[0] = -1 (the root), 0 <= parents[n] < n for n >= 1."""
    if not parents or parents[0] != -1:
        raise ValueError(f"a tree's node 0 is its root (parent -1), got parents {list(parents)[:8]}")
    for n, p in enumerate(parents[1:], start=1):
        if not 0 <= p < n:
            raise ValueError(f"tree node {n}: parent {p} must be an earlier node (0 <= parent < {n}); node 0 is "
                             f"the root")


def depths_and_paths(parents: tuple[int, ...]) -> list[list[int]]:
    """Each node's root-to-node path (root first, the node last): len(path) - 1 is its depth.
    e.g. [-1, 0, 0, 1] -> [[0], [0, 1], [0, 2], [0, 1, 3]]."""
    paths: list[list[int]] = []
    for n, p in enumerate(parents):
        paths.append([0] if p < 0 else paths[p] + [n])
    return paths


@dataclass(frozen=True, eq=False)   # hashed by identity: tree_layout caches one object per shape
class TreeLayout:
    """The host description of one tree pass (cached by tree shape: an engine repeats a few shapes).

    depth:  [B, T] int64, the pass tokens' depths
    path:   [B, T, P] int64, their root-to-token paths as node offsets from the root (see the module docstring)
    offset: N - T, the tree's nodes already in the cache before this pass (the root's slot is lengths - offset)
    """

    depth: Tensor
    path: Tensor
    offset: int

    def packed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] (host) -> the pass's whole input as ONE int64 tensor [B, T * (2 + P)]:
        tokens | depth | path (one host -> device copy, and a CUDA graph's static input)."""
        B = tokens.shape[0]
        return torch.cat([tokens.to(torch.long), self.depth, self.path.reshape(B, -1)], dim=1)


@functools.lru_cache(maxsize=512)
def tree_layout(parents: tuple[tuple[int, ...], ...], num_tokens: int, path_width: int | None = None) -> TreeLayout:
    """The layout of a pass that appends the last ``num_tokens`` nodes of each sequence's tree
    (``parents[b]``: all N nodes so far, equal N for every sequence). ``path_width`` P: at least the deepest
    path's node count (default: that or ``num_tokens``, whichever is larger, so that a target pass's table has one
    shape per width)."""
    sizes = {len(p) for p in parents}
    if len(sizes) != 1:
        raise ValueError(f"every sequence's tree must have the same number of nodes (pad with children of the root), "
                         f"got {sorted(sizes)}")
    N = sizes.pop()
    if not 1 <= num_tokens <= N:
        raise ValueError(f"a tree pass appends 1..{N} of the tree's {N} nodes, got {num_tokens}")
    paths = []
    for p in parents:
        check_parents(p)
        paths.append(depths_and_paths(p)[N - num_tokens:])
    deepest = max(len(x) for row in paths for x in row)
    P = max(deepest, num_tokens) if path_width is None else path_width
    if P < deepest:
        raise ValueError(f"path_width {P} < the deepest path's {deepest} nodes")
    depth = torch.tensor([[len(x) - 1 for x in row] for row in paths], dtype=torch.long)
    path = torch.tensor([[x + [x[-1]] * (P - len(x)) for x in row] for row in paths], dtype=torch.long)
    return TreeLayout(depth, path, N - num_tokens)


def unpack(buf: Tensor, T: int) -> tuple[Tensor, Tensor, Tensor]:
    """``TreeLayout.packed``'s tensor [R, T * (2 + P)] (any device) -> tokens [R, T], depth [R, T], path
    [R, T, P] (contiguous)."""
    R = buf.shape[0]
    P = buf.shape[1] // T - 2
    return buf[:, :T].contiguous(), buf[:, T:2 * T].contiguous(), buf[:, 2 * T:].reshape(R, T, P).contiguous()


# --------------------------------------------------------------------------------------------- the pass
def tree_pass(net, tokens: Tensor, depth: Tensor, path: Tensor, root: Tensor, lengths: Tensor, rope: Tensor,
              cache, num_layers: int, hidden: Tensor | None = None, hidden_layers: tuple[int, ...] = ()) -> Tensor:
    """The tree pass of ``net`` (a ``Transformer``): tokens, depth [B, T], path [B, T, P], root [B] (the root's
    slot), lengths [B] (token i's slot is lengths + i) -> logits [B, T, V]. Does not advance lengths. On CUDA
    through the kernels (``tree_pass_kernels``), elsewhere in torch (``tree_pass_torch``). ``hidden`` [B*T, C, E]:
    the outputs of ``hidden_layers`` for every token, rows in (b, i) order, as a chain pass writes them
    (transformer.py's module docstring; a feature head reads the accepted nodes' states)."""
    if net.use_kernels and tokens.is_cuda:
        return tree_pass_kernels(net, tokens, depth, path, root, lengths, rope, cache, num_layers, hidden,
                                 hidden_layers)
    return tree_pass_torch(net, tokens, depth, path, root, lengths, rope, cache, num_layers, hidden, hidden_layers)


def tree_pass_torch(net, tokens: Tensor, depth: Tensor, path: Tensor, root: Tensor, lengths: Tensor, rope: Tensor,
                    cache, num_layers: int, hidden: Tensor | None = None,
                    hidden_layers: tuple[int, ...] = ()) -> Tensor:
    """``tree_pass`` in plain torch, as ``Transformer._append_torch`` (the same ``layer_torch`` per layer) with a
    tree mask: SDPA over the whole static cache, slot j allowed for token i when j < root or j = root + path[i, t]."""
    B, T = tokens.shape
    H, KV = net.cfg.num_heads, net.cfg.num_kv_heads
    G, S = H // KV, cache.k[0].shape[2]
    dev = tokens.device
    pos = root[:, None] + depth                                                    # [B, T] positions
    slots = lengths[:, None] + torch.arange(T, device=dev)                         # [B, T] cache slots
    mask = (torch.arange(S, device=dev)[None, None, :] < root[:, None, None]).expand(B, T, S).clone()  # [B, T, S]
    mask.scatter_(2, root[:, None, None] + path, True)                             # + the root-to-token path
    mask = mask[:, None].expand(B, G, T, S).reshape(B, 1, G * T, S)                # query rows (g, i) -> g*T + i
    rope = rope[pos.view(-1)]                                                      # [N, 2, D]
    batch = torch.arange(B, device=dev)[:, None]
    x = packed.embedding(tokens.reshape(-1), net.embed)                            # [N, E]
    for i in range(num_layers):
        x = net.layer_torch(i, x, rope, cache, batch, slots, mask)
        _write_hidden(hidden, hidden_layers, i, x)
    return net.logits(x).view(B, T, -1)


def tree_pass_kernels(net, tokens: Tensor, depth: Tensor, path: Tensor, root: Tensor, lengths: Tensor,
                      rope: Tensor, cache, num_layers: int, hidden: Tensor | None = None,
                      hidden_layers: tuple[int, ...] = ()) -> Tensor:
    """``tree_pass`` through the kernels of ``Transformer.append_kernels``, its layers ``Transformer.layer_kernels``
    (batch-invariant matmuls, norms, SwiGLU); RoPE at the tree positions with K/V written at the pass's slots, and
    the tree attention (``tree_attention.tree_attention``). A node's logits are the bits a chain pass of its
    root-to-node path gives."""
    from .tree_attention import tree_attention

    B, T = tokens.shape
    c = net.cfg
    H, KV, D, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
    pos = (root[:, None] + depth).view(-1)                                                 # [N]
    slots = (lengths[:, None] + torch.arange(T, device=tokens.device)).view(-1)            # [N]
    x = packed.embedding(tokens.reshape(-1), net.embed)                                    # [N, E]
    delta = None
    scale = 1.0 / math.sqrt(D)
    how = dict(invariant=True, batch_size=B, config=ops.gemv_config(c.hidden_size))

    def attend(i: int, qkv: Tensor) -> Tensor:
        q = ops.rope_kv_write(qkv, rope, pos, cache.k[i], cache.v[i], T, H, KV, D, slots=slots)
        return tree_attention(q, cache.k[i], cache.v[i], root, depth, path, scale)      # [N, H*D]

    for i in range(num_layers):
        x, delta = net.layer_kernels(i, x, delta, how, attend, hidden, hidden_layers)
    x, h = ops.add_rmsnorm(x, delta, net.norm, eps)
    _write_hidden(hidden, hidden_layers, num_layers - 1, x)
    return ops.linear(h, net.lm_head_weight, None, **how).view(B, T, -1)


# ------------------------------------------------------------------------------------------ compaction
if ops.AVAILABLE:
    import triton
    import triton.language as tl

    # D (the path's depth) is not specialized on: a draft model's paths are one node shorter than the target's, so
    # depth 1 (a tree of depth 2) and depths >= 2 would be two compilations, the second inside the first deeper
    # round (about 80 ms on the H200); ``warm_accept_path`` compiles the one there is before the rounds
    @triton.jit(do_not_specialize=["D"])
    def _accept_path_kernel(table_ptr, root_ptr, path_ptr, num_accepted_ptr, D, s_cb, s_ch, s_cs,
                            HEAD_DIM: tl.constexpr, WORD: tl.constexpr):
        # program (buffer, row, kv head): the row's accepted nodes, one depth at a time in increasing order. Move t
        # reads slot R + path[t - 1] >= R + t and earlier moves wrote slots R + 1 .. R + t - 1 < R + t: no move
        # reads what another wrote.
        buf = tl.load(table_ptr + tl.program_id(0)).to(tl.pointer_type(WORD))   # every K/V buffer of every layer
        b = tl.program_id(1).to(tl.int64)
        h = tl.program_id(2).to(tl.int64)
        R = tl.load(root_ptr + b)
        a = tl.load(num_accepted_ptr + b)
        base = buf + b * s_cb + h * s_ch
        offs = tl.arange(0, HEAD_DIM)
        for t in range(1, a + 1):
            node = tl.load(path_ptr + b * D + t - 1)
            tl.store(base + (R + t) * s_cs + offs, tl.load(base + (R + node) * s_cs + offs))


def _buffer_table(cache) -> Tensor:
    """[2 * layers] int64 on the cache's device: the data pointers of every K and V buffer (they never move: the
    cache's invariant), built once per cache; keyed by the buffers' own addresses, so a copy of the cache object
    (which holds other buffers) builds its own."""
    ptrs = tuple(buf.data_ptr() for buf in cache.k + cache.v)
    held = getattr(cache, "_tree_buffer_table", None)
    if held is None or held[0] != ptrs:
        held = (ptrs, torch.tensor(ptrs, dtype=torch.int64).to(cache.k[0].device))
        cache._tree_buffer_table = held
    return held[1]


def accept_path(cache, rows: int, path: Tensor, num_accepted: Tensor, tree_size: int,
                kernel: bool | None = None) -> None:
    """Keep each sequence's accepted root-to-node path as a chain: node path[b, t - 1] moves from slot R + node to
    slot R + t (t = 1..num_accepted[b]), then lengths = R + 1 + num_accepted, where R = lengths - tree_size is the
    root's slot. Device values only (no sync; capturable once the buffer table exists).

    path: [rows, D] int64, node offsets from the root (verification's path + 1), entries past num_accepted[b]
          ignored; num_accepted: [rows] int64 (0..D). e.g. R = 7, path [2, 3], num_accepted 2: slot 9 -> 8,
          slot 10 -> 9, lengths 10.
    ``kernel`` (default: on CUDA): ONE launch moves every layer's K and V (``_accept_path_kernel``, grid
    (2 * layers, rows, KV heads), the buffers' addresses from a table, bits copied as words); else one gather and
    one scatter per buffer, every row at once (the gather reads every source before any write)."""
    lengths = cache.lengths_for(rows)
    D = path.shape[1]
    root = (lengths - tree_size).clamp_(min=0)                                   # padding rows: length 0
    if kernel is None:
        kernel = path.is_cuda and _kernel_fits(cache)
    if kernel and D and rows:
        _launch_accept_path(cache, rows, root, path, num_accepted)
    elif D:
        t = torch.arange(1, D + 1, device=path.device)                          # [D] depths
        take = t[None, :] <= num_accepted[:, None]                               # [rows, D]
        dst = root[:, None] + t[None, :]                                          # [rows, D] chain slots
        src = root[:, None] + torch.where(take, path, t[None, :])                # not taken: stays in place
        batch = torch.arange(rows, device=path.device)[:, None]
        for buf in cache.k + cache.v:
            buf[batch, :, dst] = buf[batch, :, src]
    torch.minimum(lengths, root + 1 + num_accepted, out=lengths)


def _kernel_fits(cache) -> bool:
    """Whether the one-launch compaction serves this cache (Triton there, and a power-of-two head size)."""
    head_dim = cache.k[0].shape[3]
    return ops.AVAILABLE and head_dim == ops._pow2(head_dim)


def _launch_accept_path(cache, rows: int, root: Tensor, path: Tensor, num_accepted: Tensor) -> None:
    """``_accept_path_kernel`` over ``rows`` rows: root [rows], path [rows, D], num_accepted [rows] int64."""
    k0 = cache.k[0]
    word = {2: tl.int16, 4: tl.int32}[k0.element_size()]
    _accept_path_kernel[(2 * len(cache.k), rows, k0.shape[1])](
        _buffer_table(cache), root, path.contiguous(), num_accepted, path.shape[1], k0.stride(0), k0.stride(1),
        k0.stride(2), HEAD_DIM=k0.shape[3], WORD=word, num_warps=1)


def warm_accept_path(cache, kernel: bool | None = None) -> None:
    """Compile ``accept_path``'s kernel for this cache before the first tree round (``Model.warm_up_tree``): one launch
    over one row that accepted nothing, so it moves nothing and leaves every length as it was (safe while sequences
    run). ``kernel`` as in ``accept_path`` (default: on CUDA); without the kernel there is nothing to compile."""
    if kernel is None:
        kernel = cache.k[0].is_cuda
    if not (kernel and _kernel_fits(cache)):
        return
    device = cache.k[0].device
    # three tensors of their own: Triton also specializes on each pointer's 16-byte alignment, as a round's are
    root, path, accepted = (torch.zeros(shape, dtype=torch.long, device=device) for shape in ((1,), (1, 2), (1,)))
    _launch_accept_path(cache, 1, root, path, accepted)
