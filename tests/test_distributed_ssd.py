"""SSD on gloo: a target rank (or two, tensor-parallel) and a draft rank, tiny random models."""
from dataclasses import replace

import pytest
import torch

from verispec.distributed.group import DistributedError, run_local
from verispec.distributed.ssd import (DraftState, SSDConfig, draft_workers, greedy_generate, run_ssd,
                                      sd_generate)
from verispec.runtime import ModelConfig, load_model

from stats import chi2_pvalue

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


def ssd_worker(rank, world_size, configs, draft_vocab=64, prompts=(PROMPT,)):
    target, draft = models(draft_vocab)
    out = []
    for cfg in configs:
        tokens, stats = run_ssd(target, draft, list(prompts), cfg)
        out.append((None if tokens is None else (tokens[0] if len(prompts) == 1 else tokens),
                    stats.hits, stats.misses, stats.rounds))
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


BATCH_PROMPTS = ([3, 14, 15, 9, 26, 5], [2, 7], [31, 41, 59, 26], [1])


def test_ssd_batch_greedy_equals_plain_decoding_per_sequence():
    # B = 4 prompts of different lengths: one verify pass per round for all; a miss re-drafts only the
    # sequences that missed (hits keep their cached drafts)
    configs = [GREEDY, replace(GREEDY, budget=0)]
    target_res, draft_res = run_local(ssd_worker, 2, configs, 64, BATCH_PROMPTS, timeout_s=90,
                                      collective_timeout_s=30)
    target, _ = models()
    plain = [greedy_generate(target, p, GREEDY.max_new_tokens) for p in BATCH_PROMPTS]
    (cached, hits, misses, rounds), (nocache, nocache_hits, _, _) = target_res
    assert cached == plain and nocache == plain
    assert hits > 0 and misses > 0 and nocache_hits == 0, (hits, misses, nocache_hits)
    assert hits + misses == len(BATCH_PROMPTS) * (rounds - 1)   # every sequence, every round after the first
    assert draft_res[0][1:3] == (hits, misses)


class CountingWorker:
    def __init__(self, worker):
        self.worker, self.calls = worker, 0

    def draft(self, history):
        self.calls += 1
        return self.worker.draft(history)


def test_a_miss_drafts_only_the_sequences_that_missed():
    _, draft = models()
    workers = draft_workers(draft, 2, GREEDY, 64)
    state = DraftState(workers, [[3, 14, 15], [2, 7]])
    state.advance([(0, 9), (0, 26)])                          # first drafts: both on the spot
    state.prespeculate(GREEDY.fanouts)
    hit_outcome = next(key[1:] for key in state.cache if key[0] == 0)
    state.workers = [CountingWorker(w) for w in workers]
    miss_outcome = (GREEDY.k, 63 if (1, GREEDY.k, 63) not in state.cache else 62)
    hits, _ = state.advance([hit_outcome, miss_outcome])
    assert hits == [True, False] and [w.calls for w in state.workers] == [0, 1]
    assert state.drafts[1] == draft_workers(draft, 1, GREEDY, 64)[0].draft(state.history[1])[0]


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


# ------------------------------------------------------------------------------------------ sampling (T > 0)
CHI2_PROMPTS = ([3, 14, 15, 9, 26, 5], [2, 7, 1, 8], [31, 41, 59], [27, 18, 28, 18, 28])
# the tiny random target's logits have a spread of ~0.1: T = 0.05 makes its distributions peaked enough that the
# draft's top candidates often cover the outcome (cache hits) and a wrong distribution is detectable
CHI2_CFG = SSDConfig(k=3, max_new_tokens=140, temperature=0.05, seed=11, budget=4)
PIT_BINS = 10


def pit_counts(model, prompts, outputs, temperature: float, seed: int) -> torch.Tensor:
    """Randomized probability integral transform of every emitted token under ``model`` at ``temperature``,
    binned into PIT_BINS equal bins -> counts [PIT_BINS].

    Token x drawn from p (given its history) maps to u = P(X < x) + v p(x), v ~ U(0, 1): u is U(0, 1) and
    independent of the earlier u's exactly when every token is drawn from p given everything before it, so
    the counts are uniform multinomial iff the sequences are distributed as target-only sampling."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(PIT_BINS)
    for prompt, out in zip(prompts, outputs):
        seq = list(prompt) + list(out)
        model.setup_cache(1, len(seq))
        logits = model.append(torch.tensor([seq[:-1]]))[0, len(prompt) - 1:]          # [len(out), V]
        p = torch.softmax(logits.double() / temperature, dim=-1)
        x = torch.tensor(out)[:, None]
        below = p.cumsum(-1).gather(1, x)[:, 0] - p.gather(1, x)[:, 0]
        u = below + torch.rand(len(out), generator=generator, dtype=torch.float64) * p.gather(1, x)[:, 0]
        counts += torch.histc(u.float(), PIT_BINS, 0.0, 1.0)
    return counts


def test_ssd_sampling_matches_the_target_over_hits_and_misses():
    target_res, draft_res = run_local(ssd_worker, 2, [CHI2_CFG], 64, CHI2_PROMPTS, timeout_s=90,
                                      collective_timeout_s=30)
    outputs, hits, misses, _ = target_res[0]
    assert hits > 0 and misses > 0, (hits, misses)         # drafts came from the cache and from the spot
    assert draft_res[0][1:3] == (hits, misses)
    assert [len(o) for o in outputs] == [CHI2_CFG.max_new_tokens] * len(CHI2_PROMPTS)
    target, _ = models()
    counts = pit_counts(target, CHI2_PROMPTS, outputs, CHI2_CFG.temperature, seed=5)
    assert chi2_pvalue(counts, torch.ones(PIT_BINS)) > 1e-3, counts
    # the same test rejects another model's distribution: it has power at this sample size
    other = load_model(ModelConfig(**TARGET), device="cpu", dtype=torch.float32, seed=2)
    assert chi2_pvalue(pit_counts(other, CHI2_PROMPTS, outputs, CHI2_CFG.temperature, seed=5),
                       torch.ones(PIT_BINS)) < 1e-6
