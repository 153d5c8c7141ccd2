"""``FeatureHead`` drafting trees (``generate(..., tree=widths)``): greedy output equals plain decoding (ragged batches,
the graph path's layout, a head whose drafts are often accepted deep in the tree, the shipped head on the embedded
SmolLM2); a tree of one child per depth drafts exactly the chain's drafts round by round, and the top-1 path of a
wider tree is the chain too (siblings do not see each other); seeded sampling over trees is reproducible and a row's
tokens do not depend on its batch; after ``Scheduler.warm_up`` tree rounds capture no graph.

The tiny target and random heads are test_feature_head.py's.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from test_feature_head import CFG, PROMPTS, random_head, target
from verispec.drafters import FeatureHead
from verispec.engine import Request, Scheduler, SchedulerConfig, generate


def _likely_head(plain: list[list[int]], n: int):
    """A head whose draft vocabulary is the n tokens plain decoding emits most: a tree of n children per node then
    holds the target's token wherever it is one of them, so rounds accept nodes at every depth."""
    common = [t for t, _ in Counter(t for tokens in plain for t in tokens).most_common(n)]
    net = random_head(seed=3, draft_vocab=n)
    net.d2t.copy_(torch.tensor(common))
    return net


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the head's tree passes and the target's "
                         "tree pass as real CUDA graphs (kernels writing the states)")


@pytest.mark.parametrize("device, use_graphs", [("cpu", False), ("cpu", True), pytest.param("cuda", True, marks=GPU)],
                         ids=["eager", "graph-layout", "cuda-graphs"])
def test_greedy_tree_generation_with_the_head_equals_plain_decoding(device, use_graphs):
    model = target(use_graphs, device=device)
    plain = [g.tokens for g in generate(model, PROMPTS, drafter=None, max_new_tokens=20)]
    head = FeatureHead(random_head())
    for tree in ([2, 2, 1], [3], [1, 1, 1]):
        out = generate(model, PROMPTS, drafter=head, tree=tree, max_new_tokens=20)
        assert [g.tokens for g in out] == plain, tree
    out = generate(model, PROMPTS, drafter=FeatureHead(_likely_head(plain, 4)), tree=[4, 4, 2], max_new_tokens=20)
    assert [g.tokens for g in out] == plain
    assert sum(g.stats.accepted for g in out) >= 8          # deep paths accepted: wide commits of the tree's states


def test_tree_auto_with_the_head_equals_plain_decoding():
    """``tree="auto"``: its cost table is measured with the head (whose admission needs the target's prompt states:
    the measurement reserves the head before admitting), then rounds of chains and trees stay exact."""
    model = target()
    plain = [g.tokens for g in generate(model, PROMPTS, drafter=None, max_new_tokens=16)]
    out = generate(model, PROMPTS, drafter=FeatureHead(_likely_head(plain, 4)), tree="auto", k=3, max_new_tokens=16)
    assert [g.tokens for g in out] == plain


def _proposals(head, tree) -> list:
    """Wrap ``head``'s proposals (chain or tree): each round's drafts appended to the returned list, on the host."""
    log = []
    propose, propose_tree = head.propose, head.propose_tree

    def chain(max_num_draft):
        p = propose(max_num_draft)
        log.append(p.draft_tokens.cpu())
        return p

    def trees(widths):
        p = propose_tree(widths)
        log.append(p.draft_tokens.view(len(p.num_nodes), -1).cpu())
        return p
    head.propose, head.propose_tree = chain, trees
    return log


@pytest.mark.parametrize("use_graphs", [False, True], ids=["eager", "graph-layout"])
def test_a_tree_of_one_child_per_depth_drafts_the_chains_drafts(use_graphs):
    """Round by round over a whole ragged batch: widths (1, 1, 1) propose what a chain of k = 3 proposes (the head's
    state after a tree round -- the target states of the accepted path, gathered from the tree pass -- is the chain
    round's), and in a (2, 2, 1) tree the first child's first child's child is the chain's third draft."""
    model = target(use_graphs)
    plain = [g.tokens for g in generate(model, PROMPTS, drafter=None, max_new_tokens=20)]
    runs = {}
    for name, kw in (("chain", dict(k=3)), ("tree", dict(tree=[1, 1, 1]))):
        head = FeatureHead(_likely_head(plain, 6))
        log = _proposals(head, kw.get("tree"))
        out = generate(model, PROMPTS, drafter=head, max_new_tokens=20, **kw)
        assert [g.tokens for g in out] == plain
        runs[name] = log
    assert len(runs["chain"]) == len(runs["tree"])
    for chain, tree in zip(runs["chain"], runs["tree"]):
        assert torch.equal(chain, tree)
    head = FeatureHead(random_head(seed=4))
    log = _proposals(head, None)
    generate(model, PROMPTS, drafter=head, k=3, max_new_tokens=6)
    tree_head = FeatureHead(random_head(seed=4))
    tree_log = _proposals(tree_head, None)
    generate(model, PROMPTS, drafter=tree_head, tree=[2, 2, 1], max_new_tokens=6)
    # the first round (same histories, nothing committed from a tree yet): nodes 0, 2 (node 0's first child) and 6
    assert torch.equal(tree_log[0][:, [0, 2, 6]], log[0])


def test_seeded_tree_sampling_with_the_head_is_reproducible_and_batch_independent():
    model = target()
    with torch.no_grad():   # a peaked target: sampled rounds then accept some of the head's nodes
        model.net.lm_head.mul_(6.0)
    plain = [g.tokens for g in generate(model, PROMPTS, drafter=None, max_new_tokens=16)]
    head = FeatureHead(_likely_head(plain, 4))
    kw = dict(tree=[3, 2, 1], max_new_tokens=16, temperature=0.9, top_p=0.95)
    batch = generate(model, PROMPTS, drafter=head, seed=10, **kw)
    again = generate(model, PROMPTS, drafter=head, seed=10, **kw)
    assert [g.tokens for g in batch] == [g.tokens for g in again]
    assert sum(g.stats.accepted for g in batch) > 0
    for b in range(len(PROMPTS)):
        alone = generate(model, PROMPTS[b], drafter=head, seed=10 + b, **kw)   # row b's own seed, alone
        assert alone.tokens == batch[b].tokens, b


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU)])
@pytest.mark.parametrize("tree", [(3, 2, 2, 1), (2, 2, 1)])
def test_tree_rounds_after_warm_up_capture_nothing(tree, device):
    """The graph path (on the CPU run eagerly, ``GraphCache``'s capture-free path): ``Scheduler.warm_up`` captures
    the head's tree passes of every batch bucket and its commits of 1..depth + 1 tokens; rounds with batches
    shrinking through the buckets (requests of different lengths) capture nothing more, on the head or the target;
    their drafts are those of the head's eager passes, round by round."""
    model = target(use_graphs=True, device=device)
    plain = [g.tokens for g in generate(model, PROMPTS, drafter=None, max_new_tokens=16)]
    head = FeatureHead(_likely_head(plain, 3))
    sched = Scheduler(model, head, SchedulerConfig(max_batch_size=4, max_seq_len=80, k=4, tree=tree))
    sched.warm_up(prompt_tokens=16)
    assert head._graphs.count("tree") == 3                      # buckets 1, 2, 4
    before = (head.graph_captures, model.graph_captures)
    log = _proposals(head, tree)
    seqs = [sched.submit(Request(p, n, id=i)) for i, (p, n) in enumerate(zip(PROMPTS, (16, 5, 10)))]
    sched.run()
    assert (head.graph_captures, model.graph_captures) == before
    assert [s.generated for s in seqs] == [p[:n] for p, n in zip(plain, (16, 5, 10))]
    eager = FeatureHead(_likely_head(plain, 3))
    eager.use_graphs = False
    eager_log = _proposals(eager, tree)
    sched = Scheduler(model, eager, SchedulerConfig(max_batch_size=4, max_seq_len=80, k=4, tree=tree))
    for i, (p, n) in enumerate(zip(PROMPTS, (16, 5, 10))):
        sched.submit(Request(p, n, id=i))
    sched.run()
    assert len(log) == len(eager_log) and all(torch.equal(a, b) for a, b in zip(log, eager_log))


def test_the_shipped_head_drafts_trees_on_the_embedded_model():
    """The embedded SmolLM2 and its shipped head (fp32, CPU): a (2, 2, 1) tree's greedy output is plain decoding's,
    and the trained head's trees are accepted (more than one token a round)."""
    from verispec.runtime import load_model
    from verispec.runtime.loading import embedded_gguf_path

    try:
        embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model = load_model(device="cpu", dtype=torch.float32)
    prompt = "Write two sentences about why the sky is blue."
    plain = generate(model, prompt, max_new_tokens=16, chat=True)
    out = generate(model, prompt, drafter=FeatureHead(), tree=[2, 2, 1], max_new_tokens=16, chat=True)
    assert out.tokens == plain.tokens
    assert out.stats.accepted > 0 and out.stats.rounds < 15
