"""Dynamic draft trees (``tree="dyn:D,K,N"``, drafters/dynamic_tree.py) on a tiny real model (fp32, CPU): greedy
output equals plain decoding; each row's tree has the fixed counts per depth, parents before children, at most K
children per node, and the rows' shapes differ; the beam keeps exactly the N best cumulative log-probabilities;
dyn:D,1,1 proposes the chain's drafts; seeded sampling is reproducible, batch-independent and keeps the target's
distribution; bad specs and drafters that cannot rank nodes are refused naming the problem."""
import pytest
import torch

from verispec.drafters import DraftModel, OracleDraft, PromptLookup, SelfSpeculative, TreeDraftUnsupported
from verispec.drafters.base import SamplingParams
from verispec.drafters.dynamic_tree import DynamicTree, child_paths, expand
from verispec.engine import SpeculativeDecoder, generate
from verispec.engine.guards import check_tree, parse_tree_flag
from verispec.engine.tree_round import _pass_layout
from verispec.runtime import ModelConfig, load_model
from verispec.runtime.tree import tree_layout

CFG = ModelConfig(vocab_size=97, num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=96, rope_theta=10000.0)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6], [7, 8, 9, 10, 11, 7, 8, 9, 12, 3, 1]]   # ragged
N_NEW = 20


@pytest.fixture(scope="module")
def target():
    return load_model(CFG, device="cpu", dtype=torch.float32, seed=0)


@pytest.fixture(scope="module")
def references(target):
    return [g.tokens for g in generate(target, PROMPTS, drafter=None, max_new_tokens=N_NEW)]


def draft_model():
    return DraftModel(load_model(CFG, device="cpu", dtype=torch.float32, seed=5))


class Recording(DraftModel):
    """A DraftModel that keeps every tree it proposed (the tokens on the host)."""

    def __init__(self, model):
        super().__init__(model)
        self.proposals, self.layouts = [], []

    def propose_tree(self, widths):
        p = super().propose_tree(widths)
        self.proposals.append((p.draft_tokens.tolist(), p.parents, list(p.num_nodes)))
        self.layouts.append(p.paths)
        return p


def test_spec_spelling_and_counts():
    t = DynamicTree.parse("dyn:4,2,8")
    assert t == DynamicTree(4, 2, 8) and str(t) == "dyn:4,2,8"
    assert t.level_sizes == (2, 4, 8, 8) and t.num_nodes == 22
    assert DynamicTree(3, 5, 3).level_sizes == (3, 3, 3)                  # the root's top-5, 3 kept
    assert DynamicTree(3, 1, 1).example_parents() == (-1, 0, 1)           # a chain
    assert DynamicTree(3, 2, 3).example_parents() == (-1, -1, 0, 0, 1, 2, 2, 3)
    assert check_tree("dyn:4,2,8", draft_model()) == t
    assert parse_tree_flag("dyn:3,2,4", head=False, has_drafter=True) == DynamicTree(3, 2, 4)


@pytest.mark.parametrize("spec", ["dyn:3,2,3", "dyn:4,2,8", "dyn:2,4,4", "dyn:1,3,2"])
@pytest.mark.parametrize("make", [draft_model, lambda: SelfSpeculative(layers=2)], ids=["draft-model", "self-spec"])
def test_greedy_dynamic_tree_generation_equals_plain_decoding(target, references, spec, make):
    out = generate(target, PROMPTS, drafter=make(), tree=spec, max_new_tokens=N_NEW)
    assert [g.tokens for g in out] == references
    assert all(g.finish_reason == "length" for g in out)


def test_dynamic_trees_have_fixed_counts_ragged_shapes_and_parents_first(target, references):
    """Every proposal: each row has the spec's node count, level by level (depth d holds n_d nodes), each node's
    parent earlier and one depth up, at most K children per node, the node budget N per depth; and the rows' trees
    are not all one shape (the beam spends nodes per row)."""
    shape = DynamicTree(4, 3, 5)
    drafter = Recording(load_model(CFG, device="cpu", dtype=torch.float32, seed=5))
    out = generate(target, PROMPTS, drafter=drafter, tree=shape, max_new_tokens=N_NEW)
    assert [g.tokens for g in out] == references
    assert drafter.proposals
    row_shapes = set()
    for tokens, parents, num_nodes in drafter.proposals:
        assert num_nodes == [shape.num_nodes] * len(num_nodes)
        assert len(tokens) == len(parents) == sum(num_nodes)
        for b, n in enumerate(num_nodes):
            local = parents[b * n:(b + 1) * n]
            depth = []
            for j, p in enumerate(local):
                assert -1 <= p < j                                        # parents come before children
                depth.append(1 if p < 0 else depth[p] + 1)
            assert [depth.count(d) for d in range(1, shape.depth + 1)] == list(shape.level_sizes)
            assert depth == sorted(depth)                                 # depth by depth
            assert max(local.count(p) for p in set(local)) <= shape.top_k
            assert all(c <= shape.nodes for c in (depth.count(d) for d in set(depth)))
            row_shapes.add(tuple(local))
    assert len(row_shapes) > 1, "every row of every round had the same tree: nothing dynamic"
    # the device paths the target pass takes are the host parents' layout (runtime.tree.tree_layout)
    for (_, parents, num_nodes), paths in zip(drafter.proposals, drafter.layouts):
        n = num_nodes[0]
        rows = tuple((-1,) + tuple(p + 1 for p in parents[b * n:(b + 1) * n]) for b in range(len(num_nodes)))
        want = tree_layout(rows, n + 1)
        depth, path = _pass_layout(paths, n + 1, "cpu")
        assert torch.equal(depth, want.depth) and torch.equal(path, want.path)


def test_the_beam_keeps_the_best_cumulative_log_probabilities():
    """``expand`` against brute force: over every (node, child) pair the N best parent score + log q."""
    g = torch.Generator().manual_seed(0)
    B, n, V, K, keep = 3, 4, 11, 3, 5
    logits = torch.randn(B, n, V, generator=g)
    scores = torch.randn(B, n, generator=g)
    tokens, parent, best = expand(scores, logits, K, keep)
    logq = torch.log_softmax(logits, dim=-1)
    for b in range(B):
        cands = []
        for i in range(n):
            top = logits[b, i].topk(K).indices.tolist()
            cands += [(float(scores[b, i] + logq[b, i, v]), i, v) for v in top]
        want = sorted(cands, key=lambda c: -c[0])[:keep]
        assert [(i, v) for _, i, v in want] == list(zip(parent[b].tolist(), tokens[b].tolist()))
        torch.testing.assert_close(best[b], torch.tensor([s for s, _, _ in want]))
    paths = child_paths(torch.tensor([[[0, 1], [0, 2]]]), torch.tensor([[1, 1, 0]]), 3)
    assert paths.tolist() == [[[0, 2, 3], [0, 2, 4], [0, 1, 5]]]


def test_k1_n1_proposes_exactly_the_chains_drafts(target):
    """dyn:D,1,1 is a chain: the same tokens as ``propose([D] * B)`` of a draft model with the same weights."""
    D = 4
    chain, dyn = draft_model(), draft_model()
    firsts = [11, 12, 13]
    for d in (chain, dyn):
        d.attach(target)
        d.reserve(target, 3, 64)
        d.admit([0, 1, 2], PROMPTS, firsts, SamplingParams.columns([0.0] * 3, [0] * 3, [1.0] * 3, [0] * 3))
    drafts = chain.propose([D] * 3).draft_tokens                                      # [B, D]
    tree = dyn.propose_tree(DynamicTree(D, 1, 1))
    assert tree.parents == (-1, 0, 1, 2) * 3 and tree.num_nodes == [D] * 3
    assert tree.draft_tokens.view(3, D).tolist() == drafts.tolist()


def test_seeded_dynamic_tree_sampling_is_reproducible_and_batch_independent(target):
    kw = dict(tree="dyn:3,2,4", max_new_tokens=12, temperature=0.9, top_p=0.95)
    batch = generate(target, PROMPTS, drafter=draft_model(), seed=11, **kw)
    again = generate(target, PROMPTS, drafter=draft_model(), seed=11, **kw)
    assert [g.tokens for g in batch] == [g.tokens for g in again]
    alone = generate(target, PROMPTS[2], drafter=draft_model(), seed=13, **kw)     # row 2: seed + 2
    assert alone.tokens == batch[2].tokens


def test_sampled_dynamic_tree_generation_keeps_the_target_distribution():
    """As test_tree_engine's chi-square of the 3rd token (drawn inside a dyn:2,2,3 round), N = 800 rows; the power
    check: the same test rejects the draft model's own marginal at this N."""
    from stats import chi2_pvalue
    from test_tree_engine import _third_token_marginal

    cfg = ModelConfig(vocab_size=16, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=48, rope_theta=10000.0)
    target = load_model(cfg, device="cpu", dtype=torch.float32, seed=2)
    draft = load_model(cfg, device="cpu", dtype=torch.float32, seed=2)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        target.net.norm.mul_(8.0)                             # peaked logits: a flat target would test nothing
        for w in draft.net.parameters():                       # a draft close to the target: deep acceptance
            w.add_(0.3 * w.std() * torch.randn(w.shape, generator=g))
        draft.net.norm.copy_(target.net.norm)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    n = 800
    out = generate(target, [prompt] * n, drafter=DraftModel(draft), tree="dyn:2,2,3", max_new_tokens=3,
                   temperature=1.0, seed=5)
    assert sum(g.stats.accepted for g in out) > 0.5 * n                                   # trees were accepted
    counts = torch.bincount(torch.tensor([g.tokens[2] for g in out]), minlength=16).double()
    probs = _third_token_marginal(target, prompt, 1.0)
    assert chi2_pvalue(counts, probs) > 1e-3
    wrong = torch.multinomial(_third_token_marginal(draft, prompt, 1.0), n, replacement=True, generator=g)
    assert chi2_pvalue(torch.bincount(wrong, minlength=16).double(), probs) < 1e-3


@pytest.mark.parametrize("spec, error, match", [
    ("dyn:4,2", ValueError, "three integers"),
    ("dyn:4,x,8", ValueError, "three integers"),
    ("dyn:0,2,8", ValueError, "depth must be >= 1"),
    ("dyn:3,0,8", ValueError, "top_k must be >= 1"),
    ("dyn:8,4,16", ValueError, r"has 116 nodes .*at most 63"),
    ("dyn4,2,8", TypeError, "dyn:DEPTH,TOP_K,NODES"),
])
def test_bad_dynamic_specs_are_refused_naming_the_problem(target, spec, error, match):
    with pytest.raises(error, match=match):
        generate(target, PROMPTS[0], drafter=draft_model(), tree=spec)


def test_bad_dynamic_values_and_flags_are_refused(target):
    with pytest.raises(TypeError, match="top_k must be an integer"):
        DynamicTree(3, 2.0, 4)
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        DynamicTree(3, 2, -1)
    with pytest.raises(ValueError, match="--tree: .*three integers"):
        parse_tree_flag("dyn:3,2", head=False, has_drafter=True)
    with pytest.raises(ValueError, match="prompt lookup .* does not draft dynamic trees"):
        parse_tree_flag("dyn:3,2,4", head=False, has_drafter=True, lookup=True)
    with pytest.raises(ValueError, match="feature head"):
        parse_tree_flag("dyn:3,2,4", head=True, has_drafter=True)
    with pytest.raises(ValueError, match="top_k 200 exceeds the vocabulary"):
        generate(target, PROMPTS[0], drafter=draft_model(), tree="dyn:2,200,4", max_new_tokens=4)


@pytest.mark.parametrize("make", [lambda refs: PromptLookup(), lambda refs: OracleDraft(refs, 0.6)],
                         ids=["prompt-lookup", "oracle"])
def test_drafters_that_cannot_rank_nodes_refuse_dynamic_trees_by_name(target, references, make):
    drafter = make(references)
    with pytest.raises(TreeDraftUnsupported, match=f"{type(drafter).__name__} does not draft dynamic trees"):
        SpeculativeDecoder(target, drafter, tree="dyn:3,2,4")


@pytest.mark.skipif(not torch.cuda.is_available() or __import__("os").environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA GPU (bf16 batch-invariant kernels, CUDA graphs)")
@pytest.mark.parametrize("spec", ["dyn:4,2,8", "dyn:3,4,6"])
def test_gpu_bf16_greedy_dynamic_tree_equals_plain_decoding_and_warm_up_captures_all(spec):
    """bf16 on the GPU: the draft passes of device-built paths (``Model.append_tree_paths``) keep greedy output
    token-identical to plain decoding, and the warm-up captured every graph the rounds replay."""
    cfg = CFG.replace(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=2,
                      head_dim=64)
    target = load_model(cfg, device="cuda", dtype=torch.bfloat16, seed=3)
    prompts = [p * 3 for p in PROMPTS]
    refs = [g.tokens for g in generate(target, prompts, drafter=None, max_new_tokens=40)]
    drafter = DraftModel(load_model(cfg.replace(num_layers=1), device="cuda", dtype=torch.bfloat16, seed=3))
    decoder = SpeculativeDecoder(target, drafter, tree=spec)
    counts: list[int] = []
    decoder._debug_round_hook = lambda dec, running: counts.append(len(target._graphs) + len(drafter.model._graphs))
    before = target.graph_captures + drafter.model.graph_captures
    out = decoder.generate(prompts, max_new_tokens=40)
    assert [g.tokens for g in out] == refs
    assert len(set(counts)) == 1, f"graphs captured during the run: {counts}"
    assert target.graph_captures + drafter.model.graph_captures - before == decoder.last_stats.graphs_captured


def test_device_paths_pass_equals_the_host_parents_pass():
    """``Model.append_tree_paths`` (layout on the device) gives ``append_tree``'s logits and lengths for the same tree,
    eagerly and on the graph code path (forced on, run eagerly on the CPU) where 4 tokens run in the 5-token bucket
    with a padding node (no graph of width 4 was captured)."""
    model = load_model(CFG, device="cpu", dtype=torch.float32, seed=1)
    parents = [(-1, 0, 0, 1, 2, 2, 3), (-1, 0, 0, 2, 2, 1, 1)]    # two rows, two shapes; root + 2 in the cache first
    outs = []
    for graphs, use_paths in [(False, False), (False, True), (True, False), (True, True)]:
        model.use_graphs = graphs
        model.setup_cache(2, 32)
        model.keep([])                                             # an empty batch (the cache object is reused)
        model.admit([PROMPTS[0], PROMPTS[2]])
        model.append_tree(torch.tensor([[4, 5, 6], [7, 8, 9]]), [p[:3] for p in parents])
        new = torch.tensor([[10, 11, 12, 13], [14, 15, 16, 17]])
        if use_paths:
            layout = tree_layout(tuple(parents), 4)
            outs.append(model.append_tree_paths(new, layout.depth, layout.path, 7))
        else:
            outs.append(model.append_tree(new, parents))
        assert model.lengths.tolist() == [len(PROMPTS[0]) + 7, len(PROMPTS[2]) + 7]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=0, atol=1e-5)


def test_steady_dynamic_rounds_capture_nothing_run_exact_widths_and_read_twice(monkeypatch):
    """With the CUDA-graph code path forced on (run eagerly on the CPU, as test_tree_steady.py): after
    ``Scheduler.warm_up`` a dynamic tree's rounds capture no graph, run no pass outside a graph program, run every
    tree pass at its exact width (the target's 1 + 22 tokens; the draft's 2, 4 and 8: dyn:4,2,8's counts) and read
    the device twice per round: the outcome, and the draft's parents (its one read, after the last depth)."""
    from test_tree_steady import CFG as SMALL, _Watch

    from verispec.engine import Request, Scheduler, SchedulerConfig

    target = load_model(SMALL, device="cpu", dtype=torch.float32, seed=0)
    draft = load_model(SMALL.replace(num_layers=1), device="cpu", dtype=torch.float32, seed=1)
    target.use_graphs = draft.use_graphs = True
    shape, B, new = DynamicTree(4, 2, 8), 3, 40
    drafter = DraftModel(draft)
    drafter.attach(target)
    sched = Scheduler(target, drafter, SchedulerConfig(B, 9 + new + shape.num_nodes + 1, 4, tree="dyn:4,2,8"),
                      verify_backend="torch")
    sched.warm_up(prompt_tokens=9)
    gen = torch.Generator().manual_seed(0)
    for i in range(B):
        sched.submit(Request(torch.randint(0, SMALL.vocab_size, (9,), generator=gen).tolist(), new, id=i))
    sched.step()                                 # admission, the draft's lazy prefill, the first round
    watch = _Watch(monkeypatch, [target, draft])
    rounds = 3
    for _ in range(rounds):
        sched._round()
    monkeypatch.undo()
    assert all(s.finish_reason is None for s in sched.running)
    assert watch.captured() == 0 and watch.eager == 0
    sites = {site: n for site, n in watch.sites.items() if not site[0].startswith("verify/")}
    assert sites == {("engine/round.py", "read_outcome", "cpu"): rounds,
                     ("engine/round.py", "read_outcome", "tolist"): rounds,
                     ("drafters/draft_model.py", "_dynamic_passes", "tolist"): rounds}
    assert watch.widths == {1 + shape.num_nodes: rounds, 2: rounds, 4: rounds, 8: rounds}


def test_benchmark_dynamic_configs_are_exact_capture_nothing_and_are_marked_cost_only():
    """``benchmarks/trees.py e2e --configs dyn-3-2-3,dm-2-1``: drafted by the draft model (the oracle drafts no
    dynamic tree), exact, nothing captured in the timed call, their rows marked cost-only."""
    from benchmarks import trees
    from benchmarks.common import environment
    from test_tree_steady import CFG as SMALL

    configs = trees.parse_configs("dyn-3-2-3,dm-2-1")
    assert [c[0] for c in configs] == ["dyn:3,2,3 (draft model)", "tree [2, 1] (draft model)"]
    with pytest.raises(ValueError, match="'dyn-3-2' is none of"):
        trees.parse_configs("dyn-3-2")
    target = load_model(SMALL, device="cpu", dtype=torch.float32, seed=0)
    draft = load_model(SMALL.replace(num_layers=1), device="cpu", dtype=torch.float32, seed=1)
    target.use_graphs = draft.use_graphs = True
    cells = trees.e2e_cells(target, draft, (2,), prompt_tokens=12, new_tokens=12, configs=configs)
    assert [c["captured"] for c in cells] == [0, 0] and all(c["exact"] and c["cost_only"] for c in cells)
    lines = trees.e2e_markdown(dict(env=environment(), model="tiny", draft="tiny", rates=trees.TREE_RATES, cells=cells))
    assert any(line.startswith("\\* cost only") for line in lines)


def test_serve_takes_a_dynamic_tree_and_refuses_it_for_prompt_lookup(target, references, capsys, monkeypatch):
    """``verispec serve --tree dyn:3,2,4``: the server's scheduler drafts dynamic trees (3 requests through 2 rows,
    each output plain decoding's) and names the shape in its log; with --draft-lookup the flag is refused."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    import fake_server
    from fakes import FakeTokenizer

    from verispec.engine import Request
    from verispec.serve import server

    monkeypatch.setattr(target, "tokenizer", FakeTokenizer(CFG.vocab_size), raising=False)   # the app needs one
    args = fake_server.serve_args(["--draft-self", "2", "--tree", "dyn:3,2,4", "--max-batch-size", "2",
                                   "--max-seq-len", "64"])
    assert args.tree == DynamicTree(3, 2, 4)
    drafter = draft_model()
    drafter.attach(target)
    engine, _ = server.assemble(target, drafter, args)
    sched = engine.scheduler
    sched.eos = set()                                   # the references ran without a tokenizer: no EOS
    seqs = [sched.submit(Request(p, N_NEW, id=i)) for i, p in enumerate(PROMPTS)]
    sched.run()
    assert [s.generated for s in seqs] == references
    assert "tree=dyn:3,2,4" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fake_server.serve_args(["--draft-lookup", "--tree", "dyn:3,2,4"])
    assert "prompt lookup (--draft-lookup) does not draft dynamic trees" in capsys.readouterr().err
