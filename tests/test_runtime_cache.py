"""Static-cache semantics of verispec.runtime.Model on CPU: verify == sequential decode, rollback,
ragged prefill, keep, truncated; plus the named shapes' parameter counts."""
import pytest
import torch

from verispec.runtime import ModelConfig, load_model, named_shape

# awkward sizes on purpose: V=111, G=3 query heads per KV head, Qwen2 bias + Llama-3 RoPE scaling
CFG = ModelConfig(vocab_size=111, num_layers=3, hidden_size=48, num_heads=6, num_kv_heads=2, head_dim=8,
                  intermediate_size=80, rope_theta=10000.0, attention_bias=True,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=16))
TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def model():
    return load_model(CFG, device="cpu", seed=3)


def rand_tokens(*shape, seed=0):
    return torch.randint(0, CFG.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def prompts(lens, seed=0):
    return [rand_tokens(n, seed=seed + i).tolist() for i, n in enumerate(lens)]


def test_random_weights_are_finite_and_not_degenerate(model):
    model.setup_cache(2, 32)
    logits = model.prefill(prompts([4, 7]))
    assert logits.shape == (2, CFG.vocab_size) and torch.isfinite(logits).all()
    assert logits.std() > 1e-3 and not torch.equal(logits[0], logits[1])


@pytest.mark.parametrize("k", [1, 3, 8])
def test_verify_equals_sequential_decode(model, k):
    ps, block = prompts([5, 11, 2]), rand_tokens(3, k, seed=9)
    model.setup_cache(3, 40)
    model.prefill(ps)
    packed = model.append(block)                                   # [3, k, V]
    assert model.lengths.tolist() == [5 + k, 11 + k, 2 + k]
    model.setup_cache(3, 40)
    model.prefill(ps)
    steps = torch.cat([model.decode(block[:, i:i + 1]) for i in range(k)], dim=1)
    torch.testing.assert_close(packed, steps, **TOL)


def test_rollback_then_redecode_reproduces_logits(model):
    model.setup_cache(2, 40)
    model.prefill(prompts([6, 3]))
    first = model.append(rand_tokens(2, 5, seed=4))
    model.rollback(torch.tensor([6 + 2, 3 + 0]))                   # keep 2 and 0 of the 5 drafted tokens
    assert model.lengths.tolist() == [8, 3]
    again = model.append(rand_tokens(2, 5, seed=4)[:, :1])
    # seq 1 re-scores drafted token 0 at the same position -> same logits; seq 0 scores it at position 8
    torch.testing.assert_close(again[1, 0], first[1, 0], **TOL)
    model.rollback(torch.tensor([8, 3]))
    redo = model.append(rand_tokens(2, 5, seed=4)[:, 2:5])         # seq 0: tokens 2..4 at their old positions
    torch.testing.assert_close(redo[0], first[0, 2:5], **TOL)


def test_outputs_are_ordinary_tensors(model):
    """Logits and lengths can be edited in place outside inference mode (no inference tensors leak out)."""
    model.setup_cache(1, 16)
    logits = model.prefill(prompts([3]))
    logits.div_(2.0)
    model.append(rand_tokens(1, 2)).add_(1.0)
    model.lengths.sub_(0)
    assert not logits.is_inference() and not logits.requires_grad


def test_rollback_never_grows(model):
    model.setup_cache(1, 16)
    model.prefill(prompts([4]))
    model.rollback(torch.tensor([10]))
    assert model.lengths.tolist() == [4]


def test_ragged_prefill_equals_single_prefill(model):
    lens = [7, 1, 12]
    ps = prompts(lens, seed=20)
    model.setup_cache(3, 24)
    batched = model.prefill(ps)
    nxt = rand_tokens(3, 2, seed=5)
    batched_next = model.append(nxt)
    for b in range(3):
        model.setup_cache(1, 24)
        torch.testing.assert_close(model.prefill([ps[b]])[0], batched[b], **TOL)
        torch.testing.assert_close(model.append(nxt[b:b + 1])[0], batched_next[b], **TOL)


def test_keep_preserves_continuations(model):
    ps, block = prompts([3, 8, 5, 6], seed=30), rand_tokens(4, 2, seed=6)
    model.setup_cache(4, 32)
    model.prefill(ps)
    model.append(block)
    cont = rand_tokens(4, 3, seed=7)
    full = model.append(cont)                                      # reference: all 4 sequences continue
    model.setup_cache(4, 32)
    model.prefill(ps)
    model.append(block)
    model.keep(torch.tensor([3, 1]))                               # drop 0 and 2, reorder
    assert model.lengths.tolist() == [8, 10]
    kept = model.append(cont[[3, 1]])
    torch.testing.assert_close(kept, full[[3, 1]], **TOL)


def test_graph_rows_buckets(model):
    model.setup_cache(40, 16)
    assert [model.graph_rows(b) for b in (1, 2, 3, 5, 8, 9, 17, 33, 40)] == [1, 2, 4, 8, 8, 16, 24, 40, 40]
    model.setup_cache(3, 2000)                                     # too long for the old buffers: 3 rows now
    assert [model.graph_rows(b) for b in (1, 2, 3)] == [1, 2, 3]   # never more rows than allocated


def test_setup_cache_reuses_buffers_that_fit(model):
    model.setup_cache(4, 100)
    cache = model.cache
    model.prefill(prompts([5, 6, 7, 8]))
    model.setup_cache(2, 90)                                       # fewer rows, same 128-slot capacity
    assert model.cache is cache and model.batch_size == 2 and model.max_seq_len == 90
    assert cache.lengths_for(4).tolist() == [0, 0, 0, 0] and cache.live.tolist() == [1, 1, 0, 0]
    model.setup_cache(5, 90)                                       # more rows than allocated: new buffers
    assert model.cache is not cache
    cache = model.cache
    model.setup_cache(5, 2000)                                     # much longer: new buffers
    assert model.cache is not cache and model.cache.capacity == 2048
    cache = model.cache
    model.setup_cache(5, 100)                                      # 2048 slots for 128 needed: too wasteful
    assert model.cache is not cache


def test_fill_order_moves_fewest_rows():
    from verispec.runtime.cache import fill_order
    assert fill_order(5, [0, 2, 3, 4]) == [0, 4, 2, 3]
    assert fill_order(6, [1, 5]) == [5, 1]                       # row 1 stays, 5 moves to 0
    assert fill_order(4, [0, 1, 2]) == [0, 1, 2]
    assert sorted(fill_order(8, [7, 6, 0, 3])) == [0, 3, 6, 7]


def test_keep_with_host_order_equals_keep_on_device(model):
    """keep() with host indices copies only moved rows; same cache contents as a full gather."""
    ps, cont = prompts([5, 9, 3, 7, 4], seed=60), rand_tokens(5, 2, seed=61)
    outs = []
    for order in ([0, 4, 2, 3], torch.tensor([0, 4, 2, 3]), [3, 2, 0]):
        model.setup_cache(5, 40)
        model.prefill(ps)
        model.append(cont)
        model.keep(order)
        idx = list(order.tolist() if isinstance(order, torch.Tensor) else order)
        outs.append(model.append(cont[idx]))
        full = load_model(CFG, device="cpu", seed=3)
        full.setup_cache(len(idx), 40)
        full.prefill([ps[i] for i in idx])
        full.append(cont[idx])
        torch.testing.assert_close(outs[-1], full.append(cont[idx]), **TOL)
    with pytest.raises(ValueError, match="distinct"):
        model.keep([0, 0])


def test_padded_graph_buckets_equal_plain_passes(model, monkeypatch):
    """The GPU path runs a batch of B live sequences through the graph of a larger bucket, with padding
    rows. On the CPU the graph cache runs the same program eagerly on the same padded input buffers: same
    logits and lengths as unpadded passes, through keep(), and padding rows stay at length 0."""
    ps, cont = prompts([5, 9, 3, 7, 4], seed=50), rand_tokens(5, 4, seed=51)
    results = {}
    for padded in (False, True):
        model.setup_cache(5, 40)
        if padded:
            monkeypatch.setattr(model, "use_graphs", True)
        model.prefill(ps)
        outs = [model.append(cont)]                                # B=5 -> 5 (capped at the allocation)
        model.keep(torch.tensor([4, 1, 2]))                        # B=3 -> bucket 4: one padding row
        outs.append(model.append(cont[[4, 1, 2], :3]))
        model.rollback(model.lengths - torch.tensor([1, 0, 2]))
        outs.append(model.decode(cont[[4, 1, 2], :1]))
        outs.append(model.append(cont[[0, 3, 2], :2]))
        results[padded] = (outs, model.cache.lengths_for(5).tolist())
        monkeypatch.undo()
    # seq 4, 1, 2 in rows 0-2: prompt + 4 + 3 - rollback + 1 + 2; padding rows 3-4 at 0
    assert results[True][1] == results[False][1] == [4 + 10 - 1, 9 + 10, 3 + 10 - 2, 0, 0]
    for a, b in zip(results[True][0], results[False][0]):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, **TOL)


def test_truncated_shares_weights_and_owns_its_cache(model):
    draft = model.truncated(1)
    assert draft.config.num_layers == 1 and draft.net is model.net
    assert draft.net.layers[0].wqkv.data_ptr() == model.net.layers[0].wqkv.data_ptr()
    ps = prompts([4, 9], seed=40)
    model.setup_cache(2, 16)
    draft.setup_cache(2, 16)
    full_logits = model.prefill(ps)
    draft_logits = draft.prefill(ps)
    assert draft.cache is not model.cache and not torch.allclose(full_logits, draft_logits)
    # reference: a 1-layer model holding the same first layer
    one = load_model(CFG.replace(num_layers=1), device="cpu")
    with torch.no_grad():
        for (n, p), (_, q) in zip(one.net.named_parameters(), [(n, q) for n, q in model.net.named_parameters()
                                                                 if not n.startswith(("layers.1", "layers.2"))]):
            p.copy_(q)
    one.setup_cache(2, 16)
    torch.testing.assert_close(one.prefill(ps), draft_logits, **TOL)
    step = rand_tokens(2, 3, seed=8)
    torch.testing.assert_close(one.append(step), draft.append(step), **TOL)


def test_decode_rejects_wrong_shapes(model):
    model.setup_cache(2, 16)
    model.prefill(prompts([2, 2]))
    with pytest.raises(ValueError, match=r"\[B, 1\]"):
        model.decode(rand_tokens(2, 2))
    with pytest.raises(ValueError, match="B=2"):
        model.append(rand_tokens(3, 2))


@pytest.mark.parametrize("name, billions", [("llama-3.1-8b", 8.03), ("llama-3.2-1b", 1.24), ("qwen2.5-7b", 7.62),
                                            ("qwen2.5-0.5b", 0.494), ("smollm2-135m", 0.1345)])
def test_named_shapes_match_public_parameter_counts(name, billions):
    assert named_shape(name).num_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_keep_copies_only_the_slots_below_the_bound():
    """A moved row copies slots [0, slots) of every layer's K and V and nothing past them; rows that stay are not
    written; slots=None copies every slot."""
    from verispec.runtime.cache import StaticKVCache

    cache = StaticKVCache(CFG, 4, 40, torch.device("cpu"), torch.float32)
    cache.reset(0, 40)
    cache.admit([5, 9, 3, 7])
    cache.kv.copy_(torch.randn_like(cache.kv))
    before = cache.kv.clone()
    cache.keep([3, 1], slots=10)                     # row 3 moves to 0; row 1 stays
    assert torch.equal(cache.kv[:, :, 0, :, :10], before[:, :, 3, :, :10])
    assert torch.equal(cache.kv[:, :, 0, :, 10:], before[:, :, 0, :, 10:])     # past the bound: untouched
    assert torch.equal(cache.kv[:, :, 1], before[:, :, 1])
    assert cache.lengths.tolist() == [7, 9]
    cache.admit([4, 4])
    cache.kv.copy_(before)
    cache.keep([2, 1, 0])
    assert torch.equal(cache.kv[:, :, 0], before[:, :, 2]) and torch.equal(cache.kv[:, :, 2], before[:, :, 0])
    with pytest.raises(ValueError, match="slots must be >= 0"):
        cache.keep([0], slots=-1)
