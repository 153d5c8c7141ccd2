"""``top_w_coverage`` (verispec/training/train.py) and ``benchmarks/head_coverage.py``: a head's top-w coverage of
the target's next token grows with w, is 1 once w is the whole vocabulary, equals ``evaluate``'s acceptance at w = 1
(with a draft vocabulary too), and the power law fitted to it is the one a synthetic coverage was made from."""
from __future__ import annotations

import math

import pytest
import torch

from verispec.drafters.head_net import HeadConfig, HeadNet
from verispec.runtime import ModelConfig, load_model
from verispec.training.distill import distill
from verispec.training.train import evaluate, top_w_coverage

CFG = ModelConfig(vocab_size=64, num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def target_and_corpus():
    target = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    prompts = [[5, 9, 3, 17], [40, 2, 2, 8, 33, 1], [7, 7, 1], [12, 60, 4, 4, 9]]
    return target, distill(target, prompts, LAYERS, max_new_tokens=12, batch_size=2)


@pytest.mark.parametrize("draft_vocab", [None, 40])
def test_coverage_grows_with_width_and_starts_at_the_acceptance(target_and_corpus, draft_vocab):
    target, corpus = target_and_corpus
    torch.manual_seed(0)
    cfg = HeadConfig.for_target(target.config, LAYERS, draft_vocab=draft_vocab)
    net = HeadNet(cfg)
    if draft_vocab:
        net.d2t.copy_(torch.arange(draft_vocab))
    vocab = draft_vocab or CFG.vocab_size
    cov, entries = top_w_coverage(net, target, corpus, steps=2, max_width=vocab, batch_size=3)
    assert entries == sum(t.numel() - p - 1 for t, p in zip(corpus.tokens, corpus.prompt_len)) + len(corpus.tokens)
    for row in cov:
        assert all(0.0 <= a <= b <= 1.0 for a, b in zip(row, row[1:]))
    if not draft_vocab:                        # the whole vocabulary covers every token
        assert all(row[-1] == 1.0 for row in cov)
    acc = evaluate(net, target, corpus, steps=2, batch_tokens=64)["acc"]
    assert [row[0] for row in cov] == pytest.approx(acc)
    with pytest.raises(ValueError, match="max_width must be in"):
        top_w_coverage(net, target, corpus, steps=1, max_width=vocab + 1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        top_w_coverage(net, target, corpus, steps=0, max_width=2)


def test_the_fitted_exponent_is_the_one_a_coverage_was_made_from():
    from benchmarks.head_coverage import fit_exponent, markdown
    from benchmarks.common import environment

    rows = [[1 - (1 - a) * w ** -x for w in range(1, 9)] for a, x in ((0.5, 0.44), (0.45, 0.3))]
    assert [round(fit_exponent(r), 6) for r in rows] == [0.44, 0.3]
    assert math.isnan(fit_exponent([1.0, 1.0]))
    page = markdown(dict(env=environment(), command="x", head="embedded", source="s", entries=10, coverage=rows,
                         exponents=[fit_exponent(r) for r in rows]))
    assert "| 1 | 0.500 |" in page and "x = 0.44, 0.30" in page
