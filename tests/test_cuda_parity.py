"""GPU parity of the verification kernels (verispec.verify.cuda, backend="cuda") against the reference.

Every kernel version (each argmax version x each scan; each sampling race split) is checked on fresh
random ragged batches and on the edges: k_b = 0, k_b = 32 and > 32 (the ballot scan's loop), V not a
multiple of the block size, of a vocabulary chunk or of the 16-byte vector, ties in the target logits
(lowest index wins, as torch.argmax), B = 1 and B = 256 at V = 128256. Outputs come from the caching
allocator after it was filled with a poison value, and must contain no poison; the status word of clean
inputs is 0. The status bits on bad inputs: tests/test_cuda_status.py.

Sampling: every race split (one block per sequence, or the race spread over vocabulary chunks) gives
the same tokens bit for bit. The kernel draws the reference's Philox numbers (per sequence: its own key and offset,
at rows local to it), so tokens match for the same seeds/offsets except at near-ties, where float rounding differs (the softmax sum is accumulated
in another order, and expf/logf differ by an ulp from torch's CPU versions): an accept test
with u * q(x) within an ulp of p(x), or two race keys within an ulp. Those are rare (about
one in 10^5 tests); the tests allow a tiny fraction, and a chi-square test checks that the
first emitted token follows p (tests/stats.py).
"""

from __future__ import annotations

import pytest
import torch

from verispec import verify_greedy, verify_sample
from verispec.verify.reference import reference_verify_greedy
from verispec.verify.api import canonical_batch
from stats import chi2_pvalue
from verispec.verify.workloads import greedy_workload, sampling_workload
from cuda_batch import ragged_batch
from ragged import batch_independence

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

POISON = -123456789
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
GREEDY = ["naive", "ballot", "segment"]


def _poison_allocator() -> None:
    """Fill cached allocator blocks (small and large pools) with POISON, then free them."""
    torch.cuda.synchronize()
    bufs = [torch.full((n,), POISON, dtype=torch.int32, device="cuda") for n in [1 << 15] * 16 + [1 << 20] * 4]
    torch.cuda.synchronize()
    del bufs


def _assert_written(*tensors: torch.Tensor) -> None:
    for t in tensors:
        assert not bool((t == POISON).any()), "an output element was never written"


def _cuda_greedy(logits, drafts, num_draft, variant):
    """Every argmax version with the given scan variant; all must agree (and report a clean status)."""
    from verispec.verify.cuda import ARGMAX_VARIANTS, verify_greedy_cuda

    batch = canonical_batch(logits, drafts, num_draft, None, True)
    outs = []
    for argmax in ARGMAX_VARIANTS:
        _poison_allocator()
        out = verify_greedy_cuda(batch, variant=variant, argmax=argmax)
        torch.cuda.synchronize()
        _assert_written(out.tokens, out.num_accepted, out.num_emitted, out.status)
        assert not bool(out.status.any()), f"argmax {argmax}: status {out.status.tolist()} on clean inputs"
        if outs:
            _assert_same(out, outs[0])
        outs.append(out)
    return outs[0]


def _assert_same(out, ref):
    assert torch.equal(out.num_accepted.cpu(), ref.num_accepted.cpu().to(torch.int32))
    assert torch.equal(out.num_emitted.cpu(), ref.num_emitted.cpu().to(torch.int32))
    assert torch.equal(out.tokens.cpu(), ref.tokens.cpu())


def _random_ragged(batch, max_k, vocab, dtype, alpha, gen_seed):
    g = torch.Generator().manual_seed(gen_seed)
    num_draft = torch.randint(0, max_k + 1, (batch,), generator=g).tolist()
    w = greedy_workload(batch, num_draft, vocab, alpha, dtype=dtype, device="cuda", seed=gen_seed)
    return w


# ---- greedy --------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", GREEDY)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [111, 1000, 4097, 32000 + 3])
def test_greedy_random_ragged(variant, dtype, vocab):
    for trial in range(3):
        w = _random_ragged(37, 12, vocab, dtype, alpha=0.7, gen_seed=trial * 100 + vocab)
        out = _cuda_greedy(w.target_logits, w.draft_tokens, w.num_draft, variant)
        ref = reference_verify_greedy(w.target_logits.cpu(), w.draft_tokens.cpu(), w.num_draft.cpu(), int(w.num_draft.max()))
        _assert_same(out, ref)
        _assert_same(out, w.expected)


@pytest.mark.parametrize("variant", GREEDY)
@pytest.mark.parametrize("num_draft", [[0], [0, 0, 0], [32] * 5, [33, 0, 70, 1, 64], [31, 32, 33]])
@pytest.mark.parametrize("alpha", [0.0, 0.95, 1.0])
def test_greedy_edges_k(variant, num_draft, alpha):
    w = greedy_workload(len(num_draft), num_draft, 5003, alpha, dtype=torch.bfloat16, device="cuda", seed=len(num_draft))
    out = _cuda_greedy(w.target_logits, w.draft_tokens, w.num_draft, variant)
    _assert_same(out, w.expected)
    if alpha == 1.0:
        assert out.num_accepted.cpu().tolist() == num_draft


@pytest.mark.parametrize("variant", GREEDY)
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_ties_lowest_index(variant, dtype):
    g = torch.Generator().manual_seed(7)
    batch, vocab = 64, 2053
    num_draft = torch.randint(0, 9, (batch,), generator=g)
    rows = int(num_draft.sum()) + batch
    logits = torch.randint(0, 3, (rows, vocab), generator=g).to(dtype)  # many maxima per row
    first_max = logits.float().argmax(dim=-1)
    last_max = vocab - 1 - logits.float().flip(-1).argmax(dim=-1)  # a tied max at a higher index
    draft_rows = [r for b, k in enumerate(num_draft.tolist()) for r in range(int(num_draft[:b].sum()) + b, int(num_draft[:b].sum()) + b + k)]
    pick_first = torch.rand(len(draft_rows), generator=g) < 0.8
    drafts = torch.where(pick_first, first_max[draft_rows], last_max[draft_rows])
    logits, drafts = logits.cuda(), drafts.cuda()
    out = _cuda_greedy(logits, drafts, num_draft, variant)
    ref = reference_verify_greedy(logits.cpu(), drafts.cpu(), num_draft, int(num_draft.max()))
    _assert_same(out, ref)


@pytest.mark.parametrize("variant", GREEDY)
@pytest.mark.parametrize("batch", [1, 256])
def test_greedy_llama_vocab(variant, batch):
    w = greedy_workload(batch, 8, 128256, 0.6, dtype=torch.bfloat16, device="cuda", seed=batch)
    out = _cuda_greedy(w.target_logits, w.draft_tokens, w.num_draft, variant)
    _assert_same(out, w.expected)
    # the public API (default variant) agrees too
    _assert_same(verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, backend="cuda"), w.expected)


def test_greedy_unaligned_rows_and_strided_view():
    # a row stride that breaks 16-byte alignment of every row start: head/tail scalar paths
    base = torch.randn(21, 1003 + 5, device="cuda").to(torch.float16)
    logits = base[:, 5:]  # last dim contiguous, row stride 1008, start offset 10 bytes
    num_draft = torch.tensor([3, 0, 5, 9], dtype=torch.int32)
    drafts = logits.float().argmax(-1)[:17].clone()  # not the right rows: some accept, most reject
    out = _cuda_greedy(logits, drafts, num_draft, "ballot")
    ref = reference_verify_greedy(logits.cpu(), drafts.cpu(), num_draft, 9)
    _assert_same(out, ref)


def test_greedy_scan_only_and_argmax():
    from verispec.verify.cuda import greedy_scan_cuda, target_argmax_cuda

    w = greedy_workload(64, 8, 32000, 0.6, dtype=torch.bfloat16, device="cuda", seed=3)
    am = target_argmax_cuda(w.target_logits)
    assert torch.equal(am.long().cpu(), w.target_logits.float().argmax(-1).cpu())
    batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, None, True)
    for variant in GREEDY:
        out = greedy_scan_cuda(am, batch, variant)
        _assert_same(out, w.expected)
        assert not bool(out.status.any())


@pytest.mark.parametrize("version", ["v2", "v3", "v3-t512", "v3-u16"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_versions_ties_and_minus_inf(version, dtype):
    from verispec.verify.cuda import target_argmax_cuda, target_argmax_partial_cuda

    g = torch.Generator().manual_seed(len(version))
    for vocab in [1, 7, 100, 4096 * 3 + 5, 128256]:
        logits = torch.randint(-2, 2, (9, vocab), generator=g).float()
        logits[0] = float("-inf")  # all -inf: torch says 0
        logits[1, : vocab // 2] = float("-inf")
        logits = logits.to(dtype).cuda()
        expected = logits.float().argmax(-1).cpu()
        assert torch.equal(target_argmax_cuda(logits, version).long().cpu(), expected)
        vals, idx, flags = target_argmax_partial_cuda(logits, version)  # split-V path
        chunks = idx.numel() // logits.shape[0]
        vals, idx = vals.view(9, chunks).cpu(), idx.view(9, chunks).cpu()
        best = torch.tensor([int(idx[r][vals[r] == vals[r].max()].min()) for r in range(9)])
        assert torch.equal(best, expected)
        assert not bool(flags.any()), "no NaN / +inf here: every partial's status bits are 0"


@pytest.mark.parametrize("argmax", ["v3", "bal-t256-u8", "bal-t1024-u4"])
@pytest.mark.parametrize("shape", [(1, 0, 128256), (3, 5, 4099), (200, 4, 111), (40, 8, 32003)])
def test_greedy_balanced_and_chunked_layouts(argmax, shape):
    """Row / block boundaries of every kind: a row spread over many blocks (B = 1), blocks spanning many
    rows (V = 111), V not a multiple of 64 (rows start at odd offsets of the flattened slices)."""
    from verispec.verify.cuda import verify_greedy_cuda

    batch_size, k, vocab = shape
    for trial in range(3):
        g = torch.Generator().manual_seed(trial)
        num_draft = torch.randint(0, k + 1, (batch_size,), generator=g).tolist()
        w = greedy_workload(batch_size, num_draft, vocab, 0.7, dtype=torch.float32, device="cuda", seed=trial)
        batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, k, True)
        for variant in GREEDY:
            out = verify_greedy_cuda(batch, variant=variant, argmax=argmax)
            ref = reference_verify_greedy(w.target_logits, w.draft_tokens, w.num_draft, k)
            _assert_same(out, ref)
            assert not bool(out.status.any())


def test_greedy_cuda_graph_replay():
    from verispec.verify.cuda import verify_greedy_cuda

    w = greedy_workload(16, 8, 32000, 0.6, dtype=torch.bfloat16, device="cuda", seed=11)
    batch = canonical_batch(w.target_logits, w.draft_tokens, w.num_draft, 8, False)
    verify_greedy_cuda(batch)  # build + warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = verify_greedy_cuda(batch)
    w2 = greedy_workload(16, 8, 32000, 0.3, dtype=torch.bfloat16, device="cuda", seed=12)
    batch.target_logits.copy_(w2.target_logits)
    batch.draft_tokens.copy_(w2.draft_tokens)
    graph.replay()
    torch.cuda.synchronize()
    _assert_same(out, w2.expected)
    assert not bool(out.status.any())
    batch.target_logits[3, 7] = float("nan")  # the status is computed on replay too
    graph.replay()
    assert out.status.cpu().tolist()[0] == 1  # NAN (row 3 is sequence 0's)


# ---- sampling ------------------------------------------------------------------------------
def _on(value, device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


RACE_SPLITS = [0, 1, 8, 64]  # race_blocks_per_sm: 0 = one block per sequence; N = about N blocks an SM


def _expanded(value, batch: int, scalar_to_tensor):
    return value if isinstance(value, torch.Tensor) else scalar_to_tensor(value, batch)


def _sample_both(logits, drafts, num_draft, q, temperature, seed, offset=0):
    """seed / offset: ints (one for the batch) or [B] tensors (one per sequence). Every race split of the
    kernel gives the public call's tokens bit for bit; returns (the public call's output, the reference's)."""
    from verispec.verify.cuda import verify_sample_cuda

    _poison_allocator()
    out = verify_sample(logits, drafts, num_draft, q, backend="cuda", temperature=_on(temperature, "cuda"),
                        seed=_on(seed, "cuda"), offset=_on(offset, "cuda"))
    torch.cuda.synchronize()
    _assert_written(out.tokens, out.num_accepted, out.num_emitted)
    batch_size = len(num_draft)
    temps = temperature if isinstance(temperature, torch.Tensor) else torch.full((batch_size,), float(temperature))
    batch = ragged_batch(logits, drafts, num_draft, out.tokens.shape[1] - 1, draft_probs=q, temperature=temps,
                         seed=seed, offset=_expanded(offset, batch_size, lambda v, n: torch.full((n,), v)))
    for split in RACE_SPLITS:
        _poison_allocator()
        other = verify_sample_cuda(batch, race_blocks_per_sm=split)
        torch.cuda.synchronize()
        _assert_written(other.tokens, other.num_accepted, other.num_emitted, other.status)
        _assert_same(other, out)
        assert not bool(other.status.any()), f"split {split}: status {other.status.tolist()} on clean inputs"
    ref = verify_sample(logits.cpu(), drafts.cpu(), num_draft.cpu(), None if q is None else q.cpu(), backend="torch",
                        temperature=_on(temperature, "cpu"), seed=_on(seed, "cpu"), offset=_on(offset, "cpu"))
    return out, ref


def _mismatching_sequences(out, ref) -> int:
    same = (out.tokens.cpu() == ref.tokens.cpu()).all(dim=1) & (out.num_accepted.cpu() == ref.num_accepted.cpu())
    return int((~same).sum())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("alpha", [0.3, 0.9])
def test_sample_matches_reference(dtype, with_q, alpha):
    total, bad = 0, 0
    for trial in range(2):
        w = sampling_workload(48, [0, 1, 3, 8, 33, 5] * 8, 3001, alpha, dtype=dtype, device="cuda",
                              seed=trial, draft_probs=with_q)
        g = torch.Generator().manual_seed(trial)  # per-sequence keys over the whole 64-bit range
        seeds = torch.randint(-(2**63), 2**63 - 1, (w.batch_size,), generator=g)
        offsets = torch.randint(0, 2**40, (w.batch_size,), generator=g)
        out, ref = _sample_both(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, 1.0, seed=seeds, offset=offsets)
        total += w.batch_size
        bad += _mismatching_sequences(out, ref)
    assert bad <= max(1, total // 100), f"{bad}/{total} sequences differ from the reference (near-ties only expected)"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_mixed_temperature_and_greedy_rows(dtype):
    g = torch.Generator().manual_seed(5)
    batch, vocab = 64, 5000
    num_draft = torch.randint(0, 10, (batch,), generator=g)
    rows = int(num_draft.sum()) + batch
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(dtype).cuda()
    drafts = torch.randint(0, vocab, (int(num_draft.sum()),), generator=g).cuda()
    # draft the target's top token most of the time so that some drafts are accepted
    top = logits.float().argmax(-1)
    starts = torch.cumsum(num_draft, 0) - num_draft
    draft_rows = torch.cat([torch.arange(int(s), int(s) + int(k)) + b for b, (s, k) in enumerate(zip(starts, num_draft))])
    keep = torch.rand(draft_rows.shape[0], generator=g) < 0.7
    drafts = torch.where(keep.cuda(), top[draft_rows.cuda()], drafts)
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.7] * (batch // 4))
    out, ref = _sample_both(logits, drafts, num_draft, None, temperature.cuda(), seed=99)
    bad = _mismatching_sequences(out, ref)
    assert bad <= 1, f"{bad}/{batch} sequences differ"
    greedy = temperature == 0
    assert torch.equal(out.tokens.cpu()[greedy], ref.tokens.cpu()[greedy])  # T = 0 rows: exact


def test_sample_llama_vocab():
    w = sampling_workload(32, 8, 128256, 0.6, dtype=torch.bfloat16, device="cuda", seed=2)
    out, ref = _sample_both(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, 1.0, seed=7)
    assert _mismatching_sequences(out, ref) <= 1


def test_sample_batch_seed_matches_reference():
    """One int seed for the batch: expanded to per-sequence keys the same way on both backends."""
    w = sampling_workload(40, [0, 2, 5, 9] * 10, 2000, 0.7, dtype=torch.float32, device="cuda", seed=4, draft_probs=True)
    out, ref = _sample_both(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, 0.9, seed=31, offset=6)
    assert _mismatching_sequences(out, ref) <= 1


def test_sample_sequence_tokens_do_not_depend_on_the_batch():
    """Per-sequence seeds: a sequence alone and inside a larger ragged batch emits the same tokens.
    The vocabulary split of the row statistics follows the batch's row count, so the softmax sums
    may round differently: a near-tie may flip (as against the reference), nothing more."""
    mismatches, accepted = batch_independence(trials=100, vocab=3001, max_k=8, max_others=12, backend="cuda",
                                              device="cuda", gen_seed=3, filters=False)
    assert mismatches <= 1, f"{mismatches}/100 sequences changed with their batch"
    assert accepted > 100


def test_sample_first_token_chi_square():
    """The first emitted token follows p, whatever q: chi-square over 20000 independent rows."""
    batch, vocab, k = 20000, 12, 1
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(vocab, generator=g), 0)
    q = torch.softmax(torch.randn(vocab, generator=g) * 2, 0)
    drafts = torch.multinomial(q, batch, replacement=True, generator=g)
    rows = torch.stack([p.log()] * 2).repeat(batch, 1)  # per sequence: draft row, bonus row
    q_rows = q.expand(batch, vocab).contiguous()
    num_draft = torch.full((batch,), k, dtype=torch.int32)
    out = verify_sample(rows.cuda(), drafts.cuda(), num_draft, q_rows.cuda(), backend="cuda", seed=2026)
    first = out.tokens[:, 0].long().cpu()
    pvalue = chi2_pvalue(torch.bincount(first, minlength=vocab), p)
    assert pvalue > 1e-4, f"p = {pvalue:.2e}: first tokens do not follow p"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_dtype", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1000, 4097, 32003, 128256])
def test_sample_split_random_ragged(dtype, q_dtype, vocab):
    """The split race against the reference on random ragged batches: B = 1 included, k_b = 0 included, V not a
    multiple of a race chunk, temperatures mixed with greedy rows; every split gives the same tokens."""
    total = bad = 0
    for trial, batch_size in enumerate([1, 2, 7, 33]):
        g = torch.Generator().manual_seed(trial * 1000 + vocab)
        num_draft = torch.randint(0, 6, (batch_size,), generator=g)
        num_draft[0] = 0 if trial % 2 else num_draft[0]
        w = sampling_workload(batch_size, num_draft.tolist(), vocab, 0.7, dtype=dtype, device="cuda", seed=trial,
                              draft_probs=q_dtype is not None)
        q = None if q_dtype is None else w.draft_probs.to(q_dtype)
        temperature = torch.tensor([0.0, 1.0, 0.7, 1.3])[torch.randint(0, 4, (batch_size,), generator=g)]
        seeds = torch.randint(-(2**63), 2**63 - 1, (batch_size,), generator=g)
        out, ref = _sample_both(w.target_logits, w.draft_tokens, w.num_draft, q, temperature, seed=seeds,
                                offset=torch.randint(0, 2**32, (batch_size,), generator=g))
        total += batch_size
        bad += _mismatching_sequences(out, ref)
    assert bad <= 1, f"{bad}/{total} sequences differ from the reference (near-ties only expected)"


def test_sample_cuda_graph_replay():
    """The sampling launches capture into a CUDA graph; a replay on new logits gives the eager call's tokens."""
    from verispec.verify.cuda import verify_sample_cuda

    w = sampling_workload(8, 4, 32000, 0.6, device="cuda", seed=1)
    batch = ragged_batch(w.target_logits, w.draft_tokens, w.num_draft, 4, draft_probs=w.draft_probs, seed=5)
    verify_sample_cuda(batch)  # build + warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = verify_sample_cuda(batch)
    w2 = sampling_workload(8, 4, 32000, 0.3, device="cuda", seed=2)
    batch.target_logits.copy_(w2.target_logits)
    batch.draft_tokens.copy_(w2.draft_tokens)
    batch.draft_probs.copy_(w2.draft_probs)
    graph.replay()
    torch.cuda.synchronize()
    _assert_same(out, verify_sample_cuda(batch))
    assert not bool(out.status.any())


def test_sample_top_k_not_implemented():
    w = sampling_workload(4, 2, 100, 0.5, device="cuda", seed=0)
    with pytest.raises(NotImplementedError, match="top-k / top-p"):
        verify_sample(w.target_logits, w.draft_tokens, w.num_draft, w.draft_probs, backend="cuda", top_k=5, seed=1)
