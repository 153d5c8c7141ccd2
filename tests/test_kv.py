import torch
from hypothesis import given, settings, strategies as st

from dev.kv.kv import compact_kv, exclusive_cumsum, rollback_lengths, scatter_to_cache


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
    import pytest

    cache = torch.zeros(1, 4, 2)
    with pytest.raises(ValueError, match="cache overflow"):
        scatter_to_cache(cache, torch.tensor([3]), torch.zeros(3, 2), torch.tensor([3]), torch.tensor([2]), backend="torch")


def test_public_kv_functions_check_values_on_every_backend():
    import pytest

    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match="num_rows sums to"):
            compact_kv(torch.zeros(5, 2), torch.tensor([2, 2]), torch.tensor([1, 1]), backend=backend)
        with pytest.raises(ValueError, match="num_emitted must satisfy"):
            compact_kv(torch.zeros(4, 2), torch.tensor([2, 2]), torch.tensor([3, 1]), backend=backend)
        with pytest.raises(ValueError, match="cache overflow"):
            scatter_to_cache(torch.zeros(1, 4, 2), torch.tensor([3]), torch.zeros(3, 2), torch.tensor([3]),
                             torch.tensor([2]), backend=backend)
