"""Bitwise exactness of the decode / verify pass on a GPU (skipped on the CPU): the invariant matmul, the attention,
the model's pass, and greedy generation in bf16 on a near-tie model, every drafter, alone and batched.

Random bf16 weights of N(0, 0.02) give near-uniform logits, so top-2 near-ties are everywhere (the worst case for a
pass whose rounding depends on its width); fp32 would hide the difference. Greedy output must still equal plain
decoding of each prompt alone, token for token."""
import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")

MS = (1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 65, 160, 300)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,K", [(960, 576), (2048, 2048), (6144, 4096), (1000, 1536)])
def test_invariant_matmul_rows_do_not_depend_on_the_batch(dtype, N, K):
    from verispec.runtime import gemv as vg

    g = torch.Generator(device="cuda").manual_seed(N + K)
    w = (torch.randn(N, K, device="cuda", generator=g) * K ** -0.5).to(dtype)
    b = torch.randn(N, device="cuda", generator=g).to(dtype)
    x = torch.randn(max(MS), K, device="cuda", generator=g).to(dtype)
    full = vg.invariant_matmul(x, w, b)
    assert _rel(full, torch.nn.functional.linear(x.double(), w.double(), b.double())) < 5e-3
    for M in MS:
        assert torch.equal(vg.invariant_matmul(x[:M], w, b), full[:M]), M
    perm = torch.randperm(x.shape[0], device="cuda")
    assert torch.equal(vg.invariant_matmul(x[perm], w, b), full[perm])
    for v in range(1, vg.invariant_variants() + 1):
        for M in (1, 40):
            assert torch.equal(vg.invariant_matmul(x[:M], w, b, variant=v), full[:M]), (v, M)
    # the check has teeth: another fixed order (fewer slices) gives other bits somewhere
    assert not torch.equal(vg.invariant_matmul(x[:64], w, b, slices=1), full[:64])


def test_invariant_matmul_refuses_what_it_cannot_do():
    from verispec.runtime import gemv as vg

    x = torch.randn(4, 12, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="K % 8"):
        vg.invariant_matmul(x, torch.randn(8, 12, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bf16/fp16"):
        vg.invariant_matmul(x.float()[:, :8], torch.randn(8, 8, device="cuda"))
    x8, w8 = x[:, :8].contiguous(), torch.randn(8, 8, device="cuda", dtype=torch.bfloat16)
    for bad in (-1, vg.invariant_variants() + 1):
        with pytest.raises(ValueError, match="variant must be 0"):
            vg.invariant_matmul(x8, w8, variant=bad)
        with pytest.raises(ValueError, match="variant must be 0"):
            vg.invariant_config(1, 8, 8, variant=bad)


def test_the_rules_variants_are_the_extensions_kernels():
    """``gemv.CLUSTER_VARIANTS`` are the extension's cluster-kernel variants and the rest its slice-warp kernel's
    (``invariant_variant`` relies on it), and every variant the rule picks exists."""
    from verispec.runtime import gemv as vg

    n = vg.invariant_variants()
    sm90 = torch.cuda.get_device_capability() >= (9, 0)
    for v in range(1, n + 1):
        if sm90:
            assert (vg.invariant_config(1, 4096, 4096, variant=v)["wr"] > 0) == (v in vg.CLUSTER_VARIANTS), v
    assert {vg.invariant_variant(M, N, 4096) for M in (1, 9, 17, 33, 65) for N in (4096, 6144, 28672)} <= set(
        range(1, n + 1))


def test_fp32_linear_is_invariant_in_8_row_chunks():
    from verispec.runtime import ops

    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(3000, 1024, device="cuda", generator=g) * 0.03
    x = torch.randn(70, 1024, device="cuda", generator=g)
    full = ops.linear(x, w, invariant=True, config=(4, 8))
    for M in (1, 3, 8, 9, 17, 70):
        assert torch.equal(ops.linear(x[:M], w, invariant=True, config=(4, 8)), full[:M]), M
    assert _rel(full, x.double() @ w.double().T) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_attention_rows_do_not_depend_on_batch_width_or_capacity(dtype):
    from verispec.runtime import ops

    g = torch.Generator(device="cuda").manual_seed(1)
    KV, G, D = 4, 4, 128
    H = KV * G

    def run(B, T, S, L, q_first):
        kc = torch.zeros(B, KV, S, D, device="cuda", dtype=dtype)
        vc = torch.zeros(B, KV, S, D, device="cuda", dtype=dtype)
        kc[0, :, :L + T] = base_k[:, :L + T]
        vc[0, :, :L + T] = base_v[:, :L + T]
        if B > 1:   # other sequences with their own contents and lengths
            kc[1:, :, :300] = torch.randn(B - 1, KV, 300, D, device="cuda", generator=g).to(dtype)
            vc[1:, :, :300] = torch.randn(B - 1, KV, 300, D, device="cuda", generator=g).to(dtype)
        lengths = torch.tensor([L] + [250] * (B - 1), device="cuda")
        q = torch.randn(B * T, H, D, device="cuda", generator=g).to(dtype)
        q[:T] = q_first[:T]
        return ops.decode_attention(q, kc, vc, lengths, T, D ** -0.5)[:T]          # sequence 0's rows

    L = 700
    base_k = torch.randn(KV, 1100, D, device="cuda", generator=g).to(dtype)
    base_v = torch.randn(KV, 1100, D, device="cuda", generator=g).to(dtype)
    q0 = torch.randn(17, H, D, device="cuda", generator=g).to(dtype)
    ref = run(1, 17, 1024, L, q0)                                                  # 17 tokens, alone
    for B, T, S in ((1, 1, 1024), (1, 5, 768), (3, 9, 2048), (8, 17, 1024), (2, 1, 4096)):
        out = run(B, T, S, L, q0)
        assert torch.equal(out, ref[:T]), (B, T, S)


def _near_tie_model(seed=0):
    from verispec import load_model
    from verispec.runtime import ModelConfig

    cfg = ModelConfig(vocab_size=4096, num_layers=6, hidden_size=512, num_heads=8, num_kv_heads=2, head_dim=64,
                      intermediate_size=1024, rope_theta=10000.0)
    return load_model(cfg, device="cuda", dtype=torch.bfloat16, seed=seed)


def test_a_k_token_pass_equals_k_steps_and_a_batch_equals_alone():
    """Model.append (graphs, width buckets): the k-token pass's logits equal k single-token passes' bit for bit,
    and a sequence's rows in a ragged batch of 3 under another capacity equal its rows alone."""
    m = _near_tie_model()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (200, 37, 5)]
    for k in (1, 2, 4, 6, 9, 13, 16):
        drafts = torch.randint(0, 4096, (3, k), generator=g)
        m.setup_cache(3, 300, empty=True)
        m.admit(prompts[:1])
        steps = torch.cat([m.append(drafts[:1, i:i + 1]) for i in range(k)], dim=1)
        m.setup_cache(3, 300, empty=True)
        m.admit(prompts[:1])
        one = m.append(drafts[:1])
        m.setup_cache(3, 1000, empty=True)
        m.admit(prompts)
        batch = m.append(drafts)[:1]
        assert torch.equal(one, steps), k
        assert torch.equal(batch, one), k


@pytest.mark.parametrize("kind", ["lookup", "self", "draft"])
def test_greedy_generation_is_exact_on_a_near_tie_model(kind):
    from verispec import DraftModel, PromptLookup, SelfSpeculative, generate

    m = _near_tie_model(seed=4)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 4096, (n,), generator=g).tolist() for n in (40, 7, 90, 16)]
    prompts[1] = prompts[1] * 4                                      # something for prompt lookup to copy
    make = {"lookup": lambda: PromptLookup(), "self": lambda: SelfSpeculative(layers=3),
            "draft": lambda: DraftModel(m.truncated(2))}[kind]
    ref = [generate(m, p, max_new_tokens=40).tokens for p in prompts]
    for k in (1, 3, 5, 8):
        alone = [generate(m, p, drafter=make(), k=k, max_new_tokens=40).tokens for p in prompts]
        batch = [o.tokens for o in generate(m, prompts, drafter=make(), k=k, max_new_tokens=40)]
        assert alone == ref, (kind, k)
        assert batch == ref, (kind, k)
    plain_batch = [o.tokens for o in generate(m, prompts, max_new_tokens=40)]
    assert plain_batch == ref


def test_warm_up_captures_everything_the_run_replays():
    """After generate's warm-up, the run itself captures nothing, and a second identical call captures nothing."""
    from verispec import SelfSpeculative, SpeculativeDecoder

    m = _near_tie_model(seed=5)
    prompts = [[1, 2, 3] * 5, [9] * 30, [4, 5]]
    dec = SpeculativeDecoder(m, SelfSpeculative(layers=2), k=4)
    dec.generate(prompts, max_new_tokens=30)
    first = dec.last_stats.graphs_captured
    graphs = len(m._graphs) + len(m._prefill_graphs)
    draft = dec.drafter.model
    draft_graphs = len(draft._graphs) + len(draft._prefill_graphs)
    assert first > 0
    dec.generate(prompts, max_new_tokens=30)
    assert dec.last_stats.graphs_captured == 0
    assert len(m._graphs) + len(m._prefill_graphs) == graphs                # the run captured nothing new
    assert len(draft._graphs) + len(draft._prefill_graphs) == draft_graphs


def _embedded_gguf() -> Path | None:
    path = os.environ.get("VERISPEC_GGUF")
    if path:
        return Path(path)
    try:
        from verispec.runtime.loading import embedded_gguf_path

        return embedded_gguf_path()
    except Exception:  # noqa: BLE001 - not installed on this machine
        return None


@pytest.mark.skipif(_embedded_gguf() is None, reason="the embedded SmolLM2 GGUF is not here (set VERISPEC_GGUF)")
def test_embedded_model_bf16_every_drafter_equals_plain_alone():
    from verispec import PromptLookup, SelfSpeculative, generate, load_model

    m = load_model(str(_embedded_gguf()), device="cuda", dtype=torch.bfloat16)
    prompts = ["Explain in two sentences why the sky is blue.", "Write a haiku about a lighthouse in winter.",
               "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox.",
               "List three uses of a paperclip that are not holding paper."]
    ref = [generate(m, p, max_new_tokens=64, chat=True).tokens for p in prompts]
    for drafter, k in ((PromptLookup, 8), (PromptLookup, 3), (lambda: SelfSpeculative(layers=20), 4)):
        batch = [o.tokens for o in generate(m, prompts, drafter=drafter(), k=k, max_new_tokens=64, chat=True)]
        assert batch == ref, (drafter, k)
