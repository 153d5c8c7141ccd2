"""Tree verification (verispec/verify/tree_api.py, tree_reference.py, triton/tree.py) against brute force.

- greedy: every backend against a set-based restatement of the walk (a node is on the path iff it is the
  first child of its parent carrying the parent row's argmax, and its parent is on the path), on random
  ragged trees (hypothesis): ties, V = 2, empty trees, several tiling of the Triton first pass;
- sampling: every backend against a step-by-step restatement in torch float32 with the Philox stream drawn
  per node (the stream use is part of the specification);
- a chain tree (parents = [-1, 0, 1, ...]) gives the chain API's result bit for bit, greedy and sampled;
- a sequence's sampled tokens do not depend on the rest of the batch (per-sequence seeds);
- bad inputs: a clear error naming the problem; bad values: the status word, the same on every backend.
Distribution (χ²) tests: test_tree_distribution.py.
"""
from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_reference import brute_probs
from trees import Trees, chain_parents, random_trees
from triton_interpreter import DEVICE
from verispec import verify_greedy, verify_sample, verify_tree_greedy, verify_tree_sample
from verispec.verify import rng, status
from verispec.verify.tree_api import canonical_tree
from verispec.verify.triton.tree import verify_tree_greedy_triton

BACKENDS = ["torch", "triton"]
FEW = settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
needs_gpu = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")


def _on(backend: str, *tensors):
    device = DEVICE if backend == "triton" else "cpu"
    return [t.to(device) for t in tensors]


def _cpu(out):
    return out.tokens.cpu().tolist(), out.path.cpu().tolist(), out.num_accepted.cpu().tolist()


# ------------------------------------------------------------------------------------------------ greedy

def brute_greedy(trees: Trees) -> tuple[list, list, list]:
    """(tokens, path, num_accepted) by the set-based rule of the module docstring."""
    depth = max((_depth(trees.parents[n.start:n.stop]) for n in map(trees.nodes, range(len(trees.num_nodes)))),
                default=0)
    all_tokens, all_paths, counts = [], [], []
    for b in range(len(trees.num_nodes)):
        argmax = trees.logits[trees.rows(b).start:trees.rows(b).stop].float().argmax(-1).tolist()
        nodes = trees.nodes(b)
        parents, tokens = trees.parents[nodes.start:nodes.stop], trees.tokens[nodes.start:nodes.stop].tolist()
        on_path = []
        for j, parent in enumerate(parents):
            matches = tokens[j] == argmax[parent + 1]
            first = matches and not any(parents[i] == parent and tokens[i] == argmax[parent + 1] for i in range(j))
            on_path.append(first and (parent == -1 or on_path[parent]))
        path = [j for j in range(len(parents)) if on_path[j]]
        last = path[-1] if path else -1
        emitted = [tokens[j] for j in path] + [argmax[last + 1]]
        all_tokens.append(emitted + [-1] * (depth + 1 - len(emitted)))
        all_paths.append(path + [-1] * (depth - len(path)))
        counts.append(len(path))
    return all_tokens, all_paths, counts


def _depth(parents: list[int]) -> int:
    depth = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return max(depth, default=0)


@FEW
@given(num_nodes=st.lists(st.integers(0, 9), min_size=1, max_size=5), vocab=st.integers(2, 40),
       ties=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       seed=st.integers(0, 2**31 - 1))
def test_greedy_matches_brute_force(num_nodes, vocab, ties, dtype, seed):
    trees = random_trees(torch.Generator().manual_seed(seed), num_nodes, vocab, ties=ties, dtype=dtype)
    expected = brute_greedy(trees)
    for backend in BACKENDS:
        logits, tokens = _on(backend, trees.logits, trees.tokens)
        out = verify_tree_greedy(logits, tokens, trees.parents, trees.num_nodes, backend=backend)
        assert _cpu(out) == expected, backend
        assert out.num_emitted.cpu().tolist() == [n + 1 for n in expected[2]]


@pytest.mark.parametrize("block, num_splits", [(16, None), (16, 3), (8, 5)])
def test_triton_greedy_tilings(block, num_splits):
    """The first pass split into several V-chunks (and several tiles per chunk): the same walk."""
    trees = random_trees(torch.Generator().manual_seed(7), [6, 0, 9, 3], 45, ties=True)
    tree = canonical_tree(*_on("triton", trees.logits, trees.tokens), trees.parents, trees.num_nodes)
    out = verify_tree_greedy_triton(tree, block=block, num_splits=num_splits)
    assert _cpu(out) == brute_greedy(trees)


def test_greedy_follows_the_first_matching_sibling_in_index_order():
    # root argmax 1: nodes 0 and 2 both carry token 1; node 0 comes first, so node 0's subtree is walked even
    # though node 2's child (node 3) would have been accepted
    logits = torch.tensor([[0., 5, 0],   # root
                           [4., 0, 0],   # node 0: argmax 0
                           [0., 0, 0],   # node 1
                           [0., 0, 3],   # node 2: argmax 2
                           [0., 3, 0]])  # node 3
    for backend in BACKENDS:
        out = verify_tree_greedy(*_on(backend, logits, torch.tensor([1, 0, 1, 2])), [-1, -1, -1, 2], [4],
                                 backend=backend)
        assert _cpu(out) == ([[1, 0, -1]], [[0, -1]], [1])   # node 0's row emits its argmax 0 (bonus at a leaf)


def test_empty_trees_emit_the_root_argmax():
    logits = torch.tensor([[0., 1, 3], [2., 0, 0]])
    for backend in BACKENDS:
        out = verify_tree_greedy(*_on(backend, logits, torch.zeros(0, dtype=torch.long)), [], [0, 0], backend=backend)
        assert _cpu(out) == ([[2], [0]], [[], []], [0, 0])


# ------------------------------------------------------------------------------------------------ sampling

def brute_sample(trees: Trees, with_q: bool, temps, top_ks, top_ps, seeds, offsets) -> tuple[list, list, list]:
    """Tree rejection sampling restated step by step in torch float32 (tree_reference's docstring)."""
    depth = max((_depth(trees.parents[n.start:n.stop]) for n in map(trees.nodes, range(len(trees.num_nodes)))),
                default=0)
    all_tokens, all_paths, counts = [], [], []
    vocab = trees.logits.shape[1]
    for b in range(len(trees.num_nodes)):
        rows, nodes = trees.rows(b), trees.nodes(b)
        parents = trees.parents[nodes.start:nodes.stop]
        node, emitted, path = -1, [], []
        while True:
            p = brute_probs(trees.logits[rows.start + node + 1], temps[b], top_ks[b], top_ps[b])
            weights, norm, chosen = p, torch.tensor(1.0), None
            for c in [j for j, parent in enumerate(parents) if parent == node]:
                x = int(trees.tokens[nodes.start + c])
                if temps[b] == 0:
                    if x == int(p.argmax()):
                        chosen = c
                        break
                    continue
                q = trees.q[nodes.start + c] if with_q else torch.nn.functional.one_hot(torch.tensor(x), vocab).float()
                u = rng.uniform(seeds[b], offsets[b], c, 0, rng.ACCEPT)                  # node c's accept uniform
                if float(u) * float(q[x]) < float(weights[x] / norm):
                    chosen = c
                    break
                residual = torch.clamp(weights / norm - q, min=0.0)
                if float(residual.sum()) > 0:
                    weights, norm = residual, residual.sum()
            if chosen is None:
                race = rng.uniform(seeds[b], offsets[b], node + 1, torch.arange(vocab), rng.RACE)  # the stop row
                emitted.append(int(p.argmax()) if temps[b] == 0 else int(torch.argmax(weights / -torch.log(race))))
                break
            node = chosen
            path.append(node)
            emitted.append(int(trees.tokens[nodes.start + node]))
        all_tokens.append(emitted + [-1] * (depth + 1 - len(emitted)))
        all_paths.append(path + [-1] * (depth - len(path)))
        counts.append(len(path))
    return all_tokens, all_paths, counts


def _settings(gen: torch.Generator, batch: int, filters: bool):
    pick = lambda options: options[int(torch.randint(len(options), (), generator=gen))]  # noqa: E731
    temps = [pick([0.0, 0.7, 1.0, 1.0, 1.5]) for _ in range(batch)]
    top_ks = [pick([0, 0, 3]) if filters else 0 for _ in range(batch)]
    top_ps = [pick([1.0, 1.0, 0.8]) if filters else 1.0 for _ in range(batch)]
    seeds = [int(torch.randint(-(2**63), 2**63 - 1, (), generator=gen)) for _ in range(batch)]
    offsets = [int(torch.randint(0, 2**31, (), generator=gen)) for _ in range(batch)]
    return temps, top_ks, top_ps, seeds, offsets


def _sample(trees: Trees, with_q: bool, temps, top_ks, top_ps, seeds, offsets, backend: str, **kwargs):
    logits, tokens, q = _on(backend, trees.logits, trees.tokens, trees.q)
    device = logits.device
    return verify_tree_sample(
        logits, tokens, trees.parents, trees.num_nodes, q if with_q else None,
        temperature=torch.tensor(temps, device=device), top_k=torch.tensor(top_ks, dtype=torch.int32, device=device),
        top_p=torch.tensor(top_ps, device=device), seed=torch.tensor(seeds, device=device),
        offset=torch.tensor(offsets, device=device), backend=backend, **kwargs)


@FEW
@given(num_nodes=st.lists(st.integers(0, 8), min_size=1, max_size=4), vocab=st.integers(2, 24),
       with_q=st.booleans(), filters=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_sample_matches_brute_force(num_nodes, vocab, with_q, filters, seed):
    gen = torch.Generator().manual_seed(seed)
    trees = random_trees(gen, num_nodes, vocab, match=0.5)
    args = _settings(gen, len(num_nodes), filters)
    expected = brute_sample(trees, with_q, *args)
    for backend in BACKENDS:
        assert _cpu(_sample(trees, with_q, *args, backend)) == expected, backend


def test_sampling_walks_rejections_between_siblings():
    """The brute-force comparison is not vacuous: over a batch, siblings after a rejected one get accepted, walks
    reach depth >= 2, and some sequences stop with every child rejected (recovered tokens)."""
    gen = torch.Generator().manual_seed(3)
    trees = random_trees(gen, [6] * 12, 6, match=0.3)
    args = _settings(gen, 12, filters=False)
    tokens, paths, counts = brute_sample(trees, True, *args)
    first_children = {b: min(j for j, p in enumerate(trees.parents[trees.nodes(b).start:trees.nodes(b).stop])
                             if p == -1) for b in range(12)}
    assert any(path[0] not in (-1, first_children[b]) for b, path in enumerate(paths))    # a later sibling won
    assert max(counts) >= 2 and 0 in counts
    for backend in BACKENDS:
        assert _cpu(_sample(trees, True, *args, backend)) == (tokens, paths, counts), backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_temperature_zero_sampling_is_the_greedy_walk(backend):
    trees = random_trees(torch.Generator().manual_seed(5), [7, 2, 0, 9], 30)
    logits, tokens = _on(backend, trees.logits, trees.tokens)
    greedy = verify_tree_greedy(logits, tokens, trees.parents, trees.num_nodes, backend=backend)
    sampled = verify_tree_sample(logits, tokens, trees.parents, trees.num_nodes, temperature=0.0, seed=1,
                                 backend=backend)
    assert _cpu(sampled) == _cpu(greedy)


# ------------------------------------------------------------------------------------------------ chains

def _chains(gen: torch.Generator, num_draft: list[int], vocab: int):
    """Chain inputs whose drafts are often accepted: logits [sum(k+1), V], drafts [sum k], q [sum k, V]."""
    base = torch.randn(sum(num_draft) + len(num_draft), vocab, generator=gen) * 2
    q_rows = [r for b, k in enumerate(num_draft) for r in range(sum(num_draft[:b]) + b, sum(num_draft[:b]) + b + k)]
    q = torch.softmax(base[q_rows], -1) if q_rows else torch.zeros(0, vocab)
    drafts = torch.multinomial(q, 1, generator=gen).squeeze(1) if q_rows else torch.zeros(0, dtype=torch.long)
    logits = base + 0.3 * torch.randn(base.shape, generator=gen)
    return logits, drafts, q


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_tree_greedy_equals_verify_greedy(backend):
    gen = torch.Generator().manual_seed(11)
    for trial in range(3):
        num_draft = torch.randint(0, 7, (5,), generator=gen).tolist()
        logits, drafts, _ = _chains(gen, num_draft, 33)
        logits, drafts = _on(backend, logits, drafts)
        chain = verify_greedy(logits, drafts, num_draft, backend=backend)
        tree = verify_tree_greedy(logits, drafts, chain_parents(num_draft), num_draft, backend=backend)
        assert torch.equal(tree.tokens, chain.tokens) and torch.equal(tree.num_accepted, chain.num_accepted)
        k = max(num_draft)
        assert tree.path.cpu().tolist() == [list(range(n)) + [-1] * (k - n) for n in chain.num_accepted.tolist()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_q", [True, False], ids=["draft_probs", "deterministic"])
def test_chain_tree_sample_equals_verify_sample(backend, with_q):
    """Same tokens for the same seeds: the tree consumes the chain's stream (ACCEPT at node j = draft position
    j, RACE at the stop row), with T / top-k / top-p per sequence, per-sequence and batch seeds."""
    gen = torch.Generator().manual_seed(12 + with_q)
    for trial in range(4 if backend == "torch" else 2):   # the interpreter runs ~1-2 s per call
        num_draft = torch.randint(0, 6, (6,), generator=gen).tolist()
        logits, drafts, q = _on(backend, *_chains(gen, num_draft, 29))
        temps, top_ks, top_ps, seeds, offsets = _settings(gen, 6, filters=trial == 0)
        seed = torch.tensor(seeds, device=logits.device) if trial % 2 else seeds[0]   # per sequence, or one
        kwargs = dict(temperature=torch.tensor(temps, device=logits.device), top_k=top_ks, top_p=top_ps,
                      seed=seed, offset=offsets[0], backend=backend)
        chain = verify_sample(logits, drafts, num_draft, q if with_q else None, **kwargs)
        tree = verify_tree_sample(logits, drafts, chain_parents(num_draft), num_draft, q if with_q else None, **kwargs)
        assert torch.equal(tree.tokens, chain.tokens) and torch.equal(tree.num_accepted, chain.num_accepted)


# ------------------------------------------------------------------------------------------------ the batch

@pytest.mark.parametrize("backend", BACKENDS)
def test_sampled_tokens_do_not_depend_on_the_batch(backend):
    gen = torch.Generator().manual_seed(21)
    trees = random_trees(gen, [5, 0, 8, 3, 6], 20, match=0.5)
    args = _settings(gen, 5, filters=True)
    together = _cpu(_sample(trees, True, *args, backend))
    for b in range(5):
        alone = _cpu(_sample(trees.sequence(b), True, *[[a[b]] for a in args], backend))
        width = len(alone[0][0])
        assert alone == ([together[0][b][:width]], [together[1][b][:width - 1]], [together[2][b]])
        assert all(t == -1 for t in together[0][b][width:])


# ------------------------------------------------------------------------------------------------ bad inputs

L4 = torch.zeros(4, 5)            # one sequence: root + 3 nodes
T3 = torch.tensor([0, 1, 2])

BAD_CALLS = [
    (dict(parents=[-1, 1, 0]), ValueError, r"sequence 0, node 1: parents\[1\] = 1 is not before the node"),
    (dict(parents=[-1, 0, 3]), ValueError, r"node 2: parents\[2\] = 3 is not before the node"),
    (dict(parents=[-1, -2, 0]), ValueError, r"node 1: parents\[1\] = -2 is out of range"),
    (dict(parents=[-1, 0]), ValueError, r"parents has 2 entries but draft_tokens has 3 nodes"),
    (dict(parents=[-1, 0.0, 1]), TypeError, r"parents must hold integers"),
    (dict(parents=torch.tensor([-1.0, 0, 1])), ValueError, r"parents must be an integer tensor"),
    (dict(num_nodes=[4]), ValueError, r"num_nodes sums to 4 but parents has 3 entries"),
    (dict(num_nodes=[-1, 4]), ValueError, r"sequence 0: num_nodes must be >= 0"),
    (dict(num_nodes=[]), ValueError, r"num_nodes must be a non-empty"),
    (dict(num_nodes=[2, 1], parents=[-1, 0, 0]), ValueError, r"sequence 1, node 0: parents\[0\] = 0 is not before"),
    (dict(num_nodes=[2, 1], parents=[-1, 0, -1]), ValueError, r"target_logits has 4 rows but .* needs .* = 5"),
    (dict(target_logits=torch.zeros(4)), ValueError, r"target_logits must be a 2-D \[sum\(num_nodes \+ 1\), V\]"),
    (dict(target_logits=torch.zeros(4, 5, dtype=torch.int64)), ValueError, r"float16, bfloat16 or float32"),
    (dict(draft_tokens=torch.zeros(3, 1, dtype=torch.long)), ValueError, r"draft_tokens must be a 1-D"),
    (dict(draft_tokens=torch.zeros(3)), ValueError, r"draft_tokens must be an integer tensor"),
    (dict(backend="cuda"), ValueError, r"no CUDA C\+\+ tree kernels"),
    (dict(draft_probs=torch.full((2, 5), 0.2)), ValueError, r"draft_probs has 2 rows but the trees have 3 nodes"),
    (dict(draft_probs=torch.full((3, 4), 0.25)), ValueError, r"draft vocab must equal the target vocab"),
    (dict(temperature=-1.0), ValueError, r"temperature must be finite and >= 0"),
    (dict(seed=1.5), TypeError, r"seed must be an integer"),
]


@pytest.mark.parametrize("kwargs, error, message", BAD_CALLS, ids=[m[:40] for _, _, m in BAD_CALLS])
def test_bad_inputs_are_named(kwargs, error, message):
    call = {**dict(target_logits=L4, draft_tokens=T3, parents=[-1, 0, 0], num_nodes=[3]), **kwargs}
    sampled = any(k in kwargs for k in ("draft_probs", "temperature", "seed"))
    fn = verify_tree_sample if sampled else verify_tree_greedy
    with pytest.raises(error, match=message):
        fn(**call)
    if not sampled:   # the same metadata checks in the sampler
        with pytest.raises(error, match=message):
            verify_tree_sample(**call)


def _bad_values():
    """Two sequences (3 and 2 nodes): rows 0-3 and 4-6. Node rows after a rejection are judged too."""
    gen = torch.Generator().manual_seed(0)
    return torch.randn(7, 12, generator=gen), torch.tensor([1, 2, 3, 4, 5]), [-1, 0, -1, -1, 0], [3, 2]


VALUE_CASES = {
    "nan-in-a-leaf-row": (lambda l, t: l.__setitem__((3, 4), float("nan")), 0, status.NAN),
    "pos-inf": (lambda l, t: l.__setitem__((6, 0), float("inf")), 1, status.POS_INF),
    "dead-root-row": (lambda l, t: l.__setitem__(4, float("-inf")), 1, status.DEAD_ROW),
    "draft-id": (lambda l, t: t.__setitem__(3, 12), 1, status.DRAFT_ID),
}


@pytest.mark.parametrize("name", VALUE_CASES)
@pytest.mark.parametrize("fn", [verify_tree_greedy, verify_tree_sample], ids=["greedy", "sample"])
def test_bad_values_raise_the_same_error_on_every_backend(name, fn):
    spoil, seq, bit = VALUE_CASES[name]
    logits, tokens, parents, num_nodes = _bad_values()
    spoil(logits, tokens)
    words = {}
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="^" + re.escape(f"sequence {seq}: {status.MESSAGES[bit]}")):
            fn(*_on(backend, logits, tokens), parents, num_nodes, backend=backend)
        out = fn(*_on(backend, logits, tokens), parents, num_nodes, backend=backend, check_values=False)
        words[backend] = out.status.cpu().tolist()
    assert words["torch"] == words["triton"] and [b for b, w in enumerate(words["torch"]) if w] == [seq]


def test_bad_draft_probs_are_a_status_word():
    logits, tokens, parents, num_nodes = _bad_values()
    q = torch.full((5, 12), 1 / 12)
    q[3, 0] = 0.5   # sequence 1's first node: a row that does not sum to 1
    for backend in BACKENDS:
        out = verify_tree_sample(*_on(backend, logits, tokens, q)[:2], parents, num_nodes, _on(backend, q)[0],
                                 seed=1, backend=backend, check_values=False)
        assert out.status.cpu().tolist() == [0, status.DRAFT_PROBS]


AOT_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from verispec.verify.triton.tree import _tree_greedy_kernel, _tree_sample_kernel

POINTERS = {"part_ptr": "*i32", "draft_tokens_ptr": "*i64", "parents_ptr": "*i32", "num_nodes_ptr": "*i32",
            "cu_num_nodes_ptr": "*i32", "tokens_ptr": "*i32", "path_ptr": "*i32", "num_accepted_ptr": "*i32",
            "num_emitted_ptr": "*i32", "status_ptr": "*i32", "logits_ptr": "*bf16", "draft_probs_ptr": "*fp32",
            "temperature_ptr": "*fp32", "top_k_ptr": "*i32", "top_p_ptr": "*fp32", "seed_ptr": "*i64",
            "offset_ptr": "*i64", "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32", "part_idx_ptr": "*i32",
            "part_flag_ptr": "*i32", "part_qsum_ptr": "*fp32", "row_cut_ptr": "*fp32", "scratch_ptr": "*fp32"}

def compile_for_h100(fn, constexprs):
    signature = {n: "constexpr" if n in constexprs else POINTERS.get(n, "i32") for n in fn.arg_names}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
    assert len(compiled.asm["cubin"]) > 0

compile_for_h100(_tree_greedy_kernel, {"BLOCK_N": 16, "BLOCK_S": 32, "BLOCK_D": 16})
for has_q in (True, False):
    compile_for_h100(_tree_sample_kernel, {"HAS_DRAFT_PROBS": has_q, "BLOCK_N": 32, "BLOCK_S": 32, "BLOCK_D": 16,
                                           "BLOCK": 2048})
print("ok")
"""


def test_tree_kernels_compile_for_an_h100():
    """Both tree kernels lower to sm_90 cubins ahead of time (no GPU needed; in a process without the
    interpreter, which accepts control flow that the compiler may refuse): the GPU path at least builds."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", AOT_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("fn, kwargs", [(verify_tree_greedy, {}), (verify_tree_sample, dict(seed=5, top_k=3)),
                                        (verify_tree_sample, dict(seed=5, with_q=True))],
                         ids=["greedy", "sample", "sample-draft-probs"])
def test_the_default_call_reads_the_device_once(monkeypatch, fn, kwargs):
    """The tree's shape is host metadata: the only device->host read is the status word's (none unchecked)."""
    from test_verify_status import ONE_READ, _count_reads

    kwargs = dict(kwargs)
    trees = random_trees(torch.Generator().manual_seed(2), [4, 0, 3], 16)
    logits, tokens, q = _on("triton", trees.logits, trees.tokens, trees.q)
    args = (logits, tokens, trees.parents, trees.num_nodes) + ((q,) if kwargs.pop("with_q", False) else ())
    assert _count_reads(monkeypatch, lambda: fn(*args, backend="triton", **kwargs)) == ONE_READ
    assert _count_reads(monkeypatch, lambda: fn(*args, backend="triton", check_values=False, **kwargs)) == {}


def test_default_backend_is_the_reference_on_cpu():
    from verispec.verify.tree_api import pick_tree_backend

    assert pick_tree_backend(None, torch.device("cpu")) == "torch"
    assert pick_tree_backend(None, torch.device("cuda")) == "triton"


# ------------------------------------------------------------------------------------------------ GPU only

@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_full_vocab_greedy_and_sample_match_the_reference(dtype):
    """V = 128256 on the GPU: the Triton walk against the reference (greedy exactly; sampling up to float
    near-ties: at most 1 sequence in 64 may differ)."""
    gen = torch.Generator().manual_seed(9)
    num_nodes = torch.randint(0, 24, (64,), generator=gen).tolist()
    trees = random_trees(gen, num_nodes, 128256, dtype=dtype, match=0.8)
    logits, tokens, q = trees.logits.cuda(), trees.tokens.cuda(), trees.q.cuda()
    for fn, extra in [(verify_tree_greedy, {}), (verify_tree_sample, dict(seed=torch.arange(64).cuda()))]:
        ref = fn(logits, tokens, trees.parents, num_nodes, backend="torch", **extra)
        out = fn(logits, tokens, trees.parents, num_nodes, backend="triton", **extra)
        differ = (ref.tokens.cpu() != out.tokens.cpu()).any(1).sum()
        assert differ <= (0 if fn is verify_tree_greedy else 1), int(differ)
    out = verify_tree_sample(logits, tokens, trees.parents, num_nodes, q, seed=torch.arange(64).cuda(), backend="triton")
    ref = verify_tree_sample(logits, tokens, trees.parents, num_nodes, q, seed=torch.arange(64).cuda(), backend="torch")
    assert int((ref.tokens.cpu() != out.tokens.cpu()).any(1).sum()) <= 1


@needs_gpu
def test_gpu_tree_greedy_is_graph_capturable():
    trees = random_trees(torch.Generator().manual_seed(4), [9, 3, 12], 32000)
    logits, tokens = trees.logits.cuda(), trees.tokens.cuda()
    expected = verify_tree_greedy(logits, tokens, trees.parents, trees.num_nodes, backend="torch")
    kwargs = dict(backend="triton", check_values=False)
    verify_tree_greedy(logits, tokens, trees.parents, trees.num_nodes, **kwargs)   # compile, cache the layout
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = verify_tree_greedy(logits, tokens, trees.parents, trees.num_nodes, **kwargs)
    out.tokens.fill_(-7)
    graph.replay()
    assert _cpu(out) == _cpu(expected) and out.status.tolist() == [0, 0, 0]
