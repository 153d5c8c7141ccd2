"""Triton verification kernels vs the reference (CPU under TRITON_INTERPRET=1, or a CUDA GPU).

The same tests run on a GPU when TRITON_INTERPRET=0 and CUDA is available; the GPU-only tests
at the end add full-size vocabularies.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verispec.verify.triton.greedy import verify_greedy_triton
from verispec.verify.triton.rejection import verify_sample_triton
from verispec.verify.reference import reference_verify_greedy
from verispec.verify.api import canonical_batch, verify_sample
from stats import chi2_pvalue
from triton_interpreter import DEVICE
from verispec.verify import rng
from ragged import batch_independence

needs_gpu = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")
FEW = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (block, num_splits): the default tiling, several tiles per program, several programs per row
TILINGS = [(None, None), (16, None), (16, 3)]


def _layout(num_draft: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """cu_num_draft and the first target row of each sequence, e.g. [2,0,3] -> [0,2,2,5], [0,3,4]."""
    counts = torch.tensor(num_draft)
    cu = torch.zeros(len(num_draft) + 1, dtype=torch.long)
    cu[1:] = counts.cumsum(0)
    return cu, cu[:-1] + torch.arange(len(num_draft))


def _greedy_case(num_draft, vocab, dtype, ties, accept, gen):
    rows = sum(num_draft) + len(num_draft)
    if ties:  # few distinct values: many ties for the max, incl. -inf rows when vocab is small
        logits = torch.randint(-2, 2, (rows, vocab), generator=gen).float()
        logits[logits == -2] = float("-inf")
    else:
        logits = torch.randn(rows, vocab, generator=gen) * 3
    logits = logits.to(dtype)
    argmax = logits.float().argmax(-1)
    cu, row0 = _layout(num_draft)
    drafts = torch.randint(0, vocab, (sum(num_draft),), generator=gen)
    for b, k in enumerate(num_draft):
        for i in range(k):
            if torch.rand((), generator=gen) < accept:
                drafts[cu[b] + i] = argmax[row0[b] + i]
    return logits, drafts


@FEW
@given(
    num_draft=st.lists(st.integers(0, 8), min_size=1, max_size=6),
    vocab=st.integers(2, 300),
    dtype=st.sampled_from(DTYPES),
    ties=st.booleans(),
    tiling=st.sampled_from(TILINGS),
    seed=st.integers(0, 2**31 - 1),
)
def test_greedy_matches_reference(num_draft, vocab, dtype, ties, tiling, seed):
    gen = torch.Generator().manual_seed(seed)
    logits, drafts = _greedy_case(num_draft, vocab, dtype, ties, 0.8, gen)
    expected = reference_verify_greedy(logits, drafts, torch.tensor(num_draft), max(num_draft))
    batch = canonical_batch(logits.to(DEVICE), drafts.to(DEVICE), torch.tensor(num_draft), None, True)
    out = verify_greedy_triton(batch, block=tiling[0], num_splits=tiling[1])
    assert torch.equal(out.tokens.cpu(), expected.tokens)
    assert torch.equal(out.num_accepted.cpu(), expected.num_accepted)
    assert torch.equal(out.num_emitted.cpu(), expected.num_accepted + 1)


def test_greedy_ties_go_to_lowest_index():
    logits = torch.full((3, 40), -1.0)
    logits[0, [7, 3, 30]] = 5.0  # argmax 3
    logits[1, [39, 20]] = 2.0  # argmax 20 (second split with num_splits=3, block=8)
    logits[2] = float("-inf")  # all -inf: torch.argmax says 0
    batch = canonical_batch(logits.to(DEVICE), torch.tensor([3, 20]).to(DEVICE), [2], None, True)
    for block, splits in [(None, None), (8, None), (8, 3)]:
        out = verify_greedy_triton(batch, block=block, num_splits=splits)
        assert out.tokens.cpu().tolist() == [[3, 20, 0]]
        assert out.num_accepted.cpu().tolist() == [2]


def _sampling_case(num_draft, vocab, dtype, with_q, gen):
    """Logits close to the drafts' q so that drafts are often accepted."""
    rows = sum(num_draft) + len(num_draft)
    n = sum(num_draft)
    cu, row0 = _layout(num_draft)
    draft_row = torch.cat([row0[b] + torch.arange(k) for b, k in enumerate(num_draft)]).long()
    q_logits = torch.randn(rows, vocab, generator=gen) * 2
    q = torch.softmax(q_logits[draft_row], -1)
    logits = (q_logits + 0.5 * torch.randn(rows, vocab, generator=gen)).to(dtype)
    drafts = torch.multinomial(q, 1, generator=gen).squeeze(1) if n else torch.zeros(0, dtype=torch.long)
    if not with_q:  # point-mass drafts are accepted with probability p(x): make p(x) large
        logits = logits.float()
        logits[draft_row, drafts] += 6.0
        logits = logits.to(dtype)
    return logits, drafts, (q if with_q else None)


@FEW
@given(
    num_draft=st.lists(st.integers(0, 8), min_size=1, max_size=6),
    vocab=st.integers(2, 300),
    dtype=st.sampled_from(DTYPES),
    with_q=st.booleans(),
    params=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.6, 1.0, 1.7]), st.sampled_from([0, 1, 3, 50, 400]), st.sampled_from([1.0, 0.95, 0.5, 0.1])
        ),
        min_size=6,
        max_size=6,
    ),
    tiling=st.sampled_from(TILINGS),
    waves=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    offset=st.integers(0, 2**40),
    per_sequence=st.booleans(),
)
def test_sample_matches_reference(num_draft, vocab, dtype, with_q, params, tiling, waves, seed, offset, per_sequence):
    """Exact equality with the reference on the same stream (per-sequence seeds / offsets, or one
    batch seed expanded by rng.sequence_seeds and one shared offset).

    Continuous random logits make every comparison that could flip by float rounding (accept
    test, race keys, top-p cut) a near-tie of probability ~1e-7, so exact equality is required.
    """
    gen = torch.Generator().manual_seed(seed)
    logits, drafts, q = _sampling_case(num_draft, vocab, dtype, with_q, gen)
    size = len(num_draft)
    temperature = torch.tensor([p[0] for p in params[:size]])
    top_k = torch.tensor([p[1] for p in params[:size]], dtype=torch.int32)
    top_p = torch.tensor([p[2] for p in params[:size]])
    if per_sequence:  # keys over the whole 64-bit range, offsets past 2**32 (taken mod 2**32)
        seeds = torch.randint(-(2**63), 2**63 - 1, (size,), generator=gen)
        offsets = offset + torch.randint(0, 2**33, (size,), generator=gen)
    else:
        seeds, offsets = rng.sequence_seeds(seed, size), torch.full((size,), offset)
    args = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seeds, offset=offsets)
    expected = verify_sample(logits, drafts, num_draft, q, backend="torch", **args)
    # same validation path, then the kernel with the forced tiling
    dev = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    batch = canonical_batch(logits.to(DEVICE), drafts.to(DEVICE), torch.tensor(num_draft), None, True)
    batch.draft_probs = dev(q)
    batch.temperature, batch.top_k, batch.top_p = dev(temperature), dev(top_k), dev(top_p.float())
    batch.seed, batch.offset = seeds.to(DEVICE), offsets.to(DEVICE)
    out = verify_sample_triton(batch, block=tiling[0], num_splits=tiling[1], num_race_splits=tiling[1], waves=waves)
    assert torch.equal(out.tokens.cpu(), expected.tokens)
    assert torch.equal(out.num_accepted.cpu(), expected.num_accepted)
    assert torch.equal(out.num_emitted.cpu(), expected.num_accepted + 1)


@pytest.mark.parametrize("waves", [False, True])
@pytest.mark.parametrize("with_q", [True, False])
def test_sample_split_paths_match_reference(with_q, waves):
    """Every row cut into 4 chunks (stats and race), T > 0 and T = 0, with and without waves."""
    gen = torch.Generator().manual_seed(11)
    num_draft = [3, 0, 6, 2, 8]
    logits, drafts, q = _sampling_case(num_draft, 200, torch.float32, with_q, gen)
    temperature = torch.tensor([1.0, 0.7, 1.3, 0.0, 0.9])
    expected = verify_sample(logits, drafts, num_draft, q, temperature=temperature, seed=5, offset=9, backend="torch")
    batch = canonical_batch(logits.to(DEVICE), drafts.to(DEVICE), torch.tensor(num_draft), None, True)
    batch.draft_probs = None if q is None else q.to(DEVICE)
    batch.temperature = temperature.to(DEVICE)
    batch.top_k = torch.zeros(5, dtype=torch.int32, device=DEVICE)
    batch.top_p = torch.ones(5, device=DEVICE)
    batch.seed, batch.offset = rng.sequence_seeds(5, 5).to(DEVICE), torch.full((5,), 9, device=DEVICE)
    out = verify_sample_triton(batch, block=16, num_splits=4, num_race_splits=4, waves=waves)
    assert expected.num_accepted.sum() > 3  # the test must see accepted drafts
    assert torch.equal(out.tokens.cpu(), expected.tokens)
    assert torch.equal(out.num_accepted.cpu(), expected.num_accepted)


@pytest.mark.parametrize("with_q", [True, False])
def test_first_token_distribution_is_target(with_q):
    """Whatever the drafts, the first emitted token is distributed as the filtered target p.

    One batched call: N identical sequences (k = 1), drafts drawn from q; each sequence has
    its own target rows, hence its own Philox draws; chi-square p > 1e-3 (tests/stats.py).
    N = 240 on the interpreter (~0.15 s per sequence), 50000 on a GPU.
    """
    size, vocab = (50000 if DEVICE == "cuda" else 240), 8
    gen = torch.Generator().manual_seed(1)
    target = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, -3.0])
    q_row = torch.softmax(torch.tensor([0.0, 2.0, 0.0, 1.0, 0.0, 0.5, -1.0, 0.0]), 0)
    temperature, top_k = 0.8, 6  # p over 6 tokens: 7 (lowest) and 5 cut by top-k
    probs = torch.softmax(target / temperature, 0)
    probs[[5, 7]] = 0
    probs /= probs.sum()
    logits = target.repeat(2 * size, 1)
    if with_q:
        q = q_row.repeat(size, 1)
        drafts = torch.multinomial(q, 1, generator=gen).squeeze(1)
    else:
        q, drafts = None, torch.full((size,), 1)
    out = verify_sample(
        logits.to(DEVICE), drafts.to(DEVICE), [1] * size, None if q is None else q.to(DEVICE),
        temperature=temperature, top_k=top_k, seed=1234, offset=5, backend="triton",
    )
    first = out.tokens[:, 0].cpu().long()
    assert chi2_pvalue(torch.bincount(first, minlength=vocab), probs) > 1e-3


def test_sampling_is_reproducible_per_seed_and_offset():
    gen = torch.Generator().manual_seed(3)
    logits, drafts, q = _sampling_case([4, 2, 5, 0], 97, torch.float32, True, gen)
    args = (logits.to(DEVICE), drafts.to(DEVICE), [4, 2, 5, 0], q.to(DEVICE))
    runs = [verify_sample(*args, seed=s, offset=o, backend="triton").tokens.cpu() for s, o in [(9, 1), (9, 1), (9, 2), (10, 1)]]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2]), "another offset must give another stream"
    assert not torch.equal(runs[0], runs[3]), "another seed must give another stream"
    seed_t = torch.tensor(9, device=DEVICE)  # 0-d device-tensor seed/offset give the same stream
    again = verify_sample(*args, seed=seed_t, offset=torch.tensor(1, device=DEVICE), backend="triton")
    assert torch.equal(again.tokens.cpu(), runs[0])


def test_sequence_tokens_do_not_depend_on_the_batch():
    """Per-sequence seeds: a sequence alone (B = 1) and at a random row of a larger ragged batch
    (other sequences, other temperatures / filters around it) emits the same tokens."""
    trials = 40 if DEVICE == "cuda" else 16
    mismatches, accepted = batch_independence(trials=trials, vocab=50, max_k=5, max_others=4, backend="triton",
                                              device=DEVICE, gen_seed=1)
    assert mismatches == 0
    assert accepted > trials // 2  # acceptance runs were exercised


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_greedy_full_vocab(dtype):
    from verispec.verify.workloads import greedy_workload

    for size, k in [(1, 4), (8, [0, 3, 8, 1, 5, 2, 7, 4]), (64, 8)]:
        w = greedy_workload(size, k, 128256, 0.7, dtype=dtype, device="cuda", seed=size)
        batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, None, True)
        out = verify_greedy_triton(batch)
        ref = reference_verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, batch.max_num_draft)
        assert torch.equal(out.tokens, ref.tokens) and torch.equal(out.num_accepted, ref.num_accepted)


@needs_gpu
@pytest.mark.parametrize("with_q", [True, False])
def test_gpu_sample_full_vocab(with_q):
    """GPU exp/log differ from the CPU reference by ulps: a flip needs a near-tie (~1e-6)."""
    gen = torch.Generator().manual_seed(0)
    num_draft = [4, 0, 8, 3, 1, 6, 2, 5] * 4
    logits, drafts, q = _sampling_case(num_draft, 128256, torch.bfloat16, with_q, gen)
    size = len(num_draft)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * (size // 4))
    top_k = torch.tensor([0, 0, 50, 0, 0, 1000, 0, 0] * (size // 8), dtype=torch.int32)
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0, 0.8, 1.0, 1.0, 1.0] * (size // 8))
    args = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=77, offset=3)
    ref = verify_sample(logits, drafts, num_draft, q, backend="torch", **args)
    cuda_q = None if q is None else q.cuda()
    out = verify_sample(logits.cuda(), drafts.cuda(), num_draft, cuda_q, backend="triton", **args)
    assert torch.equal(out.num_accepted.cpu(), ref.num_accepted)
    assert torch.equal(out.tokens.cpu(), ref.tokens)


@needs_gpu
def test_gpu_sample_is_graph_capturable():
    from verispec.verify.workloads import sampling_workload

    w = sampling_workload(4, 4, 32000, 0.6, dtype=torch.float32, device="cuda", seed=0)
    seed = torch.tensor([5, 6, 7, 8], device="cuda")  # per sequence
    offset = torch.zeros(4, dtype=torch.int64, device="cuda")
    call = lambda: verify_sample(  # noqa: E731
        w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, seed=seed, offset=offset,
        max_num_draft=4, backend="triton", check_values=False,
    )
    eager = call().tokens.clone()
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    assert torch.equal(out.tokens, eager)
    offset += 1
    graph.replay()
    other = call().tokens
    assert torch.equal(out.tokens, other)


@needs_gpu
def test_gpu_sample_with_batch_seed_tensor_is_graph_capturable():
    """A 0-d device seed is expanded to per-sequence keys on the device, inside the graph."""
    from verispec.verify.workloads import sampling_workload

    w = sampling_workload(6, 3, 32000, 0.6, dtype=torch.float32, device="cuda", seed=1)
    seed, offset = torch.tensor(5, device="cuda"), torch.tensor(2, device="cuda")
    call = lambda: verify_sample(  # noqa: E731
        w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, seed=seed, offset=offset,
        max_num_draft=3, backend="triton", check_values=False,
    )
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    torch.cuda.synchronize()
    eager = verify_sample(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, seed=5, offset=2, backend="triton")
    assert torch.equal(out.tokens, eager.tokens)
