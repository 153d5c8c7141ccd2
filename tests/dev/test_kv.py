"""dev/kv: the KV compaction layout (torch reference) and its Triton kernels (CPU under
TRITON_INTERPRET=1, or a CUDA GPU)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from dev.kv import kv
from dev.kv.kv import compact_kv, exclusive_cumsum, rollback_lengths, scatter_to_cache
from dev.kv.kv_compact_triton import compact_kv_triton, scatter_to_cache_triton
from triton_interpreter import DEVICE



def test_exclusive_cumsum_example():
    assert exclusive_cumsum(torch.tensor([2, 1, 3])).tolist() == [0, 2, 3, 6]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=6), st.integers(0, 10**6))
def test_compact_and_scatter_follow_the_layout(num_rows, seed):
    gen = torch.Generator().manual_seed(seed)
    num_rows_t = torch.tensor(num_rows)
    num_emitted = torch.tensor([int(torch.randint(1, n + 1, (), generator=gen)) for n in num_rows])
    new_kv = torch.randn(sum(num_rows), 2, 3, generator=gen)
    packed, cu = compact_kv(new_kv, num_rows_t, num_emitted, backend="torch")
    starts = [0] + list(torch.cumsum(num_rows_t, 0)[:-1].tolist())
    expected = torch.cat([new_kv[s : s + int(e)] for s, e in zip(starts, num_emitted)])
    assert cu.tolist() == [0] + torch.cumsum(num_emitted, 0).tolist()
    assert torch.equal(packed[: int(cu[-1])], expected)
    cache = torch.full((len(num_rows), 16, 2, 3), float("nan"))
    lens = torch.tensor([int(torch.randint(0, 4, (), generator=gen)) for _ in num_rows])
    new_lens = scatter_to_cache(cache, lens, new_kv, num_rows_t, num_emitted, backend="torch")
    assert torch.equal(new_lens, lens + num_emitted)
    for b in range(len(num_rows)):
        written = cache[b, int(lens[b]) : int(new_lens[b])]
        assert torch.equal(written, new_kv[starts[b] : starts[b] + int(num_emitted[b])])
        assert torch.isnan(cache[b, : int(lens[b])]).all() and torch.isnan(cache[b, int(new_lens[b]) :]).all()
    assert torch.equal(rollback_lengths(lens, num_emitted), new_lens)


def test_scatter_overflow_is_an_error():
    cache = torch.zeros(1, 4, 2)
    with pytest.raises(ValueError, match="cache overflow"):
        scatter_to_cache(cache, torch.tensor([3]), torch.zeros(3, 2), torch.tensor([3]), torch.tensor([2]), backend="torch")


def test_public_kv_functions_check_values_on_every_backend():
    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match="num_rows sums to"):
            compact_kv(torch.zeros(5, 2), torch.tensor([2, 2]), torch.tensor([1, 1]), backend=backend)
        with pytest.raises(ValueError, match="num_emitted must satisfy"):
            compact_kv(torch.zeros(4, 2), torch.tensor([2, 2]), torch.tensor([3, 1]), backend=backend)
        with pytest.raises(ValueError, match="cache overflow"):
            scatter_to_cache(torch.zeros(1, 4, 2), torch.tensor([3]), torch.zeros(3, 2), torch.tensor([3]),
                             torch.tensor([2]), backend=backend)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    num_rows=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    trailing=st.sampled_from([(3,), (2, 8), (4, 5), (1,)]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int8]),
    seed=st.integers(0, 2**31 - 1),
)
def test_kv_compaction_matches_reference(num_rows, trailing, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.tensor(num_rows, dtype=torch.int32)
    emitted = (torch.rand(len(num_rows), generator=gen) * (rows + 1)).long().clamp(1).int()
    emitted = torch.minimum(emitted, rows)
    new_kv = (torch.randn(int(rows.sum()), *trailing, generator=gen) * 50).to(dtype)
    expected = kv.reference_compact_kv(new_kv, rows, emitted)
    packed, cu = compact_kv_triton(new_kv.to(DEVICE), rows.to(DEVICE), emitted.to(DEVICE))
    assert torch.equal(packed[: expected.shape[0]].cpu(), expected)
    assert torch.equal(cu.cpu(), kv.exclusive_cumsum(emitted))

    max_len = 20
    lens = (torch.rand(len(num_rows), generator=gen) * (max_len - 9)).long()
    cache = (torch.randn(len(num_rows), max_len, *trailing, generator=gen) * 50).to(dtype)
    want = cache.clone()
    want_lens = kv.reference_scatter_to_cache(want, lens, expected, emitted)
    got = cache.to(DEVICE)
    got_lens = scatter_to_cache_triton(got, lens.to(DEVICE), new_kv.to(DEVICE), rows.to(DEVICE), emitted.to(DEVICE))
    assert torch.equal(got.cpu(), want)  # kept rows written, everything else untouched
    assert torch.equal(got_lens.cpu(), want_lens)
