"""Lengths (CPU): every drafter, k and max_new_tokens, with and without an EOS, returns exactly what plain decoding
returns: ``max_new_tokens`` tokens, or the tokens up to and including the first EOS; never one short.

The model is a real (tiny, fp32) ``Model`` with its CUDA-graph code path forced on: the CPU runs the same padded
programs eagerly (``GraphCache.replay``), so the captured draft loop's room check and the wider width buckets are
exercised here too (a draft loop's pre-rollback length once refused the last round of a sequence, and a
self-speculative run returned 127 of 128 tokens)."""
from types import SimpleNamespace

import pytest
import torch

from verispec import DraftModel, PromptLookup, SelfSpeculative, generate
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=61, num_layers=3, hidden_size=48, num_heads=4, num_kv_heads=2, head_dim=12,
                  intermediate_size=64)
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9], [3, 4] * 6]


@pytest.fixture(scope="module")
def model():
    m = load_model(CFG, device="cpu", seed=11)
    m.use_graphs = True                       # the graph programs, run eagerly on the CPU
    return m


@pytest.fixture(autouse=True)
def graphs_for_drafters_too(monkeypatch):
    """Truncated models (self-speculation, the draft model here) take the graph path as well: their captured draft
    loop (``Model.draft_loop``) is what a GPU runs."""
    from verispec.runtime.model import Model

    truncated = Model.truncated

    def forced(self, num_layers):
        m = truncated(self, num_layers)
        m.use_graphs = True
        return m

    monkeypatch.setattr(Model, "truncated", forced)


def _with_eos(m, eos: int | None):
    m.tokenizer = None if eos is None else SimpleNamespace(eos_token_ids=[eos], decode=lambda ids: "",
                                                           vocab_size=CFG.vocab_size)


DRAFTERS = {
    "plain": lambda m: None,
    "lookup": lambda m: PromptLookup(),
    "self": lambda m: SelfSpeculative(layers=1),
    "draft": lambda m: DraftModel(m.truncated(2)),
}


def _expected(ref: list[int], eos: int | None, max_new: int) -> list[int]:
    out = ref[:max_new]
    if eos is not None and eos in out:
        out = out[:out.index(eos) + 1]
    return out


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
@pytest.mark.parametrize("k", [2, 8])
def test_lengths_and_eos(model, drafter, k):
    _with_eos(model, None)
    refs = [generate(model, p, max_new_tokens=24).tokens for p in PROMPTS]        # plain, no EOS
    for max_new in (1, 5, 23):
        for eos_at in (None, 3):
            eos = None if eos_at is None else refs[0][eos_at]
            _with_eos(model, eos)
            outs = generate(model, PROMPTS, drafter=DRAFTERS[drafter](model), k=k, max_new_tokens=max_new)
            for ref, out in zip(refs, outs):
                want = _expected(ref, eos, max_new)
                assert out.tokens == want, (drafter, k, max_new, eos_at)
                ended_by_eos = eos is not None and want[-1] == eos
                assert out.finish_reason == ("eos" if ended_by_eos else "length"), (drafter, k, max_new, eos_at)
    _with_eos(model, None)


def test_the_last_rounds_of_a_captured_draft_loop_have_room(model):
    """The draft loop rolls back before it writes: near max_seq_len its room is the rolled-back length's. With the
    room bounded by the lengths before the rollback, the last round of every sequence was refused."""
    _with_eos(model, None)
    for k in (4, 8):
        outs = generate(model, PROMPTS, drafter=SelfSpeculative(layers=2), k=k, max_new_tokens=40)
        assert [len(o.tokens) for o in outs] == [40, 40, 40]
        assert all(o.finish_reason == "length" for o in outs)


def test_a_failed_sequence_raises_instead_of_returning_short(monkeypatch):
    """A sequence that fails mid-run is never returned as a short output: ``generate`` raises GenerationError with
    every Generation, the failed one carrying its reason."""
    from verispec import GenerationError
    from verispec.engine import scheduler as sched_mod

    m = load_model(CFG, device="cpu", seed=2)
    real = sched_mod.run_round
    calls = {"n": 0}

    def failing_round(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected round failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(sched_mod, "run_round", failing_round)
    with pytest.raises(GenerationError, match="injected round failure") as info:
        generate(m, PROMPTS[:2], max_new_tokens=10)
    assert [g.finish_reason for g in info.value.generations] == ["error", "error"]
    assert all("injected" in g.error for g in info.value.generations)
    torch.manual_seed(0)
