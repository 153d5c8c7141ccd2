"""``FakeModel`` (tests/fakes.py) keeps the runtime contract: verify == token-by-token decode,
rollback and keep are visible to later passes, truncated shares weights."""
import pytest
import torch

from fakes import FakeModel, fresh_states


def test_verify_equals_token_by_token_decode():
    m = FakeModel(seed=1)
    m.setup_cache(2, 32)
    m.prefill([[1, 2, 3], [4, 5]])
    block = m.append(torch.tensor([[7, 8, 9], [10, 11, 12]]))
    m2 = FakeModel(seed=1)
    m2.setup_cache(2, 32)
    m2.prefill([[1, 2, 3], [4, 5]])
    steps = torch.cat([m2.decode(torch.tensor([[7], [10]])), m2.decode(torch.tensor([[8], [11]])),
                       m2.decode(torch.tensor([[9], [12]]))], dim=1)
    torch.testing.assert_close(block, steps, rtol=0, atol=1e-6)
    assert m.lengths.tolist() == [6, 5]


def test_rollback_is_visible_to_the_next_pass():
    m = FakeModel(seed=2)
    m.setup_cache(1, 32)
    m.prefill([[1, 2, 3]])
    m.append(torch.tensor([[4, 5, 6]]))
    m.rollback(torch.tensor([4]))               # keep token 4 only
    after = m.decode(torch.tensor([[9]]))[0, 0]
    ref = FakeModel(seed=2)
    ref.setup_cache(1, 32)
    ref.prefill([[1, 2, 3, 4]])
    torch.testing.assert_close(after, ref.decode(torch.tensor([[9]]))[0, 0], rtol=0, atol=1e-6)
    # a stale read would differ: decoding 9 after 4, 5, 6 gives other logits
    stale = FakeModel(seed=2)
    stale.setup_cache(1, 32)
    stale.prefill([[1, 2, 3, 4, 5, 6]])
    assert not torch.allclose(after, stale.decode(torch.tensor([[9]]))[0, 0])


def test_keep_and_truncated():
    m = FakeModel(seed=3)
    m.setup_cache(3, 16)
    m.prefill([[1], [2, 3], [4, 5, 6]])
    m.keep(torch.tensor([2, 0]))
    assert m.lengths.tolist() == [3, 1]
    torch.testing.assert_close(m.committed_states(0, 3), fresh_states(m, [4, 5, 6]))
    t = m.truncated(1)
    assert t.config.num_layers == 1 and t.w is m.w
    with pytest.raises(ValueError):
        m.append(torch.zeros(2, 20, dtype=torch.long))
