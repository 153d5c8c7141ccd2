"""The speculative round reads the device exactly once: the outcome (num_accepted + tokens) that the host needs
for stop checks, streaming and the drafter's history. Checked on the sampled draft-model path, the one with the
most host-side work (per-row settings, q, ragged rows).

CPU: every tensor -> host conversion (``item``, ``tolist``, ``__bool__``, ``__int__``, ``__float__``, ``cpu``)
made from verispec's own code during one round is recorded with its call site; only the documented outcome read
in ``engine/round.py`` may appear (plus the conversion of that outcome, already on the host, in the same
function): the status words travel in it, so checking them costs no read of their own. ``verify/sampling.py``'s filters decide on host copies of the settings, so they are allowed there only
when those are host tensors. GPU: the round runs under ``torch.cuda.set_sync_debug_mode("error")``, which raises
at any synchronizing call torch detects (``item``, ``nonzero``, blocking copies, ...). It does not flag the
outcome read itself (measured on an H100: a device -> host ``.cpu()`` is not among the calls it detects), so on
the GPU the round must pass with no detected synchronization at all.
"""
from __future__ import annotations

import collections
import inspect
import os

import pytest
import torch

from fakes import FakeModel
from test_engine import noisy_copy
import verispec
from verispec.drafters import DraftModel
from verispec.engine import Request, Scheduler, SchedulerConfig

CONVERSIONS = ("item", "tolist", "__bool__", "__int__", "__float__", "cpu")
# the package's own folder: call sites are named relative to it (a clone's folder may be named "verispec" too)
PACKAGE = os.path.dirname(os.path.abspath(verispec.__file__))


def _sampled_scheduler(target, drafter, backend):
    drafter.attach(target)
    sched = Scheduler(target, drafter, SchedulerConfig(2, 64, 3), verify_backend=backend)
    for i, prompt in enumerate([[1, 2, 3], [4, 5]]):
        sched.submit(Request(prompt, 20, temperature=1.0, top_k=5, top_p=0.9, seed=i, id=i))
    sched.step()                       # admission and a first round: the round below is a steady one
    return sched


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the fake runtime's CPU tensors need the Triton interpreter; on a GPU the test below runs")
def test_a_sampled_round_reads_the_host_only_for_its_outcome(monkeypatch):
    target = FakeModel(seed=0, eos_bias=-30.0)
    sched = _sampled_scheduler(target, DraftModel(noisy_copy(target, 0.15)), "triton")
    sites = collections.Counter()

    def recorder(name, original):
        def conversion(self, *args, **kwargs):
            caller = inspect.currentframe().f_back
            path = os.path.abspath(caller.f_code.co_filename)
            if path.startswith(PACKAGE + os.sep):      # verispec's own code, wherever the checkout lies
                host_settings = name == "__bool__" and caller.f_code.co_name == "_any" and self.device.type == "cpu"
                if not host_settings:
                    rel = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
                    sites[(rel, caller.f_code.co_name, name)] += 1
            return original(self, *args, **kwargs)
        return conversion

    for name in CONVERSIONS:
        monkeypatch.setattr(torch.Tensor, name, recorder(name, getattr(torch.Tensor, name)))
    sched._round()
    monkeypatch.undo()
    assert sites == {("engine/round.py", "read_outcome", "cpu"): 1,      # the one read of the outcome
                     ("engine/round.py", "read_outcome", "tolist"): 1}   # ... as lists, on the host


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts CUDA synchronizations: needs a CUDA GPU")
def test_a_sampled_round_has_no_hidden_synchronization_on_the_gpu(monkeypatch):
    """Everything a steady sampled round does before its one outcome read runs without a synchronizing call
    torch detects (sync_debug_mode "error"); the read itself is allowed, and it is reached."""
    from verispec.engine import round as engine_round
    from verispec.runtime import ModelConfig, load_model

    cfg = ModelConfig(vocab_size=256, num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128)
    target = load_model(cfg, device="cuda", dtype=torch.float32, seed=0)
    draft = load_model(cfg.replace(num_layers=1), device="cuda", dtype=torch.float32, seed=1)
    sched = _sampled_scheduler(target, DraftModel(draft), None)
    for _ in range(2):                 # graphs captured (the pass and the draft loop of the steady shape),
        sched._round()                 # kernels compiled: the next round is a steady one
    torch.cuda.synchronize()
    reads = []
    read_outcome = engine_round.read_outcome

    def allowed_read(out, meanwhile=None):
        def checked():                 # the next round's prelaunched drafts, queued before the wait: no sync either
            torch.cuda.set_sync_debug_mode("error")
            try:
                meanwhile()
            finally:
                torch.cuda.set_sync_debug_mode("default")

        torch.cuda.set_sync_debug_mode("default")
        reads.append(1)
        return read_outcome(out, None if meanwhile is None else checked)

    monkeypatch.setattr(engine_round, "read_outcome", allowed_read)
    torch.cuda.set_sync_debug_mode("error")
    try:
        sched._round()                 # a sync before the outcome read raises RuntimeError (the round fails)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert reads == [1]
    assert all(s.finish_reason is None for s in sched.running), [s.error for s in sched.running]
    assert sched.drafter.prelaunches > 0       # the checked round launched the next one's drafts
