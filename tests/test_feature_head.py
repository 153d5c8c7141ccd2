"""``FeatureHead``: greedy output equals plain decoding (ragged batches, several k, the graph path's layout), seeded
sampling is reproducible and independent of the batch, one round with the head's q preserves the target's
distribution (chi-square, with a power check: the same drafts verified with a q they were not drawn from fail), the
head's files round-trip and a head that does not fit its target is refused by name.

A random-weight head on a tiny fp32 target: its drafts are often wrong, which exercises rejections; the trained
head's acceptance is test_head_training.py's.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from stats import chi2_pvalue
from verispec.drafters import FeatureHead, SamplingParams
from verispec.drafters.base import greedy_tokens
from verispec.drafters.head_net import HeadConfig, HeadNet, default_layers
from verispec.engine import generate
from verispec.runtime import ModelConfig, load_model
from verispec.verify import verify_sample

CFG = ModelConfig(vocab_size=48, num_layers=4, hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                  intermediate_size=64)
PROMPTS = [[3, 4, 5, 6, 7], [9, 1], [20, 21, 22, 23, 24, 25, 26, 27, 28]]


def target(use_graphs: bool = False, seed: int = 0, device: str = "cpu"):
    model = load_model(CFG, device=device, dtype=torch.float32, seed=seed)
    model.use_graphs = use_graphs
    return model


def random_head(seed: int = 1, **kw) -> HeadNet:
    net = HeadNet(HeadConfig.for_target(CFG, **kw))
    net.reset_parameters(seed)
    return net


def test_default_layers_are_low_middle_high():
    assert default_layers(30) == (1, 14, 26) and default_layers(32) == (1, 15, 28) and default_layers(3) == (0, 1, 2)


@pytest.mark.parametrize("device, use_graphs", [
    ("cpu", False), ("cpu", True),
    pytest.param("cuda", True, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the "
                                                        "kernel passes and real CUDA graphs writing the states")),
], ids=["eager", "graph-layout", "cuda-graphs"])
def test_greedy_with_the_head_equals_plain_decoding(device, use_graphs):
    model = target(use_graphs, device=device)
    plain = [g.tokens for g in generate(model, PROMPTS, drafter=None, max_new_tokens=20)]
    head = FeatureHead(random_head())
    for k in (1, 3, 6):
        out = generate(model, PROMPTS, drafter=head, k=k, max_new_tokens=20)
        assert [g.tokens for g in out] == plain, k
    alone = generate(model, PROMPTS[2], drafter=head, k=3, max_new_tokens=20)
    assert alone.tokens == plain[2]
    # A random head's drafts are accepted by chance only: on a CPU half of the target seeds 0..11 accept none over
    # k = 1, 3, 6 (and a CUDA target's random weights are another draw). A head that always drafts token x (a draft
    # vocabulary of that one id) is accepted wherever the target's text has x after its first token with room for
    # a draft, so x from plain decoding's text makes the rounds that accept drafts (the commit's wider feeds) run.
    x = Counter(t for tokens in plain for t in tokens[1:-1]).most_common(1)[0][0]
    constant = random_head(draft_vocab=1)
    constant.d2t.fill_(x)
    out = generate(model, PROMPTS, drafter=FeatureHead(constant), k=3, max_new_tokens=20)
    assert [g.tokens for g in out] == plain
    assert sum(g.stats.accepted for g in out) > 0


def test_greedy_with_a_draft_vocabulary_equals_plain_decoding():
    model = target()
    net = random_head(draft_vocab=20)
    net.d2t.copy_(torch.randperm(CFG.vocab_size, generator=torch.Generator().manual_seed(0))[:20])
    plain = [g.tokens for g in generate(model, PROMPTS, drafter=None, max_new_tokens=12)]
    out = generate(model, PROMPTS, drafter=FeatureHead(net), k=3, max_new_tokens=12, temperature=0.0)
    assert [g.tokens for g in out] == plain
    out = generate(model, PROMPTS[0], drafter=FeatureHead(net), k=3, max_new_tokens=12, temperature=1.0, seed=3)
    assert len(out.tokens) == 12


def test_greedy_drafts_are_the_argmax_of_the_full_logits_without_the_scatter(monkeypatch):
    """``HeadNet.greedy`` (the draft loop's greedy choice) = greedy_tokens of the scattered V-wide logits, ties
    included (duplicate LM-head rows: the first maximum in target order wins); with an ascending d2t it never builds
    the V-wide row, with any other d2t it falls back to it; a copy into d2t is seen."""
    net = random_head(draft_vocab=12)
    with torch.no_grad():
        net.lm_head[7].copy_(net.lm_head[2])   # draft ids 2 and 7 tie on every row
        net.lm_head[9].copy_(net.lm_head[2])
    out = torch.randn(64, CFG.hidden_size, generator=torch.Generator().manual_seed(0))
    scatters = []
    original = HeadNet._scatter
    monkeypatch.setattr(HeadNet, "_scatter", lambda self, small: scatters.append(1) or original(self, small))
    for d2t in (torch.arange(0, 36, 3), torch.tensor([40, 3, 30, 9, 1, 2, 44, 5, 8, 0, 7, 6])):
        net.d2t.copy_(d2t)
        with torch.no_grad():
            full = net.logits(out, None, invariant=True)
            scatters.clear()
            got = net.greedy(out)
        assert torch.equal(got, greedy_tokens(full)), d2t
        assert net.d2t_ascending == bool((d2t[1:] > d2t[:-1]).all())
        assert len(scatters) == (0 if net.d2t_ascending else 1)
    assert (torch.isin(greedy_tokens(full), d2t[[2, 7, 9]])).any()   # the tie was exercised


def test_a_head_made_under_inference_mode_drafts():
    """Tensors made under torch.inference_mode track no version counter: the d2t order is still read, and a
    head whose d2t was rewritten there is read afresh when it is attached."""
    with torch.inference_mode():
        net = random_head(draft_vocab=12)
        out = torch.randn(4, CFG.hidden_size)
        assert torch.equal(net.greedy(out), greedy_tokens(net.logits(out, None, invariant=True)))
        net.d2t.copy_(torch.tensor([40, 3, 30, 9, 1, 2, 44, 5, 8, 0, 7, 6]))
        head = FeatureHead(net)
        head.attach(target())
        assert not head.net.d2t_ascending
        out = out.to(head.net.d2t.device)
        assert torch.equal(head.net.greedy(out), greedy_tokens(head.net.logits(out, None, invariant=True)))


def test_tree_children_are_the_top_w_of_the_full_logits(monkeypatch):
    """``HeadNet.top_children`` (a tree depth's children) = the top-w ids of the scattered V-wide logits, as a set
    per row (topk's order among ties is unspecified), w = 1 the greedy id; a draft vocabulary skips the scatter."""
    out = torch.randn(16, CFG.hidden_size, generator=torch.Generator().manual_seed(3))
    lm_head = torch.randn(CFG.vocab_size, CFG.hidden_size, generator=torch.Generator().manual_seed(4))   # shared
    scatters = []
    original = HeadNet._scatter
    monkeypatch.setattr(HeadNet, "_scatter", lambda self, small: scatters.append(1) or original(self, small))
    for net in (random_head(), random_head(draft_vocab=12)):
        if net.lm_head is not None:
            net.d2t.copy_(torch.tensor([40, 3, 30, 9, 1, 2, 44, 5, 8, 0, 7, 6]))
        with torch.no_grad():
            full = net.logits(out, lm_head, invariant=True)
            for w in (1, 2, 4):
                scatters.clear()
                got = net.top_children(out, w, lm_head)
                assert got.shape == (16, w)
                want = full.topk(w, dim=-1).indices
                assert torch.equal(got.sort(dim=-1).values, want.sort(dim=-1).values), w
                assert not scatters or net.lm_head is None or w == 1 and not net.d2t_ascending


def test_seeded_sampling_is_reproducible_and_batch_independent():
    model = target()
    with torch.no_grad():   # peaked q: a random head's near-uniform q would draw the same drafts from any state
        model.net.lm_head.mul_(6.0)
    head = FeatureHead(random_head())
    kw = dict(k=4, max_new_tokens=16, temperature=0.9, top_p=0.95)
    batch = generate(model, PROMPTS, drafter=head, seed=10, **kw)
    again = generate(model, PROMPTS, drafter=head, seed=10, **kw)
    assert [g.tokens for g in batch] == [g.tokens for g in again]
    for b in range(len(PROMPTS)):
        alone = generate(model, PROMPTS[b], drafter=head, seed=10 + b, **kw)   # row b's own seed, alone
        assert alone.tokens == batch[b].tokens, b


def one_round(model, head, prompt, num_rows: int, k: int):
    """``num_rows`` copies of ``prompt`` (seeds 0..n-1), each with its first token drawn, then one proposal of k
    drafts and the target pass -> (target logits [n*(k+1), V], drafts [n*k], q [n*k, V], first tokens' p [V])."""
    head.reserve(model, num_rows, 32)                  # turns the target's hidden states on
    model.setup_cache(num_rows, 32, empty=True)
    logits = model.admit([prompt] * num_rows)                                                  # [n, V]
    sampling = SamplingParams.columns((1.0,) * num_rows, (0,) * num_rows, (1.0,) * num_rows, tuple(range(num_rows)))
    first = torch.full((num_rows,), int(logits[0].argmax()))
    head.admit(list(range(num_rows)), [prompt] * num_rows, first.tolist(), sampling)
    prop = head.propose([k] * num_rows)
    tokens = torch.cat([first[:, None], prop.draft_tokens], dim=1)
    target_logits = model.append(tokens)                                                       # [n, k+1, V]
    return target_logits.flatten(0, 1), prop.draft_tokens.flatten(), prop.draft_probs, torch.softmax(target_logits[0, 0], -1)


def test_a_round_with_the_heads_q_keeps_the_target_distribution():
    model, head = target(seed=2), FeatureHead(random_head(seed=3))
    with torch.no_grad():   # a peaked p (and a head's q peaked elsewhere): the wrong rule's bias is then large
        model.net.lm_head.mul_(6.0)
    n, k = 1200, 2
    logits, drafts, q, p = one_round(model, head, [5, 17, 30, 2], n, k)
    seeds = torch.arange(n) + 1000
    out = verify_sample(logits, drafts, [k] * n, q, temperature=1.0, seed=seeds)
    counts = torch.bincount(out.tokens[:, 0], minlength=CFG.vocab_size)
    assert 0 < int(out.num_accepted.sum()) < n * k                # both accepts and rejections happened
    assert chi2_pvalue(counts, p) > 1e-3, (counts.tolist(), p.tolist())
    # power: the same drafts verified with a q they were not drawn from (uniform) are biased
    wrong = verify_sample(logits, drafts, [k] * n, torch.full_like(q, 1.0 / CFG.vocab_size), temperature=1.0,
                          seed=seeds)
    wrong_counts = torch.bincount(wrong.tokens[:, 0], minlength=CFG.vocab_size)
    assert chi2_pvalue(wrong_counts, p) < 1e-6


def test_files_round_trip_and_misfits_are_refused(tmp_path):
    net = random_head(seed=4)
    net.save(tmp_path / "h", extra={"note": "test"})
    loaded = FeatureHead(tmp_path / "h")
    assert loaded.cfg == net.cfg and loaded.meta["note"] == "test"
    for name, w in net.state_dict().items():
        assert torch.equal(loaded.net.state_dict()[name], w), name
    model = target()
    assert generate(model, PROMPTS[0], drafter=loaded, k=3, max_new_tokens=8).tokens == \
        generate(model, PROMPTS[0], max_new_tokens=8).tokens
    other = load_model(CFG.replace(hidden_size=48, head_dim=12), device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="hidden size 32 != the target's 48"):
        generate(other, PROMPTS[0], drafter=FeatureHead(net), k=2, max_new_tokens=4)
    with pytest.raises(FileNotFoundError, match="not a feature-head directory"):
        FeatureHead(tmp_path)
    with pytest.raises(TypeError, match="takes a directory or a HeadNet"):
        FeatureHead(3)
    weights = (tmp_path / "h" / "head.safetensors").read_bytes()
    (tmp_path / "h" / "head.safetensors").write_bytes(weights[: len(weights) // 2])       # a truncated file
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        FeatureHead(tmp_path / "h")


def test_the_shipped_head_fits_the_embedded_model():
    """``FeatureHead()`` is the head shipped for the embedded SmolLM2 (package data): it loads and reads that
    model's layers, width and vocabulary (its config only; no weights of the model are loaded)."""
    from verispec.runtime.loading import peek_config

    head = FeatureHead()
    cfg = peek_config()
    assert head.cfg.hidden_size == cfg.hidden_size and head.cfg.vocab_size == cfg.vocab_size
    assert head.cfg.target_num_layers == cfg.num_layers and max(head.cfg.target_layers) < cfg.num_layers
    assert head.meta["training"]["held_out"]["tau"] > 1.0


def _record_drafts(head, rows, log: dict) -> None:
    """Wrap ``head.propose``: each row's drafts appended to log[its request's seed] (``rows()``: the running
    sequences in batch order)."""
    propose = head.propose

    def recorded(max_num_draft):
        proposal = propose(max_num_draft)
        for b, seq in enumerate(rows()):
            log.setdefault(seq.request.seed, []).append(proposal.draft_tokens[b, :proposal.num_draft[b]].tolist())
        return proposal
    head.propose = recorded


def test_rows_that_finish_early_leave_the_others_untouched():
    """Requests of different lengths joining and leaving one scheduler (rows admitted mid-run, moved by ``keep``):
    each row's drafts, round by round, and its tokens (seeded, sampled) are exactly those of the request alone."""
    from verispec.engine import Request, Scheduler, SchedulerConfig

    model, head = target(), FeatureHead(random_head(seed=5))
    with torch.no_grad():   # peaked q: a random head's near-uniform q would draw the same drafts from any state
        model.net.lm_head.mul_(6.0)
    lengths = [3, 30, 24, 20]
    prompts = PROMPTS + [[11, 12, 13]]
    sched = Scheduler(model, head, SchedulerConfig(max_batch_size=3, max_seq_len=80, k=3))
    together, alone = {}, {}
    _record_drafts(head, lambda: sched.running, together)
    seqs = [sched.submit(Request(p, n, 0.9, 0, 1.0, 40 + i)) for i, (p, n) in enumerate(zip(prompts, lengths))]
    sched.run()                       # 4 requests through 3 rows: the first leaves (keep [2, 1]), the last joins
    for i, (p, n) in enumerate(zip(prompts, lengths)):
        solo = FeatureHead(random_head(seed=5))
        by_itself = Scheduler(model, solo, SchedulerConfig(max_batch_size=1, max_seq_len=80, k=3))
        _record_drafts(solo, lambda s=by_itself: s.running, alone)
        seq = by_itself.submit(Request(p, n, 0.9, 0, 1.0, 40 + i))
        by_itself.run()
        assert seqs[i].generated == seq.generated, i
    assert together == alone


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: "
                                                                  "real CUDA graphs of the head's draft loop"))]


def _drafts_of(model, head, k: int, temperature, seed: int) -> tuple[list, list]:
    """Every proposal of a scheduler run with ``head`` (rows of 4 for 3 requests of different lengths: a padded
    bucket, then rows leaving) -> ((drafts [B, K], their q or None) per round on the host, each request's tokens)."""
    from verispec.engine import Request, Scheduler, SchedulerConfig

    log = []
    propose = head.propose

    def recorded(max_num_draft):
        p = propose(max_num_draft)
        log.append((p.draft_tokens.cpu(), None if p.draft_probs is None else p.draft_probs.cpu()))
        return p
    head.propose = recorded
    sched = Scheduler(model, head, SchedulerConfig(max_batch_size=4, max_seq_len=64, k=k))
    seqs = [sched.submit(Request(p, n, t, 0, 0.95, seed + i))
            for i, (p, n, t) in enumerate(zip(PROMPTS, (16, 6, 11), temperature))]
    sched.run()
    return log, [s.generated for s in seqs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k, temperature", [(3, (0.0,) * 3), (4, (0.9,) * 3), (2, (0.9, 0.0, 0.7))],
                         ids=["greedy", "sampled", "mixed"])
def test_the_captured_draft_loop_drafts_what_the_eager_one_does(device, k, temperature):
    """The head's draft loop as one graph per (batch bucket, k, setting) -- the batch of 3 padded to the bucket of 4
    rows, then buckets 2 and 1 as requests end -- proposes the eager loop's drafts and q bit for bit, round by round
    (a batch mixing settings runs the eager body in both). On a CPU the graph path runs its program eagerly on the
    padded buffer."""
    model = target(use_graphs=True, device=device)
    with torch.no_grad():   # peaked q: a random head's near-uniform q would draw the same drafts from any state
        model.net.lm_head.mul_(6.0)
    runs = {}
    for graphs in (True, False):
        head = FeatureHead(random_head(seed=6))
        head.use_graphs = None if graphs else False
        runs[graphs] = _drafts_of(model, head, k, temperature, seed=10)
        if graphs and len(set(temperature)) == 1:
            assert head._graphs.count("draft") >= 2        # the loop ran on the graph path (buckets 4, 2, 1)
    (graph_log, graph_tokens), (eager_log, eager_tokens) = runs[True], runs[False]
    assert graph_tokens == eager_tokens and len(graph_log) == len(eager_log)
    for (gd, gq), (ed, eq) in zip(graph_log, eager_log):
        assert torch.equal(gd, ed)
        assert (gq is None) == (eq is None)
        if gq is not None:   # on CUDA bit for bit (batch-invariant matmuls); the CPU's BLAS is not invariant in M
            tol = 0 if device == "cuda" else 1e-5
            torch.testing.assert_close(gq, eq, rtol=tol, atol=tol / 100)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: real CUDA graphs writing the states")
def test_the_captured_target_pass_writes_the_eager_passs_states():
    """What the head reads: the states a captured target pass (padded rows and width bucket) leaves in
    ``Model.hidden`` and the prompt states of a captured prefill equal those of the eager passes on the same device
    (stale or zero states would differ by far more than the tolerance)."""
    layers = HeadConfig.for_target(CFG).target_layers
    seen = {}
    for graphs in (True, False):
        model = target(graphs, device="cuda")
        model.capture_hidden(layers)
        model.setup_cache(4, 64, empty=True)
        model.admit(PROMPTS)
        states = [model.take_prompt_hidden(b) for b in range(len(PROMPTS))]
        g = torch.Generator().manual_seed(7)
        for k in (3, 1, 4):
            model.append(torch.randint(0, CFG.vocab_size, (len(PROMPTS), k), generator=g))
            states.append(model.hidden.clone())
        seen[graphs] = states
    for a, b in zip(seen[True], seen[False]):
        assert a.abs().sum() > 0
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _steady_sampled_scheduler(model, head):
    from verispec.engine import Request, Scheduler, SchedulerConfig

    sched = Scheduler(model, head, SchedulerConfig(2, 64, 3))
    for i, prompt in enumerate(PROMPTS[:2]):
        sched.submit(Request(prompt, 20, temperature=1.0, top_k=5, top_p=0.9, seed=i))
    sched.step()                       # admission and a first round
    sched._round()                     # graphs captured: the next round is a steady one
    return sched


@pytest.mark.parametrize("use_graphs", [False, True], ids=["eager", "graph-layout"])
def test_the_heads_round_reads_nothing_from_the_device(monkeypatch, use_graphs):
    """In a steady sampled round neither the head (drafters/) nor the runtime converts a tensor to a host value
    (``item``, ``tolist``, ``bool``, ``int``, ``float``, ``cpu``): no per-step host read. (The CPU's reference
    verification and the engine's one outcome read do; tests/test_engine_syncs.py pins those.)"""
    import inspect
    import os

    import verispec

    package = os.path.dirname(os.path.abspath(verispec.__file__))
    sched = _steady_sampled_scheduler(target(use_graphs), FeatureHead(random_head(seed=6)))
    sites = Counter()

    def recorder(name, original):
        def conversion(self, *args, **kwargs):
            path = os.path.abspath(inspect.currentframe().f_back.f_code.co_filename)
            rel = os.path.relpath(path, package).replace(os.sep, "/")
            if rel.startswith(("drafters/", "runtime/")):
                sites[(rel, name)] += 1
            return original(self, *args, **kwargs)
        return conversion

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, recorder(name, getattr(torch.Tensor, name)))
    sched._round()
    monkeypatch.undo()
    assert sites == Counter()
    assert all(s.finish_reason is None for s in sched.running)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="counts CUDA synchronizations: needs a CUDA GPU")
def test_the_heads_propose_and_commit_do_not_synchronize_on_the_gpu():
    """The captured draft loop and commit of a steady sampled round run under sync_debug_mode "error": any
    synchronizing call torch detects in them (``item``, blocking copies, ``nonzero``, ...) raises."""
    head = FeatureHead(random_head(seed=6))
    sched = _steady_sampled_scheduler(target(True, device="cuda"), head)
    torch.cuda.synchronize()
    checked, errors = [], []

    def strict(method):   # the engine would swallow a drafter's error (faults): keep it
        def run(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return method(*args, **kwargs)
            except Exception as e:
                errors.append(e)
                raise
            finally:
                torch.cuda.set_sync_debug_mode("default")
                checked.append(method.__name__)
        return run

    head.propose, head.commit = strict(head.propose), strict(head.commit)
    sched._round()
    assert errors == [] and checked == ["propose", "commit"]
    assert head._graphs.count("draft") > 0 and head._graphs.count("commit") > 0
    assert all(s.finish_reason is None for s in sched.running), [s.error for s in sched.running]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the runtime's attention kernels run on CUDA")
def test_a_chain_on_cuda_runs_the_runtime_attention_batch_invariantly(monkeypatch):
    """``HeadNet.cached`` on CUDA, a chain (the draft loop's and the commits' passes: row b's entries at consecutive
    positions from its own base): the runtime's fused RoPE + K/V write, split-KV attention, add + RMSNorm and
    SiLU-multiply. Its outputs agree with the torch form within bf16 rounding, and a row's outputs are the same bits
    alone and among others, at T = 3 and T = 1 (the promise the drafts rest on)."""
    from verispec.runtime.cache import StaticKVCache
    from verispec.runtime.transformer import rope_table

    cfg = HeadConfig(hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256,
                     target_layers=(0, 1, 2), vocab_size=64)
    net = HeadNet(cfg, torch.float32)
    net.reset_parameters(0)
    net = net.to("cuda", torch.bfloat16)
    assert net._kernel_shape
    mc = cfg.model_config()
    g = torch.Generator(device="cuda").manual_seed(0)
    embed = torch.randn(64, 128, device="cuda", generator=g).bfloat16() * 0.5
    feats = torch.randn(3, 4, 128, device="cuda", generator=g).bfloat16()
    tokens = torch.randint(0, 64, (3, 4), device="cuda", generator=g)
    base = torch.tensor([0, 5, 2], device="cuda")

    def passes(rows, runtime: bool):
        monkeypatch.setattr(net, "_kernel_shape", runtime)
        cache = StaticKVCache(mc, 3, 40, "cuda", torch.bfloat16)
        rope = rope_table(mc, cache.capacity, "cuda")
        k, v = cache.k[0][:len(rows)], cache.v[0][:len(rows)]
        pos = base[rows, None] + torch.arange(3, device="cuda")
        with torch.no_grad():
            a = net.cached(feats[rows, :3], tokens[rows, :3], pos, embed, k, v, rope)         # T = 3
            b = net.cached(feats[rows, 3:], tokens[rows, 3:], base[rows, None] + 3, embed, k, v, rope)   # T = 1
            out = torch.cat([a, b], dim=1)
            return torch.cat([out, net.logits(out.reshape(-1, 128), torch.randn(64, 128, device="cuda",
                              generator=torch.Generator(device="cuda").manual_seed(1)).bfloat16(),
                              invariant=True).view(len(rows), 4, 64)], dim=-1)

    every = [0, 1, 2]
    fused, sdpa = passes(every, True), passes(every, False)
    assert ((fused.float() - sdpa.float()).abs().max() / sdpa.float().abs().max()).item() < 2e-2
    for r in every:
        assert torch.equal(passes([r], True)[0], fused[r]), r
