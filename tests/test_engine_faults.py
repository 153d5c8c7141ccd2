"""A fault ends the request it belongs to and nothing else (docs/engine.md, "Faults"), on the fake runtime.

Each test runs the same requests twice, fault-free and with one injected fault, and checks that only the
request the fault belongs to fails, with its reason, while every other request emits exactly the tokens of
the fault-free run (greedy and seeded sampling alike, unless the fault forces a round without drafts, which
keeps greedy tokens but not a sampled row's draws). Faults: NaN in one row's logits at round r, a drafter
exception in one request's drafting (``DraftError``) or in the shared drafter (no row to blame), a prefill
that raises (out of memory), a target pass that raises.
"""
from __future__ import annotations

import pytest

from fakes import FakeModel, greedy_reference
from test_engine import noisy_copy
from verispec.drafters import DraftModel, PromptLookup
from verispec.engine import Request, Scheduler, SchedulerConfig
from verispec.engine.round import failed_rows
from verispec.verify import status

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 4, 5, 6], [7, 8, 9, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]]
N_NEW = 12
MAX_STEPS = 200          # every run below ends in far fewer steps


@pytest.fixture(scope="module")
def target():
    return FakeModel(seed=0, eos_bias=-30.0)          # no EOS: every request runs to N_NEW unless it fails


def _drafter(name, target):
    if name == "draft-model":
        return DraftModel(noisy_copy(target, 0.15))
    if name == "prompt-lookup":
        return PromptLookup(max_ngram=3, min_ngram=1)
    return None


def _run(target, drafter_name, *, temperature=0.0, batch=4, prompts=PROMPTS, inject=None):
    """Run ``prompts`` (request i has id i and seed 10 + i) to the end on a fresh scheduler of ``batch`` rows;
    ``inject(step, scheduler)`` runs before each step. -> (sequences in request order, the scheduler)."""
    model = FakeModel(weights=target.w, tokenizer=target.tokenizer)   # a fresh cache, the same weights
    drafter = _drafter(drafter_name, model)
    if drafter is not None:
        drafter.attach(model)
    sched = Scheduler(model, drafter, SchedulerConfig(batch, 64, 3), isolate_drafter=True)
    seqs = [sched.submit(Request(list(p), N_NEW, temperature=temperature, seed=10 + i, id=i))
            for i, p in enumerate(prompts)]
    for step in range(MAX_STEPS):
        if sched.idle:
            break
        if inject is not None:
            inject(step, sched)
        sched.step()
    assert sched.idle, "the run did not end"
    return seqs, sched


def _same_except(clean, broken, bad: int):
    for i, (a, b) in enumerate(zip(clean, broken)):
        if i != bad:
            assert (b.finish_reason, b.error, b.generated) == (a.finish_reason, None, a.generated), i


def _at(step_no, action):
    return lambda step, sched: action(sched) if step == step_no else None


# ------------------------------------------------------------------------------------------ a bad row
@pytest.mark.parametrize("drafter", ["draft-model", "prompt-lookup", None])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_in_one_row_fails_that_request_alone(target, drafter, temperature):
    clean, _ = _run(target, drafter, temperature=temperature)

    def nan_in_row_2(sched):
        sched.target.nan_at = (2, 0)                  # the next target pass: NaN in row 2's first logits row

    broken, sched = _run(target, drafter, temperature=temperature, inject=_at(3, nan_in_row_2))
    bad = broken[2]
    assert bad.finish_reason == "error"
    assert bad.error == f"verification refused this round's target logits: {status.MESSAGES[status.NAN]}"
    assert 0 < len(bad.generated) < N_NEW and bad.generated == clean[2].generated[:len(bad.generated)]
    _same_except(clean, broken, 2)
    assert sched.drafter_faults == 0


def test_a_wrong_layout_fails_the_whole_round():
    """A NUM_DRAFT word: the batch's layout is wrong, so no row's outcome can be trusted."""
    rows = [[0, 5, -1, 0], [0, 7, -1, status.NUM_DRAFT]]
    with pytest.raises(RuntimeError, match="layout"):
        failed_rows(rows, "x")
    assert failed_rows([[0, 5, -1, 0], [0, 7, -1, status.DEAD_ROW]], "x") == {
        1: f"verification refused x: {status.MESSAGES[status.DEAD_ROW]}"}


def test_a_failing_target_pass_fails_the_running_requests_only(target):
    """The target pass is shared: when it raises, every running request fails with it; the waiting ones run
    afterwards exactly as they would have."""
    clean, _ = _run(target, "draft-model", batch=2)

    def break_next_pass(sched):
        append = sched.target.append

        def broken(tokens):
            sched.target.append = append              # once
            raise RuntimeError("injected: device lost")
        sched.target.append = broken

    broken, _ = _run(target, "draft-model", batch=2, inject=_at(2, break_next_pass))
    assert [(s.finish_reason, s.error) for s in broken[:2]] == [("error", "RuntimeError: injected: device lost")] * 2
    assert [s.generated for s in broken[2:]] == [s.generated for s in clean[2:]]


# ------------------------------------------------------------------------------------------ the drafter
class FaultyLookup(PromptLookup):
    """Prompt lookup whose work for one request (by prompt) raises from its ``after``-th call on: a bug or a bad
    input in one sequence's drafting."""

    def __init__(self, prompt, where, after=2):
        super().__init__(max_ngram=3, min_ngram=1)
        self.prompt, self.where, self.after = list(prompt), where, after

    def admit(self, seq_ids, prompts, first_tokens, sampling):
        super().admit(seq_ids, prompts, first_tokens, sampling)
        for row, p in zip(self._rows[-len(prompts):], prompts):
            if list(p) == self.prompt:
                self._break(row.history)

    def _break(self, history):
        original, calls = getattr(history, self.where), [0]

        def faulty(*args):
            calls[0] += 1
            if calls[0] > self.after:
                raise KeyError("injected")
            return original(*args)
        setattr(history, self.where, faulty)


@pytest.mark.parametrize("where", ["lookup", "extend"], ids=["propose", "commit"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_drafter_failure_in_one_request_fails_it_alone(target, where, temperature, monkeypatch):
    """The drafter names the row (``DraftError``): that request fails with the reason; the others keep their
    drafts, so even their sampled tokens equal the fault-free run's, and the drafter stays in use."""
    import test_engine_faults as me

    clean, _ = _run(target, "prompt-lookup", temperature=temperature)
    monkeypatch.setattr(me, "_drafter", lambda name, model: FaultyLookup(PROMPTS[1], where))
    broken, sched = _run(target, "prompt-lookup", temperature=temperature)
    assert broken[1].finish_reason == "error" and broken[1].error == "drafter: KeyError: 'injected'"
    _same_except(clean, broken, 1)
    assert sched.drafter_faults == 0 and sched.drafter_fault is None
    assert sum(s.stats.proposed for s in broken) == sum(s.stats.proposed for s in clean) - (
        clean[1].stats.proposed - broken[1].stats.proposed)


class Flaky:
    """Makes ``drafter.<method>`` raise once, on its first call after ``arm()``: a drafter failure that names no
    row (out of memory in the draft model's batched pass, a bug in shared state)."""

    def __init__(self, drafter, method):
        self.drafter, self.method, self.armed, self.fired = drafter, method, False, 0
        original = getattr(drafter, method)

        def call(*args):
            if self.armed:
                self.armed, self.fired = False, self.fired + 1
                raise MemoryError("injected: out of memory")
            return original(*args)
        setattr(drafter, method, call)


@pytest.mark.parametrize("method", ["propose", "commit", "admit", "keep"])
def test_a_drafter_failure_that_names_no_row_fails_nobody(target, method):
    """Nobody fails; every greedy request emits exactly the target's own greedy tokens; the drafter is set aside
    until the requests running at the fault have ended, then drafts again for the later ones."""
    prompts = PROMPTS + [[2, 7, 1, 8, 2, 8], [1, 4, 1, 4, 2, 1], [9, 9, 8, 9, 9, 8]]
    flaky = []

    def arm(step, sched):
        if step == 0:
            flaky.append(Flaky(sched.drafter, method))
        if step == 2:
            flaky[0].armed = True

    seqs, sched = _run(target, "draft-model", batch=2, prompts=prompts, inject=arm)
    assert flaky[0].fired == 1
    assert [(s.finish_reason, s.error) for s in seqs] == [("length", None)] * len(seqs)
    assert [s.generated for s in seqs] == [greedy_reference(target, p, N_NEW) for p in prompts]
    assert sched.drafter_faults == 1 and sched.drafter_fault is None       # set aside, then back in use
    assert seqs[-1].stats.proposed > 0                                      # the last request drafted again


# ------------------------------------------------------------------------------------------ admission
@pytest.mark.parametrize("drafter", ["draft-model", None])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_admission_that_runs_out_of_memory_fails_alone(target, drafter, temperature):
    """The four requests are admitted together; the prefill raises because of request 1: the group is retried
    one request at a time, request 1 fails with the reason and no token, the others run as without it."""
    clean, _ = _run(target, drafter, temperature=temperature)

    def oom(sched):
        sched.target.admit_fault = (PROMPTS[1], MemoryError("out of memory in the prefill"))

    broken, _ = _run(target, drafter, temperature=temperature, inject=_at(0, oom))
    assert broken[1].finish_reason == "error" and broken[1].generated == []
    assert broken[1].error == "admission failed: MemoryError: out of memory in the prefill"
    _same_except(clean, broken, 1)


def test_a_prompt_too_long_is_refused_alone(target):
    model = FakeModel(weights=target.w, tokenizer=target.tokenizer)
    sched = Scheduler(model, None, SchedulerConfig(2, 32, 0))
    ok = sched.submit(Request([1, 2, 3], 5, id=0))
    with pytest.raises(ValueError, match="exceeds max_seq_len 32"):
        sched.submit(Request(list(range(30)), 5, id=1))
    sched.run()
    assert ok.finish_reason == "length" and ok.generated == greedy_reference(target, [1, 2, 3], 5)
