"""``verispec train-head`` on a tiny fp32 target (CPU): a few hundred steps lower the held-out loss and raise the
held-out acceptance well above an untrained head's, the head it writes drafts real accepted tokens through the
engine (greedy output still equal to plain decoding), and an interrupted run resumed with ``resume`` ends with
exactly the weights of an uninterrupted one (a head with a draft vocabulary: its d2t from the corpus); ``init_from``
starts from a trained head (its shape, d2t and weights)."""
from __future__ import annotations

import pytest
import torch

from verispec.drafters import FeatureHead
from verispec.drafters.head_net import HeadConfig, HeadNet
from verispec.engine import generate
from verispec.runtime import ModelConfig, load_model
from verispec.training import TrainConfig, train_head
from verispec.training.prompts import HELD_OUT_TOPICS, TRAIN_TOPICS, prompt_texts

CFG = ModelConfig(vocab_size=64, num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
SMALL = dict(tokens=2500, held_out_tokens=500, batch_tokens=256, max_new_tokens=24, lr=3e-3)


def tiny_target():
    model = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    with torch.no_grad():
        model.net.lm_head.mul_(4.0)   # a less flat target: its greedy answers have structure to learn
    return model


def test_prompts_are_varied_and_held_out_topics_are_unseen():
    train, held = prompt_texts("train"), prompt_texts("held-out")
    assert len(set(train)) == len(train) >= 300 and len(set(held)) == len(held) >= 100
    assert not {t for t in TRAIN_TOPICS} & {t for t in HELD_OUT_TOPICS}
    assert not any(topic in p for p in train for topic in HELD_OUT_TOPICS)
    with pytest.raises(ValueError, match="split must be"):
        prompt_texts("test")


def test_training_raises_held_out_acceptance_and_the_head_drafts(tmp_path):
    model = tiny_target()
    result = train_head(model, TrainConfig(out=str(tmp_path), steps=200, eval_every=100, **SMALL))
    before = result["untrained"]
    assert result["loss"] < before["loss"] - 0.05
    assert result["acc"][0] > before["acc"][0] + 0.25 and result["tau"] > 1.3
    head = FeatureHead(tmp_path)                                   # the files it wrote
    assert head.meta["training"]["step"] == 200
    prompts = [[5, 9, 3, 17], [40, 2, 2, 8, 33, 1]]
    plain = [g.tokens for g in generate(model, prompts, max_new_tokens=24)]
    out = generate(model, prompts, drafter=head, k=3, max_new_tokens=24)
    assert [g.tokens for g in out] == plain
    assert sum(g.stats.accepted for g in out) > 0


def test_resume_continues_where_it_stopped(tmp_path):
    model = tiny_target()
    small = dict(SMALL, tokens=1200, held_out_tokens=300, draft_vocab=32)   # and a draft vocabulary
    train_head(model, TrainConfig(out=str(tmp_path / "a"), steps=30, eval_every=10, **small))
    partial = train_head(model, TrainConfig(out=str(tmp_path / "b"), steps=30, eval_every=10, max_run_steps=17,
                                            **small))
    assert partial["step"] == 17
    resumed = train_head(model, TrainConfig(out=str(tmp_path / "b"), steps=30, eval_every=10, resume=True, **small))
    assert resumed["step"] == 30
    a, b = FeatureHead(tmp_path / "a").net.state_dict(), FeatureHead(tmp_path / "b").net.state_dict()
    assert a["lm_head"].shape == (32, CFG.hidden_size) and a["d2t"].unique().numel() == 32
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    with pytest.raises(FileNotFoundError, match="no run to continue"):
        train_head(model, TrainConfig(out=str(tmp_path / "c"), resume=True, **small))


def test_init_from_starts_at_the_given_head(tmp_path):
    model = tiny_target()
    small = dict(SMALL, tokens=1200, held_out_tokens=300, draft_vocab=32)
    first = train_head(model, TrainConfig(out=str(tmp_path / "a"), steps=60, eval_every=60, **small))
    # new data (another seed), a head shaped by --init and not by the config's draft_vocab / width
    cont = train_head(model, TrainConfig(out=str(tmp_path / "b"), steps=5, eval_every=5, init_from=str(tmp_path / "a"),
                                         **dict(small, draft_vocab=16, seed=1)))
    head_a, head_b = FeatureHead(tmp_path / "a"), FeatureHead(tmp_path / "b")
    assert torch.equal(head_a.net.d2t, head_b.net.d2t)
    assert head_b.cfg == head_a.cfg
    # step 0 of the continued run is the first head (evaluated on this run's held-out corpus), not a fresh one
    assert cont["untrained"]["loss"] < first["untrained"]["loss"] - 0.05
    assert abs(cont["untrained"]["loss"] - first["loss"]) < 0.5
    # stopped and resumed: the shape still comes from the head it started from
    part = dict(small, draft_vocab=None, seed=1)
    train_head(model, TrainConfig(out=str(tmp_path / "d"), steps=4, eval_every=2, max_run_steps=2,
                                  init_from=str(tmp_path / "a"), **part))
    resumed = train_head(model, TrainConfig(out=str(tmp_path / "d"), steps=4, eval_every=2, resume=True,
                                            init_from=str(tmp_path / "a"), **part))
    assert resumed["step"] == 4 and FeatureHead(tmp_path / "d").cfg == head_a.cfg
    bad = HeadConfig.for_target(ModelConfig(vocab_size=64, num_layers=4, hidden_size=16, num_heads=2, num_kv_heads=1,
                                            head_dim=8, intermediate_size=32))
    HeadNet(bad).save(tmp_path / "other")
    with pytest.raises(ValueError, match="hidden size 16 != the target's 32"):
        train_head(model, TrainConfig(out=str(tmp_path / "c"), steps=1, init_from=str(tmp_path / "other"), **small))
