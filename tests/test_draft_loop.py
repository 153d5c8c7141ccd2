"""The captured draft loop (``Model.draft_loop``, used by ``DraftModel`` / ``SelfSpeculative``) draws exactly
the drafts and q of the eager loop (one ``append`` per pass, ``draw`` in between).

Both loops run on the same bucket rows, as on a GPU: on the CPU the model's graph cache runs the captured
program eagerly on the same padded input buffers (``use_graphs`` forced on), which covers the loop's logic;
on a GPU the same checks replay real CUDA graphs. Each check drives two drafters over twins of one model
(``truncated``: shared weights, own caches) through ragged batches, rounds without drafting (the eager
catch-up pass), accept counts, finished rows leaving (``keep``), greedy and sampled settings.
"""
from __future__ import annotations

import random

import pytest
import torch

from verispec.device import _filled
from verispec.drafters import DraftModel, SamplingParams, SelfSpeculative
from verispec.engine import generate
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=96, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                  intermediate_size=64)
SETTINGS = {"greedy": (0.0, 0, 1.0), "t1": (1.0, 0, 1.0), "topk-topp": (0.8, 7, 0.9)}


def twin_drafters(model, force_graphs: bool):
    """(captured, eager): DraftModels over two twins of ``model``; the eager one never takes the loop."""
    captured, eager = DraftModel(model.truncated(CFG.num_layers)), DraftModel(model.truncated(CFG.num_layers))
    for d in (captured, eager):
        if force_graphs:
            d.model.use_graphs = True
    eager._loop_key = lambda forced=False: None
    return captured, eager


def sampling(settings: list[tuple], seed0: int = 5) -> SamplingParams:
    return SamplingParams.columns(tuple(s[0] for s in settings), tuple(s[1] for s in settings),
                          tuple(s[2] for s in settings), tuple(seed0 + b for b in range(len(settings))))


def drive(drafters, settings: list[tuple], rounds: int = 7, seed: int = 0):
    """Run the same rounds through every drafter; assert identical drafts, q and draft-cache lengths."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(CFG.vocab_size) for _ in range(n)] for n in (5, 11, 3)][: len(settings)]
    first = [rng.randrange(CFG.vocab_size) for _ in prompts]
    for d in drafters:
        d.reserve(None, 4, 96)
        d.admit(list(range(len(prompts))), prompts, first, sampling(settings))
    for r in range(rounds):
        batch = len(drafters[0]._rows)
        k = [4, 3, 0, 8, 2, 4, 1][r % 7]
        caps = [k] * batch if r != 4 else [k - b % 2 for b in range(batch)]        # one ragged round
        proposals = [d.propose(caps) for d in drafters]
        ref = proposals[0]
        for p in proposals[1:]:
            assert torch.equal(p.draft_tokens.cpu(), ref.draft_tokens.cpu())
            assert (p.draft_probs is None) == (ref.draft_probs is None)
            if ref.draft_probs is not None:
                # each q is exactly the distribution its draft was drawn from; on a GPU a softmax of the padded
                # bucket's rows may round differently from one of B rows (the tokens above are still equal)
                exact = ref.draft_probs.device.type == "cpu"
                assert torch.equal(p.draft_probs.cpu(), ref.draft_probs.cpu()) if exact else \
                    torch.allclose(p.draft_probs.cpu(), ref.draft_probs.cpu(), rtol=1e-5, atol=1e-8)
        lengths = [d.model.cache.lengths.tolist() for d in drafters]
        assert all(x == lengths[0] for x in lengths)
        accepted = [rng.randint(0, n) for n in caps]
        emitted = [ref.draft_tokens[b, :a].tolist() + [rng.randrange(CFG.vocab_size)] for b, a in enumerate(accepted)]
        for d in drafters:
            d.commit(accepted, emitted)
        if r == 3 and batch > 1:
            for d in drafters:
                d.keep([batch - 1] + list(range(batch - 2)))                     # the second-to-last row ends
    return drafters


@pytest.fixture(scope="module")
def cpu_model():
    return load_model(CFG, device="cpu", dtype=torch.float32, seed=3)


@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("batch", [1, 3])
def test_captured_loop_program_equals_the_eager_loop_on_cpu(cpu_model, name, batch):
    captured, eager = twin_drafters(cpu_model, force_graphs=True)
    drive([captured, eager], [SETTINGS[name]] * batch)
    # the loop really ran through the graph cache (its capture-free path on the CPU), once per bucket and k
    assert captured.model._graphs.count("draft") > 0 and eager.model._graphs.count("draft") == 0


def test_several_settings_take_the_eager_loop(cpu_model):
    captured, eager = twin_drafters(cpu_model, force_graphs=True)
    drive([captured, eager], [SETTINGS["t1"], SETTINGS["topk-topp"], SETTINGS["greedy"]])
    assert captured.model._graphs.count("draft") == 0


def test_forced_tokens_run_the_same_passes(cpu_model):
    """OracleDraft's cost model feeds given tokens through the loop: the same tokens come back and both
    draft caches hold the same K/V afterwards (the next sampled proposal reads them)."""
    captured, eager = twin_drafters(cpu_model, force_graphs=True)
    for d in (captured, eager):
        d.reserve(None, 2, 64)
        d.admit([0, 1], [[3, 4, 5], [6]], [7, 8], sampling([SETTINGS["t1"]] * 2))
    forced = torch.tensor([[10, 11, 12], [13, 14, 15]])
    outs = [d._run(3, forced=forced) for d in (captured, eager)]
    assert all(torch.equal(drafts.cpu(), forced) and q is None for drafts, q in outs)
    assert captured.model._graphs.count("draft") == 1
    for d in (captured, eager):
        d.commit([3, 1], [[10, 11, 12, 20], [13, 21]])
    drive_one = [d.propose([2, 2]) for d in (captured, eager)]
    assert torch.equal(drive_one[0].draft_tokens, drive_one[1].draft_tokens)
    assert torch.equal(drive_one[0].draft_probs, drive_one[1].draft_probs)
    assert captured.model.cache.lengths.tolist() == eager.model.cache.lengths.tolist()


def test_draft_loop_checks_its_inputs(cpu_model):
    model = cpu_model.truncated(1)
    model.setup_cache(2, 16)
    model.prefill([[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match=r"inputs must be \[B=2, >= 3\]"):
        model.draft_loop(torch.zeros(3, 5, dtype=torch.long), 2, None, ("greedy",))
    with pytest.raises(ValueError, match="k >= 1"):
        model.draft_loop(torch.zeros(2, 5, dtype=torch.long), 0, None, ("greedy",))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_self_speculative_with_the_loop_keeps_greedy_exact(cpu_model, temperature, monkeypatch):
    """Through the engine: the loop's drafts feed verification; greedy output equals plain decoding, and a
    sampled run draws the same tokens with the captured and the eager loop."""
    prompts = [[1, 2, 3, 4], [7, 8]]
    plain = generate(cpu_model, prompts, drafter=None, max_new_tokens=12, temperature=temperature, seed=9)
    outs = {}
    for forced in (False, True):
        drafter = SelfSpeculative(layers=1)
        original = drafter.attach

        def attach(target, original=original, forced=forced):
            original(target)
            drafter.model.use_graphs = forced
        monkeypatch.setattr(drafter, "attach", attach)
        outs[forced] = generate(cpu_model, prompts, drafter=drafter, k=3, max_new_tokens=12,
                                temperature=temperature, seed=9)
        assert (drafter.model._graphs.count("draft") > 0) == forced
    assert [g.tokens for g in outs[True]] == [g.tokens for g in outs[False]]
    if temperature == 0.0:
        assert [g.tokens for g in outs[True]] == [g.tokens for g in plain]


@pytest.mark.parametrize("vocab, rows, block", [(37, 5, 16), (300, 64, 64), (1000, 7, 128), (4099, 3, 256)])
def test_race_kernel_matches_the_torch_race(vocab, rows, block):
    """race_triton picks the torch race's token, up to float near-ties (its log may differ by an ulp); it never
    picks a token of probability 0. Rows: dense softmax, top-k-filtered (zeros), one-hot."""
    from triton_interpreter import DEVICE
    from verispec.drafters.base import draft_uniforms, race_torch
    from verispec.drafters.race import race_triton

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(rows, vocab, generator=g) * torch.rand(rows, 1, generator=g) * 4
    q = torch.softmax(logits, dim=-1)
    q[1::3] = torch.where(q[1::3] >= q[1::3].topk(5, dim=-1).values[:, -1:], q[1::3], 0.0)
    q[2::3] = torch.nn.functional.one_hot(logits[2::3].argmax(-1), vocab).float()
    seed = torch.randint(-2**62, 2**62, (rows,), generator=g)
    step = torch.randint(0, 2**40, (rows,), generator=g)
    # seed and step as strided column views, as a captured loop passes them (columns of its input buffer)
    packed = torch.stack([seed, step], dim=1).to(DEVICE)                       # [rows, 2]
    got = race_triton(q.to(DEVICE), packed[:, 0], packed[:, 1], block=block).cpu()
    want = race_torch(q, seed, step)
    keys = q / -torch.log(draft_uniforms(seed, step, vocab))
    picked = keys.gather(1, got[:, None])[:, 0]
    assert (q.gather(1, got[:, None]) > 0).all()
    assert torch.all((got == want) | (picked >= keys.max(dim=1).values * (1 - 1e-6)))
    assert (got == want).float().mean() > 0.9


AOT_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from verispec.drafters.race import _draft_race_partial_kernel
signature = {"q_ptr": "*fp32", "seed_ptr": "*i64", "step_ptr": "*i64", "part_key_ptr": "*fp32",
             "part_idx_ptr": "*i32", "stride_q": "i32", "vocab": "i32", "chunk": "i32", "num_splits": "i32",
             "BLOCK": "constexpr"}
source = ASTSource(fn=_draft_race_partial_kernel, signature=signature, constexprs={"BLOCK": 1024})
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
assert len(compiled.asm["cubin"]) > 0 and "div.rn.f32" in compiled.asm["ptx"]
print("ok")
"""


def test_race_kernel_compiles_for_an_h100():
    """The kernel lowers to an sm_90 cubin ahead of time (no GPU needed; in a process without the
    interpreter, whose jit functions cannot be compiled): the GPU path at least builds."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", AOT_COMPILE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_filled_writes_the_values_with_fills():
    host = torch.tensor([[2, 2, 5], [5, 5, 7]])
    assert torch.equal(_filled(host, "cpu"), host)
    assert torch.equal(_filled(torch.tensor(0.9).reshape(-1).expand(4), "cpu"), torch.full((4,), 0.9))
    assert _filled(torch.zeros(0, dtype=torch.long), "cpu").shape == (0,)


def test_filled_writes_integer_progressions_with_one_kernel_each(monkeypatch):
    """A tree's parents (a chain: -1, 0, 1, ...) or a row's positions: one arange per arithmetic run, one fill per
    run of equal values, never one kernel per entry; random mixtures of runs give their values exactly."""
    calls = []
    arange = torch.arange
    monkeypatch.setattr(torch, "arange", lambda *a, **kw: calls.append("arange") or arange(*a, **kw))
    chain = torch.tensor(list(range(-1, 62)) * 4, dtype=torch.int32)
    assert torch.equal(_filled(chain, "cpu"), chain) and calls == ["arange"] * 4
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        runs = []
        for _ in range(int(torch.randint(0, 8, (1,), generator=gen))):
            start, step, n = (int(v) for v in torch.randint(-6, 7, (3,), generator=gen))
            runs += [start + step * i for i in range(abs(n) + 1)]
        for dtype in (torch.int32, torch.int64, torch.float32):
            host = torch.tensor(runs, dtype=dtype)
            assert torch.equal(_filled(host, "cpu"), host), (runs, dtype)


# ------------------------------------------------------------------------------------------------ GPU


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="replays CUDA graphs: needs a GPU")
def test_captured_loop_equals_the_eager_loop_on_gpu(dtype, name, batch):
    model = load_model(CFG, device="cuda", dtype=dtype, seed=3)
    captured, eager = twin_drafters(model, force_graphs=False)
    assert captured.model.use_graphs
    drive([captured, eager], [SETTINGS[name]] * batch)
    assert captured.model._graphs.count("draft") > 0 and eager.model._graphs.count("draft") == 0
    # replays survive a re-used cache; a re-created cache drops every graph (its buffers are gone)
    drive([captured, eager], [SETTINGS[name]] * batch, seed=1)
    captured.model.setup_cache(8, 200, empty=True)
    assert len(captured.model._graphs) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures a CUDA graph: needs a GPU")
def test_host_values_captured_in_a_graph_survive_reuse_of_pinned_memory():
    from verispec.device import to_device

    out = torch.zeros(3, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with torch.cuda.graph(graph):
            out.copy_(to_device([1.5, 1.5, -2.0], "cuda", torch.float32))
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(20):                       # churn the pinned host allocator
        to_device(torch.randn(3), "cuda")
    graph.replay()
    assert out.tolist() == [1.5, 1.5, -2.0]


def test_draft_loop_benchmark_smoke(tmp_path):
    """benchmarks/draft_loop.py --smoke runs end to end on the CPU (equality check included) and writes its
    tables; the GPU run is the lead's."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "draft_loop.py"
    spec = importlib.util.spec_from_file_location("bench_draft_loop", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "draft_loop.md"
    assert bench.main(["--smoke", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.count("| 8 | 8 |") == 2 and "generate / bare" in text
