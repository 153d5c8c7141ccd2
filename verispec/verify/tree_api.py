"""Public tree-verification API: validation of the tree layout, backend dispatch.

    verify_tree_greedy(target_logits, draft_tokens, parents, num_nodes)              -> TreeVerifyOutput
    verify_tree_sample(target_logits, draft_tokens, parents, num_nodes, draft_probs) -> TreeVerifyOutput

Layout and semantics: ``verispec.verify.tree_reference`` (the oracle); the maths: docs/verification.md, "Trees".
A chain (parents = [-1, 0, 1, ...]) gives exactly ``verify_greedy`` / ``verify_sample``'s result.

The tree's shape (``num_nodes`` and ``parents``) is host metadata, like a host ``num_draft``: it is checked on
the host (parents in range and before their children, counts matching the tensors), which also gives the
output width D + 1 (D = the deepest node). Lists, tuples and CPU tensors cost no device read, and a shape seen
before is looked up, not checked again (an engine's rounds repeat a few tree shapes); tensors on an accelerator
are read back once (a sync). Everything else is validated as in ``verispec.verify.api``: metadata on the host,
values (NaN / +inf / all -inf rows, draft ids, q rows, tensor settings) in the status word the kernels write in
their own read, raised by the default ``check_values=True``.

Backends: ``"torch"`` (the reference) and ``"triton"`` (``verispec.verify.triton.tree``; it also runs on CPU
tensors under ``TRITON_INTERPRET=1``). ``backend=None``: the reference on a CPU, Triton on a GPU (no
measured table for trees yet). There are no CUDA C++ tree kernels: ``backend="cuda"`` is a ValueError.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch

from .api import (_FLOAT_DTYPES, VerifyBatch, _checked, _checked_draft_probs, _seed_and_offset, canonical_batch,
                  per_sequence)
from . import rng
from .sampling import check_temperature, check_top_k, check_top_p
from .tree_reference import TreeVerifyOutput, reference_verify_tree_greedy, reference_verify_tree_sample, tree_depth

TREE_BACKENDS = ("torch", "triton")


@dataclass
class TreeBatch:
    """Validated inputs handed to a tree backend.

    batch:     the chain view of the same tensors (``verispec.verify.api.VerifyBatch``): num_draft = num_nodes,
               cu_num_draft = cu_num_nodes, max_num_draft = max(num_nodes); its rows are exactly the tree's rows
               (n_b + 1 per sequence), so row-wise kernels run on it unchanged
    parents:   [N] int32 on the logits' device, local to each sequence (-1 = the root)
    max_depth: host int D, the deepest node of the batch; the output is [B, D + 1] tokens, [B, D] path
    host_parents, host_num_nodes: the same shape as host ints (the reference reads these: no device read)
    """

    batch: VerifyBatch
    parents: torch.Tensor
    max_depth: int
    host_parents: tuple[int, ...]
    host_num_nodes: tuple[int, ...]

    def host_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(parents [N], num_nodes [B]) as CPU int64 tensors, for the reference."""
        return torch.tensor(self.host_parents, dtype=torch.int64), torch.tensor(self.host_num_nodes, dtype=torch.int64)


@functools.lru_cache(maxsize=256)
def tree_shape(parents: tuple[int, ...], num_nodes: tuple[int, ...]) -> int:
    """The host checks of a tree batch's shape; returns D, the depth of its deepest node (cached by value).

    >>> tree_shape((-1, -1, 0, -1), (3, 1))      # sequence 0: two root children, node 2 below node 0
    2
    >>> tree_shape((-1, 1), (2,))
    Traceback (most recent call last):
    ...
    ValueError: sequence 0, node 1: parents[1] = 1 is not before the node: parents come before their children (-1 <= parents[j] < j, local to the sequence)
    """
    if not num_nodes:
        raise ValueError("num_nodes must be a non-empty [B] list or tensor (one node count per sequence)")
    if min(num_nodes) < 0:
        b = next(b for b, n in enumerate(num_nodes) if n < 0)
        raise ValueError(f"sequence {b}: num_nodes must be >= 0, got {num_nodes[b]}")
    if sum(num_nodes) != len(parents):
        raise ValueError(f"num_nodes sums to {sum(num_nodes)} but parents has {len(parents)} entries "
                         f"(one per draft node)")
    depth, node0 = 0, 0
    for b, n in enumerate(num_nodes):
        local = parents[node0:node0 + n]
        for j, parent in enumerate(local):
            if parent < -1:
                raise ValueError(f"sequence {b}, node {j}: parents[{j}] = {parent} is out of range: -1 (a child of "
                                 f"the root) or the index of an earlier node of the same sequence")
            if parent >= j:
                raise ValueError(f"sequence {b}, node {j}: parents[{j}] = {parent} is not before the node: parents "
                                 f"come before their children (-1 <= parents[j] < j, local to the sequence)")
        depth = max(depth, tree_depth(list(local)))
        node0 += n
    return depth


def _host_ints(value, name: str) -> tuple[int, ...]:
    """A 1-D list / tuple / tensor of integers as a tuple of ints (a tensor on an accelerator: one read)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor, got shape {tuple(value.shape)}")
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"{name} must be an integer tensor, got {value.dtype}")
        return tuple(value.tolist())   # NOTE: a device->host read when the tensor is on an accelerator
    try:
        return tuple(map(operator.index, value))   # ints only: a float is refused, never truncated
    except TypeError:
        raise TypeError(f"{name} must hold integers, got {value!r}") from None


def canonical_tree(target_logits, draft_tokens, parents, num_nodes) -> TreeBatch:
    """The metadata checks of a tree call and its canonical layout (see the module docstring)."""
    if not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 2:
        shape = tuple(target_logits.shape) if isinstance(target_logits, torch.Tensor) else type(target_logits).__name__
        raise ValueError(f"target_logits must be a 2-D [sum(num_nodes + 1), V] tensor, got {shape}")
    if target_logits.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"target_logits must be float16, bfloat16 or float32, got {target_logits.dtype}")
    num_nodes = _host_ints(num_nodes, "num_nodes")
    parents = _host_ints(parents, "parents")
    num_drafts = len(draft_tokens) if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dim() == 1 else -1
    if num_drafts < 0:
        raise ValueError(f"draft_tokens must be a 1-D [sum(num_nodes)] tensor, got shape {tuple(draft_tokens.shape)}")
    if len(parents) != num_drafts:
        raise ValueError(f"parents has {len(parents)} entries but draft_tokens has {num_drafts} nodes: one parent "
                         f"per draft node")
    max_depth = tree_shape(parents, num_nodes)
    rows = sum(num_nodes) + len(num_nodes)
    if target_logits.shape[0] != rows:
        raise ValueError(f"target_logits has {target_logits.shape[0]} rows but num_nodes = {list(num_nodes)[:8]}"
                         f"{'...' if len(num_nodes) > 8 else ''} needs sum(num_nodes) + B = {rows}: per sequence the "
                         f"root's row, then one row per node")
    batch = canonical_batch(target_logits, draft_tokens, num_nodes, max(num_nodes))
    return TreeBatch(batch, _device_parents(parents, batch.target_logits.device), max_depth, parents, num_nodes)


@functools.lru_cache(maxsize=256)
def _cached_parents(parents: tuple[int, ...], device: torch.device) -> torch.Tensor:
    from ..device import to_device

    return to_device(torch.tensor(parents, dtype=torch.int32), device)


def _device_parents(parents: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """parents as an [N] int32 tensor on ``device``, cached by value except while a CUDA graph is captured."""
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    return (_cached_parents.__wrapped__ if capturing else _cached_parents)(parents, device)


def pick_tree_backend(backend: str | None, device: torch.device) -> str:
    """``backend`` checked, or for None: "torch" on a CPU, "triton" on a GPU."""
    if backend is None:
        return "triton" if device.type == "cuda" else "torch"
    if backend not in TREE_BACKENDS:
        raise ValueError(f"backend must be one of {TREE_BACKENDS} or None for tree verification, got {backend!r} "
                         f"(there are no CUDA C++ tree kernels: use 'triton')")
    return backend


def verify_tree_greedy(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    parents,
    num_nodes,
    *,
    backend: str | None = None,
    check_values: bool = True,
) -> TreeVerifyOutput:
    """Greedy verification of ragged draft trees: the emitted tokens are what target-only greedy decoding gives.

    Args:
        target_logits: [sum(n_b + 1), V] float16/bfloat16/float32; per sequence the root's row, then one row per
            node (row j + 1 scores node j's children, or gives the bonus at a leaf).
        draft_tokens: [sum(n_b)] integer node tokens.
        parents: [sum(n_b)] integers, node j's parent local to its sequence: -1 = the root, else an earlier node.
        num_nodes: [B] integers n_b >= 0.
        backend: "torch" | "triton" | None ("torch" on a CPU, "triton" on a GPU).
        check_values: read the status back (one device->host read) and raise ValueError naming the first bad
            sequence (``verispec.verify.status``); False: the caller reads ``out.status`` itself.

    Returns:
        TreeVerifyOutput(tokens [B, D+1] int32 (-1 padded), num_accepted [B], num_emitted [B], path [B, D] (the
        accepted nodes, -1 padded), status [B]); D = the deepest node of the batch.

    Example (sequence 0: node 0 and node 1 are alternatives for position 1, node 2 continues node 1):
        >>> import torch
        >>> logits = torch.tensor([[0., 5, 0], [5, 0, 0], [0, 0, 5], [5, 0, 0],   # seq 0: root, nodes 0, 1, 2
        ...                        [0, 5, 0]])                                   # seq 1: root only
        >>> out = verify_tree_greedy(logits, torch.tensor([2, 1, 0]), [-1, -1, 1], [3, 0])
        >>> out.tokens.tolist(), out.path.tolist(), out.num_accepted.tolist()
        ([[1, 2, -1], [1, -1, -1]], [[1, -1], [-1, -1]], [1, 0])
    """
    tree = canonical_tree(target_logits, draft_tokens, parents, num_nodes)
    batch = tree.batch
    chosen = pick_tree_backend(backend, batch.target_logits.device)
    if chosen == "torch":
        out = reference_verify_tree_greedy(batch.target_logits, batch.draft_tokens, *tree.host_tensors(),
                                           tree.max_depth)
    else:
        from .triton.tree import verify_tree_greedy_triton

        out = verify_tree_greedy_triton(tree)
    return _checked(out, batch, check_values)


def verify_tree_sample(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    parents,
    num_nodes,
    draft_probs: torch.Tensor | None = None,
    *,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor = 0,
    backend: str | None = None,
    check_values: bool = True,
) -> TreeVerifyOutput:
    """Rejection-sampling verification of ragged draft trees; exact in distribution.

    The emitted tokens follow the target's p (after temperature / top-k / top-p, ``verispec.verify.sampling``)
    whatever the tree, provided ``draft_probs`` are the distributions the nodes were drawn from, siblings drawn
    independently (SpecInfer's multi-draft rejection), or, with ``draft_probs=None``, that the proposals do not
    depend on this call's random numbers (top-w of a draft model, n-gram continuations: any rule).

    Args:
        target_logits, draft_tokens, parents, num_nodes, backend, check_values: as in ``verify_tree_greedy``.
        draft_probs: [sum(n_b), V] float, node j's row = the distribution q node j was drawn from (siblings drawn
            i.i.d. from their parent's q share one q), or None for deterministic proposals: children are tested
            in index order, each accepted with the residual's probability of its token, a rejected token
            removed from the residual.
        temperature, top_k, top_p, seed, offset: as in ``verispec.verify_sample`` (per sequence; a [B] seed
            tensor makes each sequence's tokens independent of the rest of the batch). The stream use of a tree:
            node j's accept test at row j, the race at the stop row's local index (docs/verification.md).

    Returns:
        TreeVerifyOutput as in ``verify_tree_greedy``.

    Example (a chain tree gives exactly verify_sample's tokens for the same seed):
        >>> import torch
        >>> from verispec import verify_sample
        >>> logits = torch.tensor([[1., 1, 0], [0, 0, 0], [2, 0, 0]])
        >>> tree = verify_tree_sample(logits, torch.tensor([1, 0]), [-1, 0], [2], seed=16)
        >>> chain = verify_sample(logits, torch.tensor([1, 0]), [2], seed=16)
        >>> tree.tokens.tolist() == chain.tokens.tolist()
        True
    """
    tree = canonical_tree(target_logits, draft_tokens, parents, num_nodes)
    batch = tree.batch
    device = batch.target_logits.device
    size = batch.batch_size
    batch.temperature = per_sequence(temperature, size, torch.float32, device, "temperature", 1.0, check_temperature)
    batch.top_k = per_sequence(top_k, size, torch.int32, device, "top_k", 0, check_top_k)
    batch.top_p = per_sequence(top_p, size, torch.float32, device, "top_p", 1.0, check_top_p)
    if draft_probs is not None:
        num_drafts = batch.draft_tokens.shape[0]
        if isinstance(draft_probs, torch.Tensor) and draft_probs.dim() == 2 and draft_probs.shape[0] != num_drafts:
            raise ValueError(f"draft_probs has {draft_probs.shape[0]} rows but the trees have {num_drafts} nodes: "
                             f"draft_probs is [sum(num_nodes), V], node j's row the distribution it was drawn from")
        batch.draft_probs = _checked_draft_probs(draft_probs, batch)
    if seed is None:
        seed = rng.seed_from(None)
    batch.seed, batch.offset = _seed_and_offset(seed, offset, size, device)
    chosen = pick_tree_backend(backend, device)
    if chosen == "torch":
        out = reference_verify_tree_sample(
            batch.target_logits, batch.draft_tokens, *tree.host_tensors(), tree.max_depth,
            batch.draft_probs, batch.temperature.cpu(), batch.top_k.cpu(), batch.top_p.cpu(), batch.seed.cpu(),
            batch.offset.cpu(),
        )
    else:
        from .triton.tree import verify_tree_sample_triton

        out = verify_tree_sample_triton(tree)
    return _checked(out, batch, check_values)
