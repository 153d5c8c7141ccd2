"""The reference verifiers against an independent brute-force loop, on random ragged batches.

The brute force restates the semantics one sequence and one position at a time, with plain
Python lists for the top-k/top-p cuts, and draws its randomness from the same Philox stream
(that stream *is* part of the specification: see verispec/verify/rng.py): sequence b with its
own key seeds[b] and offset offsets[b], at local rows 0..k_b.
"""

import math

import torch
from hypothesis import given, settings, strategies as st

from ragged import batch_independence
from verispec import verify_greedy, verify_sample
from verispec.verify import rng


def brute_probs(row: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Filtered target distribution of one row, computed position by position."""
    vocab = row.shape[0]
    if temperature == 0:
        best = max(range(vocab), key=lambda v: (float(row[v]), -v))
        return torch.tensor([1.0 if v == best else 0.0 for v in range(vocab)])
    z = row.float() / temperature
    keep = [True] * vocab
    if 0 < top_k < vocab:
        kth = sorted(z.tolist(), reverse=True)[top_k - 1]
        keep = [float(z[v]) >= kth for v in range(vocab)]
    masked = torch.tensor([float(z[v]) if keep[v] else -math.inf for v in range(vocab)])
    if top_p < 1.0:
        probs = torch.softmax(masked, dim=0)
        ordered = sorted(probs.tolist(), reverse=True)
        running = torch.zeros((), dtype=torch.float32)
        threshold = ordered[-1]
        for value in ordered:
            running = running + value
            if float(running) >= top_p:
                threshold = value
                break
        masked = torch.tensor([float(masked[v]) if float(probs[v]) >= threshold else -math.inf for v in range(vocab)])
    return torch.softmax(masked, dim=0)


def brute_verify(logits, drafts, num_draft, draft_probs, temps, top_ks, top_ps, seeds, offsets):
    """seeds / offsets: one int per sequence."""
    outputs = []
    row = 0
    draft_index = 0
    for b, k in enumerate(num_draft):
        emitted = []
        for i in range(k + 1):
            p = brute_probs(logits[row], temps[b], top_ks[b], top_ps[b])
            exponentials = -torch.log(rng.uniform(seeds[b], offsets[b], i, torch.arange(p.shape[0]), rng.RACE))
            if i == k:
                emitted.append(int(p.argmax()) if temps[b] == 0 else int(torch.argmax(p / exponentials)))
                break
            x = drafts[draft_index + i]
            if draft_probs is None:
                q = torch.zeros_like(p)
                q[x] = 1.0
            else:
                q = draft_probs[draft_index + i].float()
            if temps[b] == 0:
                ok = x == int(p.argmax())
            else:
                ok = float(rng.uniform(seeds[b], offsets[b], i, 0, rng.ACCEPT)) * float(q[x]) < float(p[x])
            if ok:
                emitted.append(x)
                row += 1
                continue
            if temps[b] == 0:
                emitted.append(int(p.argmax()))
            else:
                residual = torch.clamp(p - q, min=0)
                if not bool((residual > 0).any()):
                    residual = p
                emitted.append(int(torch.argmax(residual / exponentials)))
            break
        row = sum(num_draft[: b + 1]) + b + 1
        draft_index += k
        outputs.append(emitted)
    return outputs


def as_lists(out):
    return [out.tokens[b, : int(out.num_emitted[b])].tolist() for b in range(out.tokens.shape[0])]


@st.composite
def ragged_batches(draw, max_batch=5, max_vocab=12, max_k=5):
    batch = draw(st.integers(1, max_batch))
    vocab = draw(st.integers(2, max_vocab))
    num_draft = draw(st.lists(st.integers(0, max_k), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**31))
    tied = draw(st.booleans())
    gen = torch.Generator().manual_seed(seed)
    rows = sum(num_draft) + batch
    if tied:  # few distinct values: argmax ties are common
        logits = torch.randint(0, 3, (rows, vocab), generator=gen).float()
    else:
        logits = torch.randn(rows, vocab, generator=gen) * 2
    # half the drafts copy the target argmax so that acceptance runs are long
    argmax = logits.argmax(dim=1)
    drafts, row = [], 0
    for b, k in enumerate(num_draft):
        for i in range(k):
            copy = bool(torch.rand((), generator=gen) < 0.6)
            drafts.append(int(argmax[row + i]) if copy else int(torch.randint(0, vocab, (), generator=gen)))
        row += k + 1
    return logits, drafts, num_draft, seed


@settings(max_examples=150, deadline=None)
@given(ragged_batches(), st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_greedy_matches_brute_force(batch, dtype):
    logits, drafts, num_draft, _ = batch
    logits = logits.to(dtype)
    out = verify_greedy(logits, torch.tensor(drafts, dtype=torch.int64), num_draft)
    zeros = [0] * len(num_draft)
    ones = [1.0] * len(num_draft)
    expected = brute_verify(logits.float(), drafts, num_draft, None, zeros, zeros, ones, zeros, zeros)
    assert as_lists(out) == expected
    assert out.tokens.shape == (len(num_draft), max(num_draft) + 1)
    # padding past each sequence's emitted tokens is -1
    for b in range(len(num_draft)):
        assert (out.tokens[b, int(out.num_emitted[b]) :] == -1).all()
    assert torch.equal(out.num_emitted, out.num_accepted + 1)


@settings(max_examples=120, deadline=None)
@given(
    ragged_batches(),
    st.booleans(),
    st.booleans(),
    st.data(),
)
def test_sample_matches_brute_force(batch, with_draft_probs, per_sequence, data):
    logits, drafts, num_draft, seed = batch
    size, vocab = len(num_draft), logits.shape[1]
    temps = data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.7]), min_size=size, max_size=size))
    top_ks = data.draw(st.lists(st.sampled_from([0, 1, 2, max(1, vocab // 2)]), min_size=size, max_size=size))
    top_ps = data.draw(st.lists(st.sampled_from([1.0, 0.9, 0.55]), min_size=size, max_size=size))
    if per_sequence:  # one key and one offset per sequence, any 64-bit pattern for the key
        seeds = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=size, max_size=size))
        offsets = data.draw(st.lists(st.integers(0, 1000), min_size=size, max_size=size))
        stream = dict(seed=torch.tensor(seeds), offset=torch.tensor(offsets))
    else:  # one batch seed, expanded by SplitMix64; one shared offset
        offset = data.draw(st.integers(0, 1000))
        seeds, offsets = rng.sequence_seeds(seed, size).tolist(), [offset] * size
        stream = dict(seed=seed, offset=offset)
    draft_probs = None
    if with_draft_probs:
        gen = torch.Generator().manual_seed(seed + 1)
        draft_probs = torch.softmax(torch.randn(len(drafts), vocab, generator=gen) * 2, dim=1)
    out = verify_sample(
        logits, torch.tensor(drafts, dtype=torch.int64), num_draft, draft_probs,
        temperature=torch.tensor(temps), top_k=torch.tensor(top_ks), top_p=torch.tensor(top_ps), **stream,
    )
    expected = brute_verify(logits, drafts, num_draft, draft_probs, temps, top_ks, top_ps, seeds, offsets)
    assert as_lists(out) == expected
    # every emitted token has positive probability under the filtered target distribution
    row = 0
    for b, k in enumerate(num_draft):
        for i, token in enumerate(expected[b]):
            p = brute_probs(logits[row + i], temps[b], top_ks[b], top_ps[b])
            assert float(p[token]) > 0
        row += k + 1


def test_sample_is_reproducible_per_seed_and_generator():
    torch.manual_seed(0)
    logits = torch.randn(9, 50)
    drafts = torch.randint(0, 50, (6,))
    a = verify_sample(logits, drafts, [3, 0, 3], seed=7)
    b = verify_sample(logits, drafts, [3, 0, 3], seed=7)
    assert torch.equal(a.tokens, b.tokens)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(verify_sample(logits, drafts, [3, 0, 3], generator=g1).tokens,
                       verify_sample(logits, drafts, [3, 0, 3], generator=g2).tokens)
    # different offsets draw different streams
    outs = {tuple(verify_sample(logits, drafts, [3, 0, 3], seed=7, offset=o).tokens.flatten().tolist()) for o in range(20)}
    assert len(outs) > 1


def test_sequence_tokens_do_not_depend_on_the_batch():
    """Per-sequence seeds: a sequence alone (B = 1) and at a random row of a larger ragged batch
    emits the same tokens, for 80 random sequences, seeds and neighbourhoods."""
    mismatches, accepted = batch_independence(trials=80, vocab=30, max_k=6, max_others=5, backend="torch",
                                              device="cpu", gen_seed=0)
    assert mismatches == 0
    assert accepted > 40  # acceptance runs were exercised, not only first-position rejections


def test_scalar_seed_gives_each_sequence_its_own_stream():
    """Identical sequences in one call with one batch seed draw different numbers (the chi-square
    tests rely on it), and the batch seed means exactly the keys rng.sequence_seeds(S, B)."""
    torch.manual_seed(2)
    logits = torch.randn(2, 40).repeat(64, 1)  # 64 copies of one sequence with k = 1
    drafts = torch.full((64,), 3)
    out = verify_sample(logits, drafts, [1] * 64, seed=5, offset=2)
    assert len(set(map(tuple, out.tokens.tolist()))) > 4
    keys = verify_sample(logits, drafts, [1] * 64, seed=rng.sequence_seeds(5, 64), offset=torch.full((64,), 2))
    assert torch.equal(out.tokens, keys.tokens)
    # a 0-d tensor batch seed is expanded the same way (on its device)
    assert torch.equal(verify_sample(logits, drafts, [1] * 64, seed=torch.tensor(5), offset=2).tokens, out.tokens)


def test_temperature_zero_rows_equal_greedy_in_mixed_batch():
    torch.manual_seed(1)
    logits = torch.randn(12, 30)
    drafts = logits.argmax(dim=1)[[0, 1, 2, 4, 5, 6, 8, 9, 10]]
    drafts[4] = (drafts[4] + 1) % 30
    num_draft = [3, 3, 3]
    greedy = verify_greedy(logits, drafts, num_draft)
    mixed = verify_sample(logits, drafts, num_draft, temperature=torch.tensor([0.0, 1.0, 0.0]), seed=1)
    assert torch.equal(mixed.tokens[0], greedy.tokens[0])
    assert torch.equal(mixed.tokens[2], greedy.tokens[2])


def test_greedy_known_cases():
    # perfect match: all drafts accepted, bonus from the last row
    logits = torch.tensor([[0.0, 9, 0], [0, 0, 9], [9, 0, 0]])
    out = verify_greedy(logits, torch.tensor([1, 2]), [2])
    assert out.tokens.tolist() == [[1, 2, 0]] and out.num_accepted.tolist() == [2]
    # early mismatch: the target argmax replaces the first wrong draft
    out = verify_greedy(logits, torch.tensor([0, 2]), [2])
    assert out.tokens.tolist() == [[1, -1, -1]] and out.num_accepted.tolist() == [0]
    # ties break to the lowest index like torch.argmax
    tie = torch.tensor([[5.0, 5.0, 1.0]])
    assert verify_greedy(tie, torch.tensor([], dtype=torch.int64), [0]).tokens.tolist() == [[0]]
