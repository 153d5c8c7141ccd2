"""CUDA-only checks of verispec.runtime: CUDA-graph replay equals eager, graph buckets survive keep(),
truncated models get their own graphs, and the embedded SmolLM2 decodes like transformers on the GPU."""
import pytest
import torch

from verispec.runtime import ModelConfig, load_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CFG = ModelConfig(vocab_size=1000, num_layers=3, hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=32,
                  intermediate_size=512, rope_theta=10000.0, attention_bias=True, qk_norm=True)


def rand_tokens(*shape, seed=0):
    return torch.randint(0, CFG.vocab_size, shape, generator=torch.Generator().manual_seed(seed)).cuda()


def prompts(lens, seed=0):
    return [rand_tokens(n, seed=seed + i).tolist() for i, n in enumerate(lens)]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_graphs_match_eager_through_rollback_and_keep(dtype, tol):
    graphed = load_model(CFG, device="cuda", dtype=dtype, seed=1)
    eager = load_model(CFG, device="cuda", dtype=dtype, seed=1, use_graphs=False)
    assert graphed.use_graphs and not eager.use_graphs
    outs = {}
    for name, m in (("graphed", graphed), ("eager", eager)):
        m.setup_cache(4, 96)
        seq = [m.prefill(prompts([5, 17, 1, 30]))]
        for step, k in enumerate([1, 4, 4, 1, 8]):
            seq.append(m.append(rand_tokens(m.batch_size, k, seed=step)))
            if step == 1:
                m.rollback(m.lengths - torch.tensor([0, 1, 2, 3], device="cuda"))
            if step == 2:
                m.keep(torch.tensor([2, 0, 3], device="cuda"))
        outs[name] = (seq, m.lengths.tolist())
    assert outs["graphed"][1] == outs["eager"][1]
    for a, b in zip(outs["graphed"][0], outs["eager"][0]):
        assert ((a.float() - b.float()).abs().max() / b.float().abs().max()).item() < tol
    # graphs per (rows, k): B=3 after keep() runs the B=4 bucket with one padding row
    assert len(graphed._graphs) == 3  # (4, 1), (4, 4), (4, 8)
    assert graphed.cache.lengths_for(4)[3].item() == 0


def test_graphs_survive_setup_cache_and_shrinking_batches():
    """A second generation on the same model reuses the cache and every captured graph; batches that
    shrink through keep() run in padded buckets and still match the eager model."""
    graphed = load_model(CFG, device="cuda", dtype=torch.float32, seed=4)
    eager = load_model(CFG, device="cuda", dtype=torch.float32, seed=4, use_graphs=False)
    ps = prompts([5, 9, 3, 7, 4, 8, 2, 6, 11], seed=7)
    counts = []
    for run in range(2):
        outs = {}
        for name, m in (("graphed", graphed), ("eager", eager)):
            m.setup_cache(9, 64)
            seq = [m.prefill(ps)]
            keep = list(range(9))
            for step in range(6):
                seq.append(m.append(rand_tokens(m.batch_size, 3, seed=10 * run + step)))
                keep = keep[:-2] if len(keep) > 2 else keep[:1]
                m.keep(torch.tensor(list(range(len(keep))), device="cuda"))
            outs[name] = (seq, m.lengths.tolist())
        assert outs["graphed"][1] == outs["eager"][1]
        for a, b in zip(outs["graphed"][0], outs["eager"][0]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        counts.append(len(graphed._graphs))
    # B = 9, 7, 5, 3, 1, 1 -> rows 9 (capped), 8, 8, 4, 1: four graphs, none captured again in run 2
    assert counts == [4, 4]


def test_verify_equals_decode_with_graphs():
    m = load_model(CFG, device="cuda", dtype=torch.float32, seed=2)
    ps, block = prompts([3, 40], seed=5), rand_tokens(2, 6, seed=6)
    m.setup_cache(2, 64)
    m.prefill(ps)
    packed = m.append(block)
    m.rollback(m.lengths - 6)
    steps = torch.cat([m.decode(block[:, i:i + 1]) for i in range(6)], dim=1)
    torch.testing.assert_close(packed, steps, rtol=1e-4, atol=1e-4)


def test_truncated_has_own_graphs():
    m = load_model(CFG, device="cuda", dtype=torch.float32, seed=3)
    d = m.truncated(1)
    for x in (m, d):
        x.setup_cache(2, 32)
        x.prefill(prompts([4, 6]))
    a, b = m.decode(rand_tokens(2, 1)), d.decode(rand_tokens(2, 1))
    assert not torch.allclose(a, b) and len(m._graphs) == len(d._graphs) == 1 and m._graphs is not d._graphs


def test_smollm2_greedy_on_gpu_matches_transformers():
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from verispec.runtime.loading import to_transformers
    try:
        smol = load_model(None, device="cuda", dtype=torch.float32)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    ids = smol.tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}])
    smol.setup_cache(1, 128)
    logits, ours = smol.prefill([ids]), []
    for _ in range(20):
        nxt = logits.argmax(-1)
        ours.append(int(nxt))
        if ours[-1] == 2:
            break
        logits = smol.decode(nxt[:, None])[:, 0]
    ref = to_transformers(smol.net)
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids], device="cuda"), max_new_tokens=20, do_sample=False,
                           eos_token_id=2, pad_token_id=2)
    assert ours == out[0, len(ids):].tolist()[: len(ours)]


def test_parity_vs_transformers_on_gpu_fp32(tmp_path):
    """The CPU parity test's llama-3 RoPE case, on the GPU through CUDA graphs (fp32, 1e-4)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p)) if "norm" in name else p.normal_(0.0, 0.1)
    hf.save_pretrained(tmp_path)
    m = load_model(tmp_path, device="cuda", dtype=torch.float32)
    ids = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        ref = hf.cuda()(ids).logits[0, 30:]
    m.setup_cache(1, 64)
    got = torch.cat([m.prefill([ids[0, :31].tolist()]), m.append(ids[:, 31:36])[0]]
                    + [m.decode(ids[:, t:t + 1])[0] for t in range(36, 40)])
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-4


def test_bf16_verify_equals_decode_bit_for_bit_at_batch_one():
    """B = 1: a verify pass of k <= 8 tokens gives bit-for-bit the logits of k single-token decode steps in
    bf16 (batch-invariant matmuls and attention), so greedy speculative output equals AR output exactly."""
    cfg = CFG.replace(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=2,
                      head_dim=64, qk_norm=False, attention_bias=False)
    m = load_model(cfg, device="cuda", dtype=torch.bfloat16, seed=5)
    for k in (2, 5, 8):
        m.setup_cache(1, 128)
        m.prefill(prompts([37], seed=k))
        block = torch.randint(0, cfg.vocab_size, (1, k), generator=torch.Generator().manual_seed(k)).cuda()
        packed = m.append(block)
        m.rollback(m.lengths - k)
        steps = torch.cat([m.decode(block[:, i:i + 1]) for i in range(k)], dim=1)
        assert torch.equal(packed, steps), (k, (packed.float() - steps.float()).abs().max().item())


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch needs sm_90+")
@pytest.mark.parametrize("batch", [1, 4])
def test_pdl_launches_give_the_same_logits_bit_for_bit(batch, monkeypatch):
    """With programmatic dependent launch (kernels start before their predecessor ends and wait for it in
    their prologue) a graphed decode + verify sequence gives exactly the logits of the serialized launches.
    Several passes in a row: a missing wait would read a half-written residual, K/V slot or x."""
    from verispec.runtime import ops

    cfg = CFG.replace(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=2,
                      head_dim=64, qk_norm=False, attention_bias=False)

    def run(pdl: bool):
        monkeypatch.setattr(ops, "PDL", pdl)
        m = load_model(cfg, device="cuda", dtype=torch.bfloat16, seed=7)
        m.setup_cache(batch, 256)
        m.prefill(prompts([40 + 3 * b for b in range(batch)], seed=11))
        outs = []
        for step in range(6):
            k = 1 if step % 2 else 4
            tokens = torch.randint(0, cfg.vocab_size, (batch, k), generator=torch.Generator().manual_seed(step)).cuda()
            outs.append(m.append(tokens).clone())
        return outs

    assert ops.use_pdl(torch.device("cuda"))
    serial, overlapped = run(False), run(True)
    for a, b in zip(serial, overlapped):
        assert torch.equal(a, b), (a.float() - b.float()).abs().max().item()
