"""The engine on the real runtime: the embedded SmolLM2-135M-Instruct (fp32, CPU) and a tiny
random-weight Llama. Greedy speculative output must equal target-only greedy decoding token for
token, for every drafter; rollback must leave the KV caches equal to a fresh prefill."""
from __future__ import annotations

import pytest
import torch

from verispec.drafters import DraftModel, OracleDraft, PromptLookup, SelfSpeculative
from verispec.engine import SpeculativeDecoder, generate

N_NEW = 24
PROMPTS = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox.",
    "Name three colors.",
    "Fix the typo and copy the rest: 'The cat sat on teh mat and looked at the dog.'",
]


@pytest.fixture(scope="module")
def smollm():
    from verispec.runtime import load_model
    from verispec.runtime.loading import embedded_gguf_path

    try:
        embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return load_model(device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def references(smollm):
    out = generate(smollm, PROMPTS, max_new_tokens=N_NEW, chat=True)
    return [g.tokens for g in out]


def _drafter(name, model, refs):
    if name == "lookup":
        return PromptLookup(max_ngram=3, min_ngram=1)
    if name == "self":
        return SelfSpeculative(layers=4)
    if name == "draft":
        return DraftModel(model.truncated(6))      # a separate Model object with its own cache
    return OracleDraft(refs, acceptance_rate=0.6, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("name, k, batch", [
    ("lookup", 1, 1), ("lookup", 3, 3), ("lookup", 8, 3),
    ("self", 3, 1), ("self", 8, 1),
    ("draft", 1, 3), ("draft", 8, 1),
    ("oracle", 3, 3),
])
def test_smollm_greedy_equals_target_only(smollm, references, name, k, batch):
    prompts, refs = PROMPTS[-batch:], references[-batch:]
    out = generate(smollm, prompts, drafter=_drafter(name, smollm, refs), k=k, max_new_tokens=N_NEW, chat=True)
    assert [g.tokens for g in out] == refs
    if name in ("lookup", "oracle"):
        assert sum(g.stats.accepted for g in out) > 0


@pytest.mark.slow
def test_smollm_caches_match_a_fresh_prefill(smollm, references):
    """After every round the target's K/V for committed positions equal a fresh prefill's (fp32, 1e-4)."""
    fresh = smollm.truncated(smollm.config.num_layers)
    checked = []

    def check(decoder, active):
        cache = decoder.target.cache
        for j, seq in enumerate(active):
            h = seq.prompt + seq.generated
            n = len(h) - 1
            assert int(decoder.target.lengths[j]) == n
            fresh.setup_cache(1, n + 1)
            fresh.prefill([h[:-1]])
            for layer in (0, len(cache.k) // 2, len(cache.k) - 1):
                torch.testing.assert_close(cache.k[layer][j, :, :n], fresh.cache.k[layer][0, :, :n], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(cache.v[layer][j, :, :n], fresh.cache.v[layer][0, :, :n], rtol=1e-4, atol=1e-4)
            draft = decoder.drafter.model
            m = n - 1
            assert int(draft.lengths[j]) >= m
            fresh_draft = draft.truncated(draft.config.num_layers)
            fresh_draft.setup_cache(1, m + 1)
            fresh_draft.prefill([h[:m]])
            torch.testing.assert_close(draft.cache.k[0][j, :, :m], fresh_draft.cache.k[0][0, :, :m], rtol=1e-4, atol=1e-4)
        checked.append(len(active))

    decoder = SpeculativeDecoder(smollm, SelfSpeculative(layers=4), k=3)
    decoder._debug_round_hook = check
    out = decoder.generate(PROMPTS[1:], max_new_tokens=8, chat=True)
    assert [g.tokens for g in out] == [r[:8] for r in references[1:]]
    assert checked


def test_tiny_random_llama_greedy_parity():
    """A random-weight 2-layer Llama (no tokenizer): token-id prompts, every drafter, fp32."""
    from verispec.runtime import ModelConfig, load_model

    cfg = ModelConfig(vocab_size=256, num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128)
    target = load_model(cfg, device="cpu", dtype=torch.float32, seed=1)
    # random weights give near-uniform logits: sharpen them so the greedy path is well separated
    with torch.no_grad():
        target.net.embed.mul_(50.0)
    draft = load_model(cfg, device="cpu", dtype=torch.float32, seed=1)
    with torch.no_grad():
        draft.net.embed.mul_(50.0)
    prompts = [[1, 2, 3, 4, 1, 2, 3], [9, 8], [5, 6, 7, 5, 6, 7, 5, 6, 7, 5]]
    refs = [g.tokens for g in generate(target, prompts, max_new_tokens=20)]
    for drafter, k in [(PromptLookup(min_ngram=1), 3), (SelfSpeculative(layers=1), 8), (DraftModel(draft), 1),
                       (DraftModel(draft), 8)]:
        out = generate(target, prompts, drafter=drafter, k=k, max_new_tokens=20)
        assert [g.tokens for g in out] == refs, type(drafter).__name__


@pytest.mark.slow
@pytest.mark.parametrize("name, tree", [("lookup", [3, 2, 1])])   # the draft model's trees: test_tree_engine.py
def test_smollm_greedy_tree_generation_equals_target_only(smollm, references, name, tree):
    """Draft trees on the real model (a batch of 3 ragged chat prompts): token-identical to plain decoding."""
    out = generate(smollm, PROMPTS, drafter=_drafter(name, smollm, references), tree=tree, max_new_tokens=N_NEW,
                   chat=True)
    assert [g.tokens for g in out] == references
    assert sum(g.stats.accepted for g in out) > 0
