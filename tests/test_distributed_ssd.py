"""SSD on gloo: the engine on the target rank(s) with an ``SSDDrafter``, the draft rank's ``DraftServer``; tiny
random models. SSD's output must equal the engine's SD output with ``DraftModel`` (same draft, same seeds) token
for token, greedy and sampled, whatever the hit rate. Each spawned run serves several cases in turn (a spawn
costs seconds)."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from verispec.distributed.draft_rank import DraftServer, ScoringDraftModel, likely_outcomes
from verispec.distributed.group import DistributedError, run_local
from verispec.distributed.simulator import PassTime, SSDCosts
from verispec.distributed.ssd import SSDConfig, SSDDrafter
from verispec.drafters import DraftModel
from verispec.drafters.base import Sampling, SamplingParams
from verispec.engine.decoder import SpeculativeDecoder
from verispec.runtime import ModelConfig, load_model

TARGET = ModelConfig(vocab_size=64, num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                     intermediate_size=48, max_position_embeddings=256)
PROMPTS = [[3, 14, 15, 9, 26, 5], [2, 7], [31, 41, 59, 26], [1]]       # ragged batch
K = 3


def models():
    """The target (random, with a character tokenizer: EOS and stop strings act on its text) and its draft: the
    target's first layer (agrees often, not always: hits and misses)."""
    from fakes import FakeTokenizer

    target = load_model(TARGET, device="cpu", dtype=torch.float32, seed=1)
    target.tokenizer = FakeTokenizer(TARGET.vocab_size)
    return target, target.truncated(1)


class ForcedMisses(DraftServer):
    """Throws away every other pre-speculated hit: the rows that missed are drafted on the spot beside the rows
    that hit."""

    def _commit(self, num_accepted, emitted):
        super()._commit(num_accepted, emitted)
        for b, seq in enumerate(self.seqs):
            if (b + self.stats.rounds) % 2:
                seq.ready = None


class Dies(DraftServer):
    """Stops answering at its fourth round: the worker returns and its process group closes."""

    def _propose(self, max_num_draft):
        if self.stats.rounds == 3:
            raise SystemExit("the draft rank dies")
        return super()._propose(max_num_draft)


class CyclingBudget(DraftServer):
    """budget_mode "auto" whose pick cycles through F = 4, 0, 2, 1, 3 round by round: the branch rows move every
    round (up, down, to none and back), which must change no token."""

    def _pick_width(self):
        return (4, 0, 2, 1, 3)[self.stats.rounds % 5]


SERVERS = {"ok": DraftServer, "forced_misses": ForcedMisses, "dies": Dies, "cycling_budget": CyclingBudget}


def generate_kwargs(case: dict) -> dict:
    return dict(max_new_tokens=case.get("max_new_tokens", 20), temperature=case.get("temperature", 0.0),
                top_p=case.get("top_p"), seed=case.get("seed", 5), stop=case.get("stop"))


def ssd_cases(rank: int, world_size: int, cases: list[dict]) -> list:
    """Run each case on this rank: the engine with an SSDDrafter on rank 0, the case's DraftServer on rank 1 (the
    tensor-parallel target runs in the torchrun launch test)."""
    draft_rank, targets = world_size - 1, list(range(world_size - 1))
    target, draft = models()
    out = []
    for case in cases:
        cfg = case["config"]
        if rank == draft_rank:
            try:
                out.append(SERVERS[case.get("server", "ok")](draft, targets, cfg).serve().hits)
            except SystemExit:
                return out                        # dies: the process group closes as this worker returns
            continue
        drafter = SSDDrafter(draft_rank, cfg, leader=rank == 0)
        if case.get("schedule"):
            drafter.attach(target)
            out.append((continuous_batching(target, drafter), drafter.stats))
            drafter.close()
            continue
        if case.get("eos") is not None:
            target.tokenizer.eos_token_ids = [case["eos"]]
        decoder = SpeculativeDecoder(target, drafter, k=cfg.k, isolate_drafter=True)
        gens = decoder.generate(case.get("prompts", PROMPTS), **generate_kwargs(case))
        drafter.close()
        target.tokenizer.eos_token_ids = [TARGET.vocab_size - 1]
        out.append(([g.tokens for g in gens], [g.finish_reason for g in gens], drafter.stats, drafter.error))
    return out


def continuous_batching(target, drafter) -> list:
    """Requests join between rounds (a batch of at most 3 rows: the fourth waits for a free row) and one leaves
    mid-stream (cancelled); greedy and sampled rows side by side, each with its own k (3, 1, 0, 2 drafts per round:
    ragged rounds, a row without drafts) -> each request's (tokens, finish reason)."""
    from verispec.engine.request import Request
    from verispec.engine.scheduler import Scheduler, SchedulerConfig

    def own_k(running, k):
        return [min(k, (3, 1, 0, 2)[seq.request.id]) for seq in running]

    scheduler = Scheduler(target, drafter, SchedulerConfig(max_batch_size=3, max_seq_len=64, k=K), k_policy=own_k)
    requests = [Request(p, 14, temperature=t, top_p=0.9, seed=20 + i, id=i)
                for i, (p, t) in enumerate(zip(PROMPTS, [0.0, 0.05, 0.0, 0.05]))]
    seqs = [scheduler.submit(requests[0]), scheduler.submit(requests[1])]
    scheduler.step()
    scheduler.step()
    seqs += [scheduler.submit(requests[2]), scheduler.submit(requests[3])]
    scheduler.step()
    scheduler.cancel(1)
    scheduler.run()
    return [(s.generated, s.finish_reason) for s in seqs]


def engine_sd(case: dict, drafter: bool = True):
    if case.get("schedule"):
        target, draft = models()
        return continuous_batching(target, DraftModel(draft))
    target, draft = models()
    if case.get("eos") is not None:
        target.tokenizer.eos_token_ids = [case["eos"]]
    gens = SpeculativeDecoder(target, DraftModel(draft) if drafter else None, k=K).generate(
        case.get("prompts", PROMPTS), **generate_kwargs(case))
    return [g.tokens for g in gens], [g.finish_reason for g in gens]


CACHE = SSDConfig(k=K, budget=4, recv_timeout_s=20)
NO_CACHE = replace(CACHE, budget=0)
AUTO = replace(CACHE, budget_mode="auto", costs=SSDCosts(((1, PassTime.constant(6e-3)),), PassTime.constant(1e-3)))
# the tiny random target's logits spread ~0.1: at T = 0.05 its distributions are peaked enough for the draft's top
# candidates to cover the outcome often (hits)
SAMPLED = dict(temperature=0.05, top_p=0.9, seed=11)


def test_ssd_equals_engine_sd_greedy_sampled_cache_on_off_forced_misses_eos_stop_joins_leaves_auto_budget_and_a_dying_draft_rank():
    plain = engine_sd({}, drafter=False)
    text = models()[0].tokenizer.decode(plain[0][0])
    eos = plain[0][1][4]                                     # sequences end early (at different rounds)
    stop = text[4:7]
    cases = [dict(config=CACHE), dict(config=NO_CACHE), dict(config=CACHE, **SAMPLED),
             dict(config=NO_CACHE, **SAMPLED), dict(config=CACHE, server="forced_misses", **SAMPLED),
             dict(config=CACHE, eos=eos), dict(config=CACHE, stop=[stop], max_new_tokens=30),
             dict(config=CACHE, schedule=True), dict(config=AUTO, server="cycling_budget", **SAMPLED),
             dict(config=replace(CACHE, recv_timeout_s=5), server="dies", max_new_tokens=40)]
    results, draft_hits = run_local(ssd_cases, 2, cases, timeout_s=150, collective_timeout_s=30)
    assert len(draft_hits) == len(cases) - 1                 # every server but the dying one closed cleanly
    scheduled, stats = results.pop(7)
    assert scheduled == engine_sd(cases.pop(7))                   # requests joining and leaving between rounds
    assert scheduled[1][1] == "cancelled" and stats.hits > 0 and stats.misses > 0
    for case, (tokens, finish, stats, error) in zip(cases[:-1], results):
        sd = engine_sd(case)
        assert (tokens, finish) == sd, case
        assert error is None
        if case["config"].budget:
            assert stats.hits > 0 and stats.misses > 0, (case, stats)   # both paths ran
        else:
            assert stats.hits == 0 and stats.misses > 0
    assert results[0][0] == plain[0]                         # greedy SSD = plain greedy decoding
    assert results[5][1][1] == "eos" and results[6][1][0] == "stop"
    assert results[7][2].budget_changes > 5                  # "auto" moved F (and the branch rows) every round
    tokens, finish, stats, error = results[-1]
    assert "draft rank" in error and stats.rounds == 3       # a clear error; then plain decoding, exact
    assert tokens == engine_sd(dict(max_new_tokens=40), drafter=False)[0]


def test_the_branches_batched_draft_equals_one_branch_at_a_time():
    """B*F branch rows drafted in one batched draft give the drafts of each branch drafted alone."""
    _, draft = models()
    rows = SamplingParams((Sampling(0.0, 0, 1.0, 3), Sampling(1.0, 0, 0.9, 4)))
    prompts, firsts = [[3, 14, 15, 9], [2, 7, 1]], [26, 8]
    F = 3
    batched = ScoringDraftModel(draft, F + 1)
    batched.reserve(None, 2 * F, 64)
    batched.admit(list(range(2 * F)), [p for p in prompts for _ in range(F)], [t for t in firsts for _ in range(F)],
                  rows.select([0, 0, 0, 1, 1, 1]))
    branches = [h + tail for h in [p + [t] for p, t in zip(prompts, firsts)] for tail in ([5], [9, 11], [4, 4, 6])]
    steps = [0, 0, 0, 7, 7, 7]
    batched.redirect(branches, steps)
    together, _, q_together = batched.draft(K + 1)
    for r, (history, step) in enumerate(zip(branches, steps)):
        alone = ScoringDraftModel(load_model(TARGET, device="cpu", dtype=torch.float32, seed=1).truncated(1), F + 1)
        alone.reserve(None, 1, 64)
        alone.admit([0], [prompts[r // F]], [firsts[r // F]], rows.select([r // F]))
        alone.redirect([history], [step])
        tokens, _, q = alone.draft(K + 1)
        assert tokens[0] == together[r]
        if r >= F:                                  # sampled rows: q (a greedy row alone keeps none)
            torch.testing.assert_close(q[0], q_together[r], rtol=1e-5, atol=1e-6)


def test_likely_outcomes_skip_the_rejected_draft():
    assert likely_outcomes([5, 7], [[5, 2, 9], [3, 7, 1], [4, 8, 6]], (1, 1, 2)) == [(0, 2), (1, 3), (2, 4), (2, 8)]
    assert likely_outcomes([], [[4, 8, 6]], (2,)) == [(0, 4), (0, 8)]


class FakeChannel:
    """A target rank's end as the draft rank sees it: says ``hello`` once, records the answers."""

    def __init__(self, peer, hello):
        self.peer, self.hello, self.sent = peer, hello, []

    def recv_object(self, what, timeout_s=None):
        return self.hello

    def send_object(self, obj, wait=True):
        self.sent.append(obj)


def test_mismatched_vocabularies_or_configurations_are_a_clear_error_on_both_sides():
    _, draft = models()
    for hello, message in [(dict(vocab_size=80, config=vars(CACHE)), "vocabularies differ: draft V=64, target rank 0 V=80"),
                           (dict(vocab_size=64, config=vars(NO_CACHE)), "SSD configuration differs .*budget")]:
        server = DraftServer(draft, [0], CACHE)
        server.channels = [FakeChannel(0, dict(op="hello", leader=True, **hello))]
        with pytest.raises(DistributedError, match=message):
            server.serve()
        assert server.channels[0].sent[0]["error"]                # the target learns it too (and raises it)


# --------------------------------------------------------------------------------------------- the launch
def _checkpoint(path):
    """config.json + model.safetensors of a random tiny model (no tokenizer: prompts as ids)."""
    import json

    from safetensors.torch import save_file

    from verispec.runtime.loading import hf_state_dict

    cfg = replace(TARGET, vocab_size=64)
    model = load_model(cfg, device="cpu", dtype=torch.float32, seed=1)
    save_file({k: v.contiguous().clone() for k, v in hf_state_dict(model.net).items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=cfg.vocab_size,
        num_hidden_layers=cfg.num_layers, hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, intermediate_size=cfg.intermediate_size,
        tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=cfg.max_position_embeddings)))
    return str(path)


LAUNCH = ["--draft-layers", "1", "--prompt-ids", "3,14,15;2,7", "-k", "3", "--max-new-tokens", "16",
          "--recv-timeout-s", "30"]


def _run(command: list[str]) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("launcher", ["python -m", "torchrun"])
def test_the_launch_runs_and_reports(tmp_path, launcher):
    """Spawned ranks with one target rank and --budget auto (the draft rank picks F from a cost table); torchrun
    with a tensor-parallel target (2 target ranks + the draft rank: SSD through the sharded engine, its tokens
    those of plain decoding on the same target)."""
    import json

    model = _checkpoint(tmp_path)
    args = ["-m", "verispec.distributed", "--target", model, *LAUNCH]
    if launcher == "torchrun":
        args = ["-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(_free_port()), *args,
                "--tp", "2"]
    else:       # rows cost almost nothing against the target's pass here: the pick is the most branches, 3
        (tmp_path / "costs.json").write_text(json.dumps({"target": {"1": {"1": 6e-3, "4": 6e-3}},
                                                         "draft": {"1": 1e-4, "64": 1.1e-4}}))
        args += ["--budget", "auto", "--max-budget", "3", "--costs", str(tmp_path / "costs.json")]
    out = _run([sys.executable, *args])
    assert "identical to plain decoding: yes" in out, out
    assert "tokens/s" in out and "hit rate" in out and "plain decoding:" in out, out
    if launcher != "torchrun":
        assert "budget picked per round (auto): last F = 3" in out, out


def _free_port() -> int:
    from verispec.distributed.group import free_port

    return free_port()


def test_the_launch_refuses_bad_arguments_before_loading(tmp_path, monkeypatch, capsys):
    from verispec.launch import main

    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr("verispec.runtime.load_model", no_load)
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "vocab_size": 64, "num_hidden_layers": 2, "hidden_size": 36, '
        '"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 64}')
    model = str(tmp_path)
    assert main(["--target", model, "--draft-layers", "1", "--tp", "2", "--prompt-ids", "1,2"]) == 2
    assert "--tp 2: tensor parallelism over 2 ranks needs num_heads divisible by 2, got 9" in capsys.readouterr().err
    assert main(["--target", model, "--draft-layers", "1", "a text prompt"]) == 2
    assert "tokenizer.json not found" in capsys.readouterr().err
    assert main(["--target", model, "--draft-layers", "5", "--prompt-ids", "1"]) == 2
    assert "--draft-layers 5: need 1 <= N < the target's 2 layers" in capsys.readouterr().err
    assert main(["--target", model, "--draft", "llama-3.2-1b", "--prompt-ids", "1"]) == 2
    assert "draft vocab 128256 != target vocab 64" in capsys.readouterr().err
    assert main(["--target", model, "--draft-layers", "1", "--prompt-ids", "1", "--budget", "auto"]) == 2
    assert "--budget auto needs --costs" in capsys.readouterr().err
    assert main(["--target", model, "--draft-layers", "1", "--prompt-ids", "1", "--budget", "many"]) == 2
    assert "--budget must be an integer >= 0 or auto, got 'many'" in capsys.readouterr().err
    assert main(["--target", model, "--draft-layers", "1", "--prompt-ids", "1", "--budget", "auto", "--costs",
                 str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["--target", model, "--draft-layers", "1", "--prompt-ids", "1"]) == 2
    assert "WORLD_SIZE is 3 but --tp 1 needs 2 processes" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["--target", model, "--draft-layers", "1", "--prompt-ids", "1", "--backend", "nccl"]) == 2
        assert "nccl" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- verispec serve --ssd
def serve_ssd_child(results, costs: str):
    """In a fresh process (it joins a process group): ``verispec serve --ssd --ssd-budget auto``'s launch of the draft
    rank (F picked from ``costs``), then the server's scheduler path (generate) against the engine with DraftModel."""
    import argparse

    from verispec.launch import ssd_drafter

    target = load_model(TARGET, device="cpu", dtype=torch.float32)       # seed 0: the draft rank loads the same
    args = argparse.Namespace(k=K, ssd_budget="auto", ssd_max_budget=3, ssd_costs=costs, ssd_costs_host=None,
                              draft=None, draft_self=1, model=TARGET, dtype="float32")
    drafter = ssd_drafter(args, target)
    decoder = SpeculativeDecoder(target, drafter, k=K, isolate_drafter=True)
    ssd = [g.tokens for g in decoder.generate(PROMPTS, max_new_tokens=12, **dict(temperature=0.05, seed=3))]
    drafter.close()
    sd = SpeculativeDecoder(target, DraftModel(target.truncated(1)), k=K).generate(
        PROMPTS, max_new_tokens=12, temperature=0.05, seed=3)
    results.put((ssd, [g.tokens for g in sd], drafter.stats.hits, drafter.error))


def test_serve_ssd_starts_a_draft_rank_that_drafts_like_the_engine(tmp_path):
    import json
    import multiprocessing

    costs = tmp_path / "costs.json"      # rows nearly free against the target's pass: F = the most, 3 (hits)
    costs.write_text(json.dumps({"target": {"1": {"1": 6e-3, "4": 6e-3}}, "draft": {"1": 1e-4, "64": 1.1e-4}}))
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=serve_ssd_child, args=(results, str(costs)))
    child.start()
    try:
        ssd, sd, hits, error = results.get(timeout=90)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    assert ssd == sd and hits > 0 and error is None


def test_serve_ssd_refuses_bad_settings_before_loading(capsys):
    from verispec.cli import main

    for argv, message in [(["serve", "--ssd", "--draft-lookup", "-k", "3"], "--ssd needs a draft model"),
                          (["serve", "--ssd", "--draft-self", "4"], "--ssd needs -k N"),
                          (["serve", "--ssd", "--draft-self", "4", "-k", "3", "--ssd-budget", "-1"],
                           "--ssd-budget must be an integer >= 0 or auto, got '-1'"),
                          (["serve", "--ssd", "--draft-self", "4", "-k", "3", "--ssd-budget", "auto"],
                           "--ssd-budget auto needs --ssd-costs FILE"),
                          (["serve", "--ssd", "--draft-self", "4", "-k", "3", "--ssd-budget", "auto", "--ssd-costs",
                            "/nonexistent.json"], "/nonexistent.json is not a file")]:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


def test_outcome_stats_measure_acceptance_per_position():
    from verispec.distributed.draft_rank import OutcomeStats

    stats = OutcomeStats(3, prior=0.5)
    stats.tested, stats.accepted = [0.0] * 3, [0.0] * 3                 # no prior: the docstring's example
    stats.add([3, 3, 2], [1, 3, 0], [[5, 6], [1, 2, 3, 4], []])          # the third row failed: no outcome
    assert stats.tested == [2, 2, 1] and stats.accepted == [2, 1, 1]
    assert stats.alphas() == (1.0, 0.5, 1.0)
    stats.rank_trials, stats.rank_found = 0.0, 0.0                       # no prior: add_rank's example
    stats.add_rank([4, 8, 6], 8)
    stats.add_rank([4, 8, 6], 5)
    assert (stats.rank_trials, stats.rank_found) == (5, 1) and stats.rank_accept() == pytest.approx(0.2)


def test_the_launch_reads_budget_auto_costs(tmp_path):
    import argparse
    import json

    from verispec.launch import budget_settings

    (tmp_path / "cal.json").write_text(json.dumps({"target": {"1": {"1": 5e-3, "5": 6e-3}}, "draft": {"1": 1e-3}}))
    (tmp_path / "gpu.json").write_text(json.dumps({"per_round": [{"rows": 2, "host_before_loop_ms": [0.5, 0.5]}]}))
    args = argparse.Namespace(budget="auto", max_budget=6, costs=str(tmp_path / "cal.json"),
                              costs_host=str(tmp_path / "gpu.json"))
    settings = budget_settings(args)
    assert settings["budget"] == 6 and settings["budget_mode"] == "auto"
    assert settings["costs"].draft_host.per_call_s == pytest.approx(0.5e-3)
    config = SSDConfig(k=K, **settings)                          # what the ranks agree on at connection
    assert config.costs.target(1)(5) == pytest.approx(6e-3)
    assert budget_settings(argparse.Namespace(budget="3", max_budget=8, costs=None, costs_host=None)) == dict(budget=3)
    with pytest.raises(ValueError, match="only with --budget auto"):
        budget_settings(argparse.Namespace(budget="3", max_budget=8, costs="x", costs_host=None))
