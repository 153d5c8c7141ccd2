"""benchmarks/quant.py on the CPU: the random-block model it times (llama.cpp's Q4_K_M type mix, finite logits) and
its report from saved parts (the GPU parts themselves run on a device: the commands in the module docstring)."""
import json

import pytest
import torch

pytest.importorskip("gguf")

from benchmarks import quant  # noqa: E402
from verispec.drafters import make_peaked  # noqa: E402
from verispec.runtime import ModelConfig  # noqa: E402
from verispec.runtime.quant.packed import packed_weights  # noqa: E402


def test_random_block_model_has_the_q4_k_m_mix():
    cfg = ModelConfig(vocab_size=320, num_layers=8, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                      intermediate_size=512)
    model = quant.packed_random_model(cfg, device="cpu", dtype=torch.float32)
    held = packed_weights(model.net)
    assert held["embed"].type_names == ("Q4_K",) and held["lm_head"].type_names == ("Q6_K",)
    # more_bits(i) for 8 layers: 0, 3 and 7 keep attn_v and ffn_down in Q6_K
    assert [held[f"layers.{i}.wqkv"].type_names[-1] for i in range(8)] == \
        ["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    assert [held[f"layers.{i}.w2"].type_names for i in (0, 1)] == [("Q6_K",), ("Q4_K",)]
    model.setup_cache(1, 16)
    logits = model.prefill([[1, 2, 3]])
    assert bool(torch.isfinite(logits).all()) and 0.01 < logits.std().item() < 100
    assert quant._decode_floor_bytes(model) == model.weight_bytes - held["embed"].nbytes


def test_report_from_saved_parts(tmp_path, monkeypatch):
    env = dict(date="2026-11-25 10:00 UTC", torch="2", cuda="12", triton="3", transformers="4", python="3.11",
               device="NVIDIA H100", sms=132, l2_mib=50, driver="1")
    checks = [dict(shape="q/o", type="Q4_K", N=4096, K=4096, v2_equals_v1=True, bad_m=[], alone=True,
                   dequant_equals_torch=True, finite=True)]
    rows = [dict(shape="q/o", type="Q4_K", N=4096, K=4096, M=1, packed_mb=9.4, floor_us=3.1, bf16_floor_us=11.1,
                 bf16_us=12.0, v1_us=9.0, v2_us=4.0)]
    dequant = [dict(shape="q/o", type="Q4_K", N=4096, K=4096, v1_us=20.0, v2_us=15.0, floor_us=14.0)]
    kernel = dict(env=env, bandwidth=3e12, rows=rows, checks=checks, dequant=dequant, command="python benchmarks/quant.py kernel")
    passes = {"v2": {"1": 2.5, "5": 2.7, "9": 3.0}, "v1": {"1": 4.0, "5": 5.0, "9": 6.0}}
    model = dict(env=env, bandwidth=3e12, shape="llama-3.1-8b", command="python benchmarks/quant.py model",
                 models=[dict(model="llama-3.1-8b Q4_K_M (packed)", weight_bytes=5.7e9, floor_bytes=4.9e9,
                              passes=passes, prefill={"1024": 30.0},
                              bit_checks=[dict(k=4, pass_equals_steps=True, batch_equals_alone=True, max_abs_diff=0.0)]),
                         dict(model="llama-3.1-8b bf16", weight_bytes=16e9, floor_bytes=15e9,
                              passes={"invariant": {"1": 5.7, "5": 6.3, "9": 6.8}}, prefill={"1024": 25.0})])
    smollm = dict(env=env, command="python benchmarks/quant.py smollm",
                  runs=[dict(model="dense bf16", weight_mb=270.0, median_tok_s=500.0, tokens=768, wall_s=2.0),
                        dict(model="packed", weight_mb=96.6, median_tok_s=520.0, tokens=768, wall_s=1.9)],
                  packed_equals_dense=dict(same=7, of=8, first_diff=[None] * 7 + [40]),
                  exact=[dict(drafter="lookup", k=4, differ_batch=[], alone_equal=True, alone_tok_s=900.0,
                              tokens_per_round=2.1)])
    for name, part in (("kernel", kernel), ("model", model), ("smollm", smollm)):
        (tmp_path / f"quant_{name}.json").write_text(json.dumps(part))
    monkeypatch.setattr(quant, "RESULTS", tmp_path / "results")
    assert quant.report(tmp_path, write=False) == tmp_path / "quant.md"
    text = (tmp_path / "quant.md").read_text()
    assert "Q4_K_M decode, B = 1 (v2): 2.50 ms = 400 tok/s = 65% of its packed-byte floor (1.63 ms)" in text
    assert "verify(k = 4) / decode = 1.08" in text and "1024 tokens: 30.0 ms packed vs 25.0 ms bf16 = 1.20x" in text
    assert "quoted in issue 24, not measured here" in text and "1 of 1 k values" in text
    assert "| q/o | Q4_K | 1 | 9.4 | 3.1 | 9.0 | 4.0 | 78% | 12.0 | 3.00x |" in text
    assert "speculative greedy == plain greedy in 1 of 1 (drafter, k) cells" in text and "7 of 8 prompts identical" in text
    assert not (tmp_path / "results").exists()
    quant.report(tmp_path, write=True)
    assert (tmp_path / "results" / "quant.md").read_text() == text


def test_kernel_report_with_v3(tmp_path):
    """--variants 2,3: the table has a column per variant timed, % floor of the fastest, v3's error beside the checks,
    and the summary fails a v3 error above the test's bound (2^-14)."""
    env = dict(date="2026-11-25 10:00 UTC", torch="2", cuda="12", triton="3", transformers="4", python="3.11",
               device="NVIDIA H100", sms=132, l2_mib=50, driver="1")
    checks = [dict(shape="q/o", type="Q4_K", N=4096, K=4096, alone=True, dequant_equals_torch=True, finite=True,
                   v3_err=1e-7),
              dict(shape="k/v", type="Q6_K", N=1024, K=4096, alone=True, dequant_equals_torch=True, finite=True,
                   v3_err=1e-3)]
    rows = [dict(shape="q/o", type="Q4_K", N=4096, K=4096, M=1, packed_mb=9.4, floor_us=3.1, bf16_floor_us=11.1,
                 bf16_us=12.0, v2_us=14.0, v3_us=4.0)]
    kernel = dict(env=env, bandwidth=3e12, rows=rows, checks=checks, dequant=[], command="python benchmarks/quant.py kernel")
    (tmp_path / "quant_kernel.json").write_text(json.dumps(kernel))
    text = quant.report(tmp_path, write=False).read_text()
    assert "| q/o | Q4_K | 1 | 9.4 | 3.1 | 14.0 | 4.0 | 78% | 12.0 | 3.00x |" in text
    assert "| q/o | Q4_K | 4096x4096 | yes | 1.0e-07 | yes | yes |" in text
    assert "on every shape and type: NO: k/v Q6_K." in text
    # a model part cut short (only its partial file, no bf16 model yet) still reports what it measured
    passes = {"v3": {"1": 2.5, "5": 2.6}, "v2": {"1": 6.3, "5": 14.0}}
    model = dict(env=env, bandwidth=3e12, shape="llama-3.1-8b", models=[
        dict(model="llama-3.1-8b Q4_K_M (packed)", weight_bytes=5e9, floor_bytes=4.6e9, passes=passes, prefill={})])
    (tmp_path / "quant_model.partial.json").write_text(json.dumps(model))
    text = quant.report(tmp_path, write=False).read_text()
    assert "Cut short (partial results): model." in text and "decode, B = 1 (v3): 2.50 ms" in text
    assert "verify(k = 4) / decode = 1.04 (goal <= 1.10); k = 8: nan; k = 4 with the other matmuls: v2 2.22." in text


def _tiny(**kw):
    shape = dict(vocab_size=320, num_layers=2, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                 intermediate_size=512)
    return ModelConfig(**{**shape, **kw})


def test_spec_cells_on_a_tiny_packed_model():
    """The spec part's logic on the CPU (torch dequantizer): plain + each (alpha, K) per batch size, every output ==
    plain decoding's, the bound from the given pass costs, one best K per (B, alpha), and its report."""
    from verispec.analysis import speedup_from_times

    target = quant.packed_random_model(_tiny(), device="cpu", dtype=torch.float32)
    make_peaked(target)
    draft = quant.packed_random_model(_tiny(tie_word_embeddings=True, num_layers=1), "Q8_0", seed=99, device="cpu",
                                      dtype=torch.float32)
    costs = {1: 4.0, 3: 4.1, 4: 4.2}                       # fake pass ms by tokens per sequence; the draft 1.0
    pass_ms = lambda model, B, T: 1.0 if model is draft else costs[T] * (1 + B / 10)  # noqa: E731
    res = quant.spec_cells(target, draft, [1, 2], [0.8, 0.9], [2, 3], prompt_tokens=8, new_tokens=10,
                           pass_ms=pass_ms)
    assert [(c["B"], c["alpha"], c["k"]) for c in res["cells"]] == \
        [(B, a, k) for B in (1, 2) for a, k in [(None, 0), (0.8, 2), (0.8, 3), (0.9, 2), (0.9, 3)]]
    assert all(c["exact"] for c in res["cells"])
    c = next(c for c in res["cells"] if (c["B"], c["alpha"], c["k"]) == (2, 0.8, 3))
    assert c["bound"] == pytest.approx(speedup_from_times(0.8, 3, 1.0, 4.2 * 1.2, 4.0 * 1.2))
    for B in (1, 2):
        for a in (0.8, 0.9):
            group = [c for c in res["cells"] if c["B"] == B and c["alpha"] == a]
            assert sum(c["best"] for c in group) == 1
            assert max(group, key=lambda c: c["tok_s"])["best"]
    env = dict(date="2026-11-25 10:00 UTC", torch="2", cuda="12", triton="3", transformers="4", python="3.11",
               device="cpu", sms=0, l2_mib=0, driver="-")
    res.update(env=env, shape="tiny", draft="tiny-draft", target_bytes=target.weight_bytes,
               draft_bytes=draft.weight_bytes, follows_successor=1.0)
    text = "\n".join(quant.spec_markdown(res) + quant.spec_summary(res))
    assert "### B = 2" in text and "| plain | - |" in text and "output == plain decoding in 10 of 10 cells" in text
    assert "B = 1, alpha 0.8: best K = " in text and "(goal >= 1.5x)" in text


def test_spec_and_model_batches_report(tmp_path):
    """The report with a spec part and a model part that timed decode at B = 8 and 32 (saved JSON)."""
    env = dict(date="2026-11-25 10:00 UTC", torch="2", cuda="12", triton="3", transformers="4", python="3.11",
               device="NVIDIA H100", sms=132, l2_mib=50, driver="1")
    cells = [dict(B=1, config="plain", alpha=None, k=0, tok_s=250.0, wall_tok_s=240.0, captured=0, rounds=128,
                  tokens_per_round=1.0, exact=True, speedup=1.0),
             dict(B=1, config="chain k=3", alpha=0.8, k=3, tok_s=400.0, wall_tok_s=380.0, captured=0, rounds=50,
                  tokens_per_round=2.9, exact=True, speedup=1.6, bound=1.7, expected_tokens_per_round=2.95, best=True),
             dict(B=1, config="chain k=4", alpha=0.8, k=4, tok_s=390.0, wall_tok_s=380.0, captured=0, rounds=45,
                  tokens_per_round=3.3, exact=False, speedup=1.56, bound=1.72, expected_tokens_per_round=3.36,
                  best=False)]
    spec = dict(env=env, shape="llama-3.1-8b", draft="llama-3.2-1b", target_bytes=5.9e9, draft_bytes=1.3e9,
                follows_successor=1.0, batches=[1], alphas=[0.8], ks=[3, 4], prompt_tokens=128, new_tokens=128,
                costs=[dict(B=1, context=192, decode_ms=3.8, verify_ms={"3": 3.9, "4": 3.95},
                            verify_width={"3": 5, "4": 5}, draft_ms=1.0)],
                cells=cells, command="python benchmarks/quant.py spec")
    model = dict(env=env, bandwidth=3e12, shape="llama-3.1-8b", command="python benchmarks/quant.py model",
                 models=[dict(model="llama-3.1-8b Q4_K_M (packed)", weight_bytes=5.7e9, floor_bytes=4.5e9,
                              passes={"v3": {"1": 3.8}}, decode={"v3": {"1": 3.8, "32": 9.0}}, context=512,
                              kv_bytes_per_token=131072, prefill={}),
                         dict(model="llama-3.1-8b bf16", weight_bytes=16e9, floor_bytes=15e9,
                              passes={"invariant": {"1": 6.3}}, decode={"invariant": {"1": 6.3, "32": 12.0}},
                              context=512, kv_bytes_per_token=131072, prefill={})])
    (tmp_path / "quant_spec.json").write_text(json.dumps(spec))
    (tmp_path / "quant_model.json").write_text(json.dumps(model))
    text = quant.report(tmp_path, write=False).read_text()
    assert "B = 1, alpha 0.8: best K = 3, 1.60x plain decoding (goal >= 1.5x) (400 tok/s; bound 1.70x)" in text
    assert "output == plain decoding in 2 of 3 cells" in text and "| 0.8 | **3** | 400 | **1.60x** | 1.70x |" in text
    assert "| 1 | 192 | 3.80 | 3: 3.90 @ 5 (1.03), 4: 3.95 @ 5 (1.04) | 1.00 | 0.26 |" in text
    # B = 32: floor = (4.5e9 + 32 * 512 * 131072) / 3e12 s = 2.22 ms
    assert "| llama-3.1-8b Q4_K_M (packed) | v3 | 32 | 9.00 | 3556 | 2.22 | 25% |" in text
    assert "decode at B = 32: packed 3556 tok/s (9.00 ms a step) vs bf16 2667 tok/s (1.33x)" in text


def test_gpu_parts_refuse_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the refusal is for CPU-only machines")
    for part in ("spec", "model"):
        with pytest.raises(SystemExit, match="no CUDA device"):
            quant.main([part, "--out", str(tmp_path)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (packed.cu, CUDA graphs)")
def test_spec_cells_on_the_gpu():
    """The spec part's path on a GPU (packed.cu, graphs, the peaked model's dense embedding, a packed Q8_0 draft
    cost model), tiny shapes: speculative output == plain decoding at B = 1 and 4, pass costs measured."""
    from benchmarks.exact import _pass_ms
    from verispec import generate

    target = quant.packed_random_model(_tiny(vocab_size=512), device="cuda")
    successor = make_peaked(target)
    draft = quant.packed_random_model(_tiny(vocab_size=512, tie_word_embeddings=True, num_layers=1), "Q8_0", seed=99,
                                      device="cuda")
    res = quant.spec_cells(target, draft, [1, 4], [0.8], [2, 4], prompt_tokens=16, new_tokens=24,
                           pass_ms=lambda model, B, T: _pass_ms(model, B, T, 5), synchronize=torch.cuda.synchronize)
    assert len(res["cells"]) == 6 and all(c["exact"] for c in res["cells"])
    assert all(c["decode_ms"] > 0 and c["draft_ms"] > 0 and c["verify_ms"][4] > 0 for c in res["costs"])
    tokens = generate(target, [[1, 2, 3]], max_new_tokens=16)[0].tokens
    assert all(b == successor[a] for a, b in zip(tokens, tokens[1:]))


def test_model_timings_at_batch_sizes_on_a_tiny_packed_model(monkeypatch):
    """model --batches: decode timed at each B over B admitted sequences of CONTEXT tokens (the pass timer faked: it
    needs CUDA graphs), B = 1 from the passes' 1-token pass, the KV bytes a token holds."""
    import benchmarks.exact as exact

    calls = []
    monkeypatch.setattr(exact, "_pass_ms", lambda model, B, T, reps: calls.append((B, T)) or 1.0 + B / 10 + T / 100)
    monkeypatch.setattr(quant, "CONTEXT", 24)
    model = quant.packed_random_model(_tiny(), device="cpu", dtype=torch.float32)
    entry = quant._model_timings(model, "tiny", [1, 5], [], 3, {"v": {}}, [1, 2, 4])
    assert calls == [(1, 1), (1, 5), (2, 1), (4, 1)] and model.lengths.tolist() == [24] * 4
    assert entry["decode"] == {"v": {1: 1.11, 2: 1.21, 4: 1.41}} and entry["context"] == 24
    assert entry["kv_bytes_per_token"] == 2 * 2 * 2 * 64 * 4               # layers x (K, V) x kv heads x dim x fp32
