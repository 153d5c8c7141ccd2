"""SSD on gloo: a target rank (or two, tensor-parallel) and a draft rank, tiny random models."""
from dataclasses import replace

import pytest
import torch

from verispec.distributed.group import DistributedError, run_local
from verispec.distributed.ssd import SSDConfig, greedy_generate, run_ssd, sd_generate
from verispec.runtime import ModelConfig, load_model

TARGET = dict(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
              intermediate_size=48, max_position_embeddings=256)
PROMPT = [3, 14, 15, 9, 26, 5]


def models(draft_vocab=64):
    target = load_model(ModelConfig(**TARGET), device="cpu", dtype=torch.float32, seed=1)
    # the draft: the target's first layer (self-speculative: agrees often, not always -> hits and misses)
    if draft_vocab == TARGET["vocab_size"]:
        return target, target.truncated(1)
    return target, load_model(ModelConfig(**{**TARGET, "vocab_size": draft_vocab}), device="cpu",
                              dtype=torch.float32, seed=2)


def ssd_worker(rank, world_size, configs, draft_vocab=64):
    target, draft = models(draft_vocab)
    out = []
    for cfg in configs:
        tokens, stats = run_ssd(target, draft, PROMPT, cfg)
        out.append((tokens, stats.hits, stats.misses, stats.rounds))
    return out


GREEDY = SSDConfig(k=3, max_new_tokens=24, temperature=0.0, budget=6)
SAMPLED = SSDConfig(k=3, max_new_tokens=24, temperature=1.0, seed=7, budget=0)


def test_ssd_greedy_equals_sd_equals_plain_and_no_cache_is_sd():
    configs = [GREEDY, replace(GREEDY, budget=0), SAMPLED]
    target_res, draft_res = run_local(ssd_worker, 2, configs, timeout_s=90, collective_timeout_s=30)
    target, draft = models()
    plain = greedy_generate(target, PROMPT, 24)
    sd = sd_generate(target, draft, PROMPT, GREEDY)
    assert sd == plain
    ssd_cached, ssd_nocache, ssd_sampled = target_res
    assert ssd_cached[0] == plain and ssd_nocache[0] == plain
    hits, misses = draft_res[0][1], draft_res[0][2]
    assert hits > 0 and misses > 0, (hits, misses)          # both paths were exercised
    assert draft_res[1][1] == 0                              # budget 0: never a hit
    # sampling with the cache off is token-identical to single-process SD with the same seed
    assert ssd_sampled[0] == sd_generate(target, draft, PROMPT, SAMPLED)
    assert len(ssd_sampled[0]) == 24


def test_ssd_with_tensor_parallel_target():
    (t0, t1, d) = run_local(ssd_worker, 3, [GREEDY], timeout_s=90, collective_timeout_s=30)
    target, _ = models()
    plain = greedy_generate(target, PROMPT, 24)
    assert t0[0][0] == plain and t1[0][0] == plain
    assert d[0][0] is None


def test_mismatched_vocabularies_are_a_clear_error():
    with pytest.raises(DistributedError, match="vocabularies differ"):
        run_local(ssd_worker, 2, [GREEDY], 80, timeout_s=60, collective_timeout_s=10)


def test_launcher_refuses_a_wrong_world_size_and_missing_nccl(monkeypatch, capsys):
    from verispec.distributed.__main__ import main

    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    assert main(["--target", "x", "--draft", "y", "--tp", "1"]) == 2
    assert "WORLD_SIZE is 3 but --tp 1 needs 2 processes" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["--target", "x", "--draft", "y", "--backend", "nccl"]) == 2
        assert "nccl" in capsys.readouterr().err
