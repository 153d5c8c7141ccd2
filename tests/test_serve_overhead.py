"""The server's per-chunk and per-request work kept cheap without changing what it sends: a stream's token chunks
from a template are the bytes ``_Handlers.chunk`` writes; the chat template is compiled once per tokenizer (and
again when it is replaced); the watchdog that bounds every handler's wait hands ("lost", reason) to a request the
engine forgot, only to that one, and stops when no handler waits. Also the benchmark's ``SleepingModel`` (the
stand-in for the GPU in benchmarks/serve_overhead.py) decodes its successor chain through the engine."""
from __future__ import annotations

import asyncio
import json

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from verispec.serve import app as app_module  # noqa: E402
from verispec.serve.app import _Handlers, _TokenChunk  # noqa: E402
from verispec.serve.engine import Handle  # noqa: E402


class _Served:
    name = 'a "quoted" model'


def _handlers(engine=None) -> _Handlers:
    h = _Handlers.__new__(_Handlers)
    h.served, h.engine, h.watched = _Served(), engine, {}
    return h


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("text,ids", [("", [7]), ('a "b" \\ \n é 🙂', [3, 4, 5]), ("x", []), (" the", list(range(12)))])
def test_token_chunk_template_writes_the_generic_chunk(chat, text, ids):
    fast = _TokenChunk("chatcmpl-9", chat, _Served.name).render(text, ids)
    generic = _handlers().chunk("chatcmpl-9", chat, text, ids)
    assert fast.startswith("data: ") and fast.endswith("\n\n")
    # the same object, key for key; the same bytes unless a second boundary fell between the two calls
    assert json.loads(fast[6:]) | {"created": 0} == json.loads(generic[6:]) | {"created": 0}
    assert list(json.loads(fast[6:])["choices"][0]) == list(json.loads(generic[6:])["choices"][0])


def test_chat_template_is_compiled_once_and_again_when_replaced():
    from verispec.runtime.tokenizer import Tokenizer

    tok = Tokenizer(None, eos_token_ids=[1], chat_template="{% for m in messages %}{{ m['role'] }}: "
                                                           "{{ m['content'] }}\n{% endfor %}")
    messages = [{"role": "user", "content": "hi"}]
    assert tok.render_chat(messages) == "user: hi\n"
    compiled = tok._template[1]
    assert tok.render_chat([{"role": "user", "content": "again"}]) == "user: again\n"
    assert tok._template[1] is compiled
    tok.chat_template = "{{ messages[0]['content'] | upper }}"
    assert tok.render_chat(messages) == "HI"
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        tok.render_chat(messages)


class _Engine:
    """What the watchdog asks of an EngineLoop: whether it can answer at all, and whether it knows a request."""

    def __init__(self):
        self.problem = None
        self.forgotten: set[int] = set()

    def unresponsive(self):
        return self.problem

    def lost(self, handle):
        return handle.request.id in self.forgotten


class _Req:
    def __init__(self, i):
        self.id = i


def test_the_watchdog_hands_lost_to_the_forgotten_request_only(monkeypatch):
    monkeypatch.setattr(app_module, "POLL_S", 0.01)
    engine = _Engine()
    h = _handlers(engine)

    async def scenario():
        loop = asyncio.get_running_loop()
        kept, forgotten = Handle(_Req(1), loop), Handle(_Req(2), loop)
        h.watch(kept)
        h.watch(forgotten)
        engine.forgotten.add(2)
        lost = await asyncio.wait_for(h.next_event(forgotten), 2)
        assert kept.events.empty()
        kept.events.put_nowait(("tokens", ([5], "x")))           # the engine goes on delivering to the other
        assert await h.next_event(kept) == ("tokens", ([5], "x"))
        engine.problem = "the engine stopped: injected"           # now it cannot answer anyone
        dead = await asyncio.wait_for(h.next_event(kept), 2)
        h.unwatch(kept)
        h.unwatch(forgotten)
        _, task = h.watched[loop]
        await asyncio.wait_for(task, 2)                           # no handler waits: the watchdog ends
        return lost, dead

    lost, dead = asyncio.run(scenario())
    assert lost == ("lost", "the engine lost track of this request")
    assert dead == ("lost", "the engine stopped: injected")


def test_sleeping_model_decodes_its_successor_chain_through_the_engine():
    from benchmarks.serve_overhead import SleepingModel
    from verispec.bench.measure import run_engine
    from verispec.runtime.tokenizer import Tokenizer

    class Vocab:
        def get_vocab_size(self, with_added_tokens=True):
            return 50000

    model = SleepingModel(Tokenizer(Vocab(), eos_token_ids=[2]), pass_s=0.0)
    prompts = [[1000 + i, 1001 + i] for i in range(5)]
    run = run_engine(model, None, prompts, k=0, max_new_tokens=6, arrivals=[0.0] * 5, max_batch=3)
    for prompt, got in zip(prompts, run.outputs):
        chain, t = [], prompt[-1]
        for _ in range(6):
            t = int(model.successor[t])
            chain.append(t)
        assert got == chain
    assert model.launches == run.rounds + 2        # two admissions (3 rows, then 2) and one pass per round


def test_launched_hook_runs_once_per_round_after_the_target_pass():
    """The server hands a round's tokens to its event loop from ``Scheduler.launched_hook``: it must run once per
    round, after the target pass was launched (so the event loop's Python overlaps the device's work), for chains
    and for trees alike."""
    import sys
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fakes import FakeModel
    from verispec.drafters import PromptLookup
    from verispec.engine import Request, Scheduler, SchedulerConfig

    for tree in (None, (2, 1)):
        target = FakeModel(seed=0, eos_bias=-30.0)
        drafter = PromptLookup(max_ngram=3, min_ngram=1)
        drafter.attach(target)
        sched = Scheduler(target, drafter, SchedulerConfig(2, 64, 3, tree=tree))
        seen = []
        sched.launched_hook = lambda: seen.append(target.num_passes)
        for prompt in ([1, 2, 3, 1, 2], [4, 5, 4, 5]):
            sched.submit(Request(prompt, 8))
        sched.run()
        assert seen == list(range(1, sched.totals.rounds + 1)), (tree, seen)


def test_admitted_hook_runs_after_the_first_tokens_and_before_the_round_drafts():
    """A new request's first token goes to the event loop before its step's round drafts (``admitted_hook``): the
    hook runs once per step that admitted, after the prefill delivered the first tokens and before the drafter
    proposes; steps that admit nothing never call it."""
    import sys
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from fakes import FakeModel
    from verispec.drafters import PromptLookup
    from verispec.engine import Request, Scheduler, SchedulerConfig

    target = FakeModel(seed=0, eos_bias=-30.0)
    drafter = PromptLookup(max_ngram=3, min_ngram=1)
    drafter.attach(target)
    sched = Scheduler(target, drafter, SchedulerConfig(1, 64, 3))
    events = []
    propose = drafter.propose
    drafter.propose = lambda *a, **kw: (events.append("propose"), propose(*a, **kw))[1]
    requests = [sched.submit(Request(p, 4)) for p in ([1, 2, 3, 1, 2], [4, 5, 4, 5])]
    sched.admitted_hook = lambda: events.append(("admitted", [len(s.generated) for s in requests]))
    sched.run()
    admitted = [i for i, e in enumerate(events) if e != "propose"]
    assert [events[i][1] for i in admitted] == [[1, 0], [4, 1]]      # one row at a time: each first token delivered
    assert all(events[i + 1] == "propose" for i in admitted)          # ... and out before that step's round drafts


def test_chunks_are_made_on_the_event_loop_and_a_failing_one_ends_only_its_request():
    """The engine thread queues ids and their emission time; ``_deliver`` (the event loop) makes each stream's text,
    observes the latency metrics at the emission time, and turns a request whose text fails into ("lost", reason)
    while the others' events go through in order."""
    from verispec.engine import Request
    from verispec.serve.engine import _deliver
    from verispec.serve.metrics import Metrics
    from verispec.serve.text import IncrementalText

    class Broken:
        def add(self, tokens):
            raise UnicodeError("injected")

    metrics = Metrics("m")

    async def scenario():
        loop = asyncio.get_running_loop()
        good, bad = Handle(Request([1], 4), loop), Handle(Request([1], 4), loop)
        good.text, bad.text = IncrementalText(lambda ids: "".join("ab"[i] for i in ids), set(), ()), Broken()
        good.metrics = bad.metrics = metrics
        good.request.submitted_at = bad.request.submitted_at = 100.0
        good.outbox = []
        good.on_tokens(good.request, [0])       # queued with the time, nothing made yet
        assert good.outbox[0][1][0] == "emitted" and good.outbox[0][1][1][0] == [0] and good.text.sent == 0
        _deliver([(good, ("emitted", ([0], 100.5))), (bad, ("emitted", ([1], 100.5))),
                  (good, ("emitted", ([1, 0], 101.0))), (good, ("end", "SEQ"))])
        return [good.events.get_nowait() for _ in range(3)], bad.events.get_nowait(), good.last_chunk_at

    got, lost, last = asyncio.run(scenario())
    assert got == [("tokens", ([0], "a")), ("tokens", ([1, 0], "ba")), ("end", "SEQ")]
    assert lost[0] == "lost" and "UnicodeError: injected" in lost[1]
    assert last == 101.0
    assert metrics.ttft._sum.get() == pytest.approx(1.0)            # both emitted 0.5 s after they were submitted
