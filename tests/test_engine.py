"""The speculative engine on the fake runtime (tests/fakes.py): exactness, the folded
loop, batching, stopping, streaming, bad inputs. Fast: no real model is loaded here."""
from __future__ import annotations

import itertools
import math
import time

import pytest
import torch

from fakes import FakeModel, greedy_reference
from stats import chi2_pvalue
from verispec.drafters import DraftModel, OracleDraft, PromptLookup, SelfSpeculative
from verispec.engine import SpeculativeDecoder, generate

PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6], [7, 8, 9, 10, 11, 7, 8, 9, 12, 3, 1]]   # ragged
N_NEW = 20


@pytest.fixture(scope="module")
def target():
    return FakeModel(seed=0, eos_bias=-30.0)   # no EOS: every run reaches max_new_tokens


def noisy_copy(model: FakeModel, noise: float, seed: int = 1) -> FakeModel:
    """Same shape as ``model``, weights perturbed: a draft that agrees often but not always."""
    g = torch.Generator().manual_seed(seed)
    jitter = lambda t: t + noise * torch.randn(t.shape, generator=g, dtype=t.dtype)  # noqa: E731
    w = {k: ([jitter(x) for x in v] if isinstance(v, list) else jitter(v)) for k, v in model.w.items()}
    w["bias"] = model.w["bias"].clone()
    return FakeModel(weights=w, tokenizer=model.tokenizer)


@pytest.fixture(scope="module")
def references(target):
    return [greedy_reference(target, p, N_NEW) for p in PROMPTS]


DRAFTERS = {
    "draft-model": lambda t, refs: DraftModel(noisy_copy(t, 0.15)),
    "draft-model-perfect": lambda t, refs: DraftModel(FakeModel(weights=t.w, tokenizer=t.tokenizer)),
    "prompt-lookup": lambda t, refs: PromptLookup(max_ngram=3, min_ngram=1),
    "self-speculative": lambda t, refs: SelfSpeculative(layers=2),
    "oracle": lambda t, refs: OracleDraft(refs, acceptance_rate=0.7, seed=3),
}


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_target_only(target, references, name, k, batch):
    prompts, refs = PROMPTS[-batch:], references[-batch:]
    out = generate(target, prompts, drafter=DRAFTERS[name](target, refs), k=k, max_new_tokens=N_NEW)
    assert [g.tokens for g in out] == refs
    assert all(g.finish_reason == "length" for g in out)


def test_baseline_is_plain_decoding(target, references):
    out = generate(target, PROMPTS, drafter=None, max_new_tokens=N_NEW)
    assert [g.tokens for g in out] == references
    assert all(g.stats.proposed == 0 and g.stats.rounds == N_NEW - 1 for g in out)


def test_folded_loop_runs_one_target_pass_per_round(target, references):
    target.num_passes = target.num_prefills = 0
    draft = DraftModel(FakeModel(weights=target.w, tokenizer=target.tokenizer))   # accepts everything
    decoder = SpeculativeDecoder(target, draft, k=4)
    out = decoder.generate(PROMPTS[0], max_new_tokens=N_NEW)
    assert out.tokens == references[0]
    assert target.num_prefills == 1
    assert target.num_passes == out.stats.rounds
    # every round accepts all 4 drafts and emits 5 tokens: 1 (prefill) + 4 * 5 = 21 >= 20
    assert out.stats.rounds == 4 and out.stats.accepted == 16 and out.stats.acceptance_rate == 1.0
    # the draft runs k passes per round (2-token catch-up + k-1 single steps), never a commit pass
    assert draft.model.num_passes == 4 * out.stats.rounds


def test_ragged_prompt_lookup_batch(target, references):
    # prompt lookup proposes a different k_b per sequence (0 when nothing matches)
    out = generate(target, PROMPTS, drafter=PromptLookup(max_ngram=2, min_ngram=1), k=3, max_new_tokens=N_NEW)
    assert [g.tokens for g in out] == references
    assert len({g.stats.proposed for g in out}) > 1


def test_finished_sequences_leave_the_batch():
    model = FakeModel(seed=0)          # with EOS: sequences end in different rounds
    refs = [greedy_reference(model, p, 30) for p in PROMPTS]
    assert len({len(r) for r in refs}) > 1
    draft = DraftModel(noisy_copy(model, 0.15))
    sizes = []
    decoder = SpeculativeDecoder(model, draft, k=3)
    decoder._debug_round_hook = lambda d, active: sizes.append(
        (len(active), d.target.lengths.shape[0], draft.model.lengths.shape[0]))
    out = decoder.generate(PROMPTS, max_new_tokens=30)
    assert [g.tokens for g in out] == refs
    assert all(a == b == c for a, b, c in sizes[:-1])       # caches compacted with the active set
    assert sizes[0][0] < 3 or min(a for a, _, _ in sizes) < 3
    assert [a for a, _, _ in sizes] == sorted((a for a, _, _ in sizes), reverse=True)


def test_eos_and_max_new_tokens():
    model = FakeModel(seed=0)          # EOS is likely within 30 tokens for some prompts
    refs = [greedy_reference(model, p, 30) for p in PROMPTS]
    assert any(r[-1] in model.tokenizer.eos_token_ids for r in refs)
    out = generate(model, PROMPTS, drafter=PromptLookup(min_ngram=1), k=4, max_new_tokens=30)
    for g, r in zip(out, refs):
        assert g.tokens == r
        assert g.finish_reason == ("eos" if r[-1] in model.tokenizer.eos_token_ids else "length")
    one = generate(model, PROMPTS[0], max_new_tokens=1)
    assert one.tokens == refs[0][:1]


def test_stop_string_cuts_text_and_tokens(target, references):
    text = target.tokenizer.decode(references[2])
    stop = text[6:8]
    assert stop and text.find(stop) == 6
    out = generate(target, PROMPTS[2], drafter=PromptLookup(min_ngram=1), k=4, max_new_tokens=N_NEW, stop=[stop])
    assert out.finish_reason == "stop"
    assert out.text == text[:6]
    assert references[2][: len(out.tokens)] == out.tokens
    assert stop in target.tokenizer.decode(out.tokens) and stop not in target.tokenizer.decode(out.tokens[:-1])


def test_streaming_chunks_reassemble(target, references):
    chunks: dict[int, list[list[int]]] = {}
    out = generate(target, PROMPTS, drafter=PromptLookup(min_ngram=1), k=4, max_new_tokens=N_NEW,
                   on_tokens=lambda i, toks: chunks.setdefault(i, []).append(list(toks)))
    for i, g in enumerate(out):
        assert sum(chunks[i], []) == g.tokens
        assert len(chunks[i]) == g.stats.rounds + 1      # the prefill token, then one chunk per round


def test_string_prompt_and_chat(target):
    tok = target.tokenizer
    plain = generate(target, "hello world", max_new_tokens=5)
    assert plain.prompt_tokens == tok.encode("hello world")
    chat = generate(target, "hello world", max_new_tokens=5, chat=True)
    assert chat.prompt_tokens == tok.apply_chat_template([{"role": "user", "content": "hello world"}])
    assert plain.text == tok.decode(plain.tokens)


def test_stats_are_consistent(target):
    out = generate(target, PROMPTS, drafter=DraftModel(noisy_copy(target, 0.15)), k=3, max_new_tokens=N_NEW)
    for g in out:
        s = g.stats
        assert s.new_tokens == N_NEW == len(g.tokens)
        assert s.proposed == 3 * s.rounds
        assert 0 <= s.accepted <= s.proposed
        # every round emits accepted + 1, except that the last round may be cut by max_new_tokens
        assert s.new_tokens - 1 <= s.accepted + s.rounds
        assert math.isclose(s.acceptance_rate, s.accepted / s.proposed)


def test_acceptance_is_counted_per_tested_position(target, references):
    """A round tests draft i only if it accepted drafts 0..i-1: accepted / tested is the acceptance rate of a
    position. Hand-counted rounds, then the oracle at alpha = 0.8 (i.i.d. per position; its seed fixes the run):
    accepted / tested reads 0.8, accepted / proposed about E[accepted] / K = 0.59."""
    from verispec.engine import Stats

    st = Stats()
    for n, a in [(4, 4), (4, 1), (4, 0), (2, 2)]:        # (proposed, accepted)
        st.add_round(n, a)
    assert st.proposed_per_position == [4, 4, 3, 3]
    assert st.tested_per_position == [4, 3, 1, 1]
    assert st.accepted_per_position == [3, 2, 1, 1]
    assert st.acceptance_rate_per_position == [0.75, 2 / 3, 1.0, 1.0]
    refs = [greedy_reference(target, p, 210) for p in PROMPTS]         # longer than the run: every draft is real
    out = generate(target, PROMPTS, drafter=OracleDraft(refs, acceptance_rate=0.8, seed=3), k=4, max_new_tokens=200)
    accepted = sum(sum(g.stats.accepted_per_position) for g in out)
    tested = sum(sum(g.stats.tested_per_position) for g in out)
    proposed = sum(g.stats.proposed for g in out)
    assert abs(accepted / tested - 0.8) < 0.05, (accepted, tested, proposed)      # ~540 tests: 3 standard errors
    assert accepted / proposed < 0.7, (accepted, tested, proposed)


def test_verification_warm_up_runs_every_shape(monkeypatch):
    """``Scheduler.warm_up``'s verification pass (GPU only in a scheduler) runs on the CPU too: every batch size,
    draft count and setting, its outcome read as a round reads it."""
    from verispec.engine import round as round_mod

    seen = []
    real = round_mod.verification
    monkeypatch.setattr(round_mod, "verification",
                        lambda *a: seen.append((tuple(a[2]), a[3], a[5].all_greedy)) or real(*a))
    round_mod.warm_verification(torch.device("cpu"), torch.float32, 40, 3, 2, [(0.0, 0, 1.0), (0.7, 5, 0.9)], None)
    layouts = [tuple(nd) for b in (1, 2, 3) for nd in round_mod.warm_layouts(b, 2)]
    assert sorted(seen) == sorted((nd, max(nd), g) for nd in layouts for g in (True, False))
    assert {(k,) * b for b in (1, 2, 3) for k in range(3)} <= set(layouts)                # every uniform count
    assert (1, 0, 0) in layouts                                                           # and one draft among rows


def test_phase_times_cover_every_round_and_fit_in_the_call(target, monkeypatch):
    """A clock that advances one tick per reading makes the timings countable: every phase (draft,
    verify, accept, commit) is timed in every round a sequence took part in (>= 1 tick per round),
    the phases and the prefill are disjoint parts of the call, and the derived rates are exact."""
    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    decoder = SpeculativeDecoder(target, DraftModel(noisy_copy(target, 0.15)), k=3)
    start = time.perf_counter()
    out = decoder.generate(PROMPTS, max_new_tokens=N_NEW)
    wall = time.perf_counter() - start
    runs = [g.stats for g in out] + [decoder.last_stats]
    assert decoder.last_stats.rounds == max(g.stats.rounds for g in out)
    for s in runs:
        phases = (s.draft_s, s.target_s, s.verification_s, s.commit_s)
        assert all(t >= s.rounds for t in phases), (phases, s.rounds)
        assert s.prefill_s >= 1
        assert s.prefill_s + sum(phases) <= wall
        assert s.decode_s == s.total_s - s.queue_s - s.prefill_s
        assert s.tokens_per_s == (s.new_tokens - 1) / s.decode_s
        assert s.timed_phases   # CPU timings need no synchronization
    for g in out:   # a sequence's phase times are the batch's up to its end
        for name in ("draft_s", "target_s", "verification_s", "commit_s"):
            assert getattr(g.stats, name) <= getattr(decoder.last_stats, name)


# ------------------------------------------------------------------------------- sampling
def test_sampling_is_reproducible_and_seeded(target):
    kw = dict(drafter=DraftModel(noisy_copy(target, 0.15)), k=3, max_new_tokens=12, temperature=1.0)
    a = generate(target, PROMPTS, seed=7, **kw)
    b = generate(target, PROMPTS, seed=7, **kw)
    c = generate(target, PROMPTS, seed=8, **kw)
    assert [g.tokens for g in a] == [g.tokens for g in b]
    assert [g.tokens for g in a] != [g.tokens for g in c]
    assert a[0].stats.seed == 7


def test_mixed_greedy_and_sampling_rows(target, references):
    out = generate(target, PROMPTS, drafter=DraftModel(noisy_copy(target, 0.15)), k=3, max_new_tokens=N_NEW,
                   temperature=[0.0, 1.0, 0.0], top_k=[None, 5, None], seed=1)
    assert out[0].tokens == references[0] and out[2].tokens == references[2]
    assert out[1].tokens != references[1]


def _second_token_distribution(model: FakeModel, prompt, temperature, top_k, top_p) -> torch.Tensor:
    """Exact marginal of the 2nd generated token: sum_t1 p(t1 | prompt) p(t2 | prompt, t1)."""
    from verispec.verify.sampling import filtered_probs

    m = FakeModel(weights=model.w, tokenizer=model.tokenizer)
    m.setup_cache(1, len(prompt) + 2)
    p1 = filtered_probs(m.prefill([prompt])[0], temperature, top_k, top_p).double()
    marginal = torch.zeros_like(p1)
    for t1 in torch.nonzero(p1).flatten().tolist():
        m.rollback(torch.tensor([len(prompt)]))
        p2 = filtered_probs(m.decode(torch.tensor([[t1]]))[0, 0], temperature, top_k, top_p).double()
        marginal += p1[t1] * p2
    return marginal


SAMPLERS = {
    "target-only": lambda t: None,
    "draft-model": lambda t: DraftModel(noisy_copy(t, 0.3)),
    "prompt-lookup": lambda t: PromptLookup(max_ngram=2, min_ngram=1),
}


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("settings", [(1.0, None, None), (0.7, 8, 0.9)])
def test_sampled_token_distribution_matches_the_target(name, settings):
    """The 2nd generated token's distribution equals the target's exact marginal (chi-square).

    Exactness of speculative sampling means *same distribution*, not same tokens. N = 3000
    sequences of one batch (independent streams: each row has its own Philox counters), fixed
    seeds, so the test is deterministic; we require p > 1e-3 (a wrong acceptance rule, e.g.
    accepting every draft, gives p ~ 0 here).
    """
    temperature, top_k, top_p = settings
    model = FakeModel(vocab_size=24, hidden=12, seed=4, scale=1.5, eos_bias=-30.0)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 0, 10, 11, 12, 13, 14,
              15, 16, 17, 18, 19, 20, 21, 22]   # every token occurs: prompt lookup always has a match
    n = 3000
    out = generate(model, [prompt] * n, drafter=SAMPLERS[name](model), k=3, max_new_tokens=2,
                   temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    counts = torch.bincount(torch.tensor([g.tokens[1] for g in out]), minlength=24).double()
    probs = _second_token_distribution(model, prompt, temperature, top_k or 0, top_p or 1.0)
    if name != "target-only":
        assert sum(g.stats.proposed for g in out) > 0
    assert chi2_pvalue(counts, probs) > 1e-3


def test_chi2_detects_a_wrong_sampler():
    """Power check for the test above: a sampler that always accepts drafts is caught."""
    model = FakeModel(vocab_size=24, hidden=12, seed=4, scale=1.5, eos_bias=-30.0)
    draft = noisy_copy(model, 0.6)
    prompt = [3, 1, 4, 1, 5, 9]
    probs = _second_token_distribution(model, prompt, 1.0, 0, 1.0)
    # the draft's own marginal stands in for "accept everything"
    wrong = _second_token_distribution(draft, prompt, 1.0, 0, 1.0)
    counts = torch.distributions.Multinomial(3000, wrong).sample(torch.Size())
    assert chi2_pvalue(counts, probs) < 1e-3


# ------------------------------------------------------------------------------- bad input
def test_bad_inputs_fail_before_any_work(target):
    target.num_prefills = 0
    with pytest.raises(ValueError, match="k must be"):
        SpeculativeDecoder(target, PromptLookup(), k=0)
    with pytest.raises(ValueError, match="draft model vocab 41 != target vocab 40"):
        SpeculativeDecoder(target, DraftModel(FakeModel(vocab_size=41)))
    with pytest.raises(ValueError, match="prompt is an empty list"):
        generate(target, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(target, [[1, 2], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt is an empty string"):
        generate(target, "", max_new_tokens=4)
    with pytest.raises(ValueError, match="max_seq_len 10 is too small"):
        generate(target, [1] * 8, drafter=PromptLookup(), k=4, max_new_tokens=4, max_seq_len=10)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate(target, [1] * 4000, max_new_tokens=200)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, [1, 2], max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        generate(target, [1, 2], temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        generate(target, [1, 2], temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match=r"in \[0, 40\)"):
        generate(target, [1, 99])
    with pytest.raises(ValueError, match="temperature has 2 entries"):
        generate(target, [[1], [2], [3]], temperature=[1.0, 0.5])
    with pytest.raises(ValueError, match="layers"):
        SpeculativeDecoder(target, SelfSpeculative(layers=3))
    assert target.num_prefills == 0
