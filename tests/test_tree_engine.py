"""``generate(..., tree=widths)``: draft trees through the engine (engine/tree_round.py) on a tiny real model (fp32,
CPU): greedy output equals plain decoding for every tree drafter, batched and ragged; seeded sampling is
reproducible and a sequence's tokens do not depend on its batch; bad ``tree=`` values and drafters that cannot
draft trees are refused before any work."""
import pytest
import torch

from verispec.drafters import DraftModel, OracleDraft, PromptLookup, SelfSpeculative, TreeDraftUnsupported
from verispec.drafters.base import Drafter
from verispec.drafters.prompt_lookup import _History, merge_trie
from verispec.engine import SpeculativeDecoder, generate
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=97, num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=96, rope_theta=10000.0)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6], [7, 8, 9, 10, 11, 7, 8, 9, 12, 3, 1]]   # ragged
N_NEW = 24


@pytest.fixture(scope="module")
def target():
    return load_model(CFG, device="cpu", dtype=torch.float32, seed=0)


@pytest.fixture(scope="module")
def references(target):
    return [g.tokens for g in generate(target, PROMPTS, drafter=None, max_new_tokens=N_NEW)]


DRAFTERS = {
    "draft-model": lambda refs: DraftModel(load_model(CFG, device="cpu", dtype=torch.float32, seed=5)),
    "self-speculative": lambda refs: SelfSpeculative(layers=2),
    "prompt-lookup": lambda refs: PromptLookup(max_ngram=3, min_ngram=1),
    "oracle": lambda refs: OracleDraft(refs, acceptance_rate=0.6, seed=1),
}


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("tree", [[2, 2, 1], [3], [1, 1, 1]])
def test_greedy_tree_generation_equals_plain_decoding(target, references, name, tree):
    out = generate(target, PROMPTS, drafter=DRAFTERS[name](references), tree=tree, max_new_tokens=N_NEW)
    assert [g.tokens for g in out] == references
    assert all(g.finish_reason == "length" for g in out)


def test_an_oracle_tree_that_always_holds_the_target_token_emits_depth_plus_one(target, references):
    """Rate 1: the target's token is among every true node's 3 children, so each round of a depth-3 tree accepts 3
    nodes and emits 4 tokens (the 23 tokens after the prefill's take 6 rounds)."""
    out = generate(target, PROMPTS[:1], drafter=OracleDraft(references[:1], 1.0), tree=[3, 3, 1],
                   max_new_tokens=N_NEW)
    assert out[0].tokens == references[0]
    assert out[0].stats.rounds == -(-(N_NEW - 1) // 4)


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup"])
def test_seeded_tree_sampling_is_reproducible_and_batch_independent(target, references, name):
    kw = dict(tree=[2, 2], max_new_tokens=16, temperature=0.9, top_p=0.95)
    batch = generate(target, PROMPTS, drafter=DRAFTERS[name](references), seed=11, **kw)
    again = generate(target, PROMPTS, drafter=DRAFTERS[name](references), seed=11, **kw)
    assert [g.tokens for g in batch] == [g.tokens for g in again]
    alone = generate(target, PROMPTS[2], drafter=DRAFTERS[name](references), seed=13, **kw)   # row 2: seed + 2
    assert alone.tokens == batch[2].tokens


def test_prompt_lookup_merges_continuations_into_a_trie():
    h = _History([1, 2, 3, 1, 2, 4, 1, 2], 1, 2)
    branches = h.branches(2, 3, 2, 1)
    assert branches[:2] == [[4, 1], [3, 1]]
    assert merge_trie([[4, 1], [3, 1], [4, 2]], (2, 1)) == ([4, 1, 3, 1], [-1, 0, -1, 2])
    assert merge_trie([[4, 1], [3, 1], [5, 2]], (2, 2)) == ([4, 1, 3, 1], [-1, 0, -1, 2])   # 5: a third root child


def test_bad_tree_values_are_refused_naming_the_problem(target):
    lookup = PromptLookup()
    with pytest.raises(TypeError, match="list of children per node"):
        generate(target, PROMPTS[0], drafter=lookup, tree="4,2")
    with pytest.raises(TypeError, match="list of children per node"):
        generate(target, PROMPTS[0], drafter=lookup, tree=4)
    with pytest.raises(ValueError, match="at least one depth"):
        generate(target, PROMPTS[0], drafter=lookup, tree=[])
    with pytest.raises(ValueError, match=r"tree\[1\] must be >= 1"):
        generate(target, PROMPTS[0], drafter=lookup, tree=[2, 0])
    with pytest.raises(TypeError, match=r"tree\[0\] must be an integer"):
        generate(target, PROMPTS[0], drafter=lookup, tree=[2.0])
    with pytest.raises(ValueError, match="at most 63"):
        generate(target, PROMPTS[0], drafter=lookup, tree=[4, 4, 4])
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(target, PROMPTS[0], drafter=None, tree=[2])


def test_a_drafter_without_trees_is_refused_by_name(target):
    class ChainOnly(Drafter):
        pass

    with pytest.raises(TreeDraftUnsupported, match="ChainOnly does not draft trees"):
        SpeculativeDecoder(target, ChainOnly(), tree=[2, 1])
    with pytest.raises(TreeDraftUnsupported, match="ChainOnly does not draft trees"):
        ChainOnly().propose_tree((2,))


@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup"])
def test_scheduler_with_trees_admits_and_retires_between_rounds(target, references, name):
    """Continuous batching with trees (what ``verispec serve --tree`` runs): 3 requests through 2 cache rows, the
    third joining when the first ends; every output is plain decoding's."""
    from verispec.engine import Scheduler, SchedulerConfig
    from verispec.engine.request import Request
    from verispec.engine.scheduler import tree_nodes

    drafter = DRAFTERS[name](references)
    drafter.attach(target)
    lengths = [N_NEW - 14, N_NEW, N_NEW]                      # the first ends early: the third takes its row
    need = max(len(p) for p in PROMPTS) + N_NEW + tree_nodes((2, 2)) + 1
    sched = Scheduler(target, drafter, SchedulerConfig(2, need, tree=(2, 2)))
    seqs = [sched.submit(Request(p, n, 0.0, 0, 1.0, 0, (), None, id=i))
            for i, (p, n) in enumerate(zip(PROMPTS, lengths))]
    sched.run()
    assert [s.generated for s in seqs] == [r[:n] for r, n in zip(references, lengths)]


@pytest.mark.skipif(not torch.cuda.is_available() or __import__("os").environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CUDA GPU (bf16 batch-invariant kernels, CUDA graphs)")
@pytest.mark.parametrize("name", ["draft-model", "prompt-lookup", "oracle"])
def test_gpu_bf16_greedy_tree_generation_equals_plain_decoding_and_warm_up_captures_all(name):
    """bf16 on the GPU: the tree pass, the compaction and the batch-invariant kernels keep greedy tree output
    token-identical to plain decoding (random weights: near-ties everywhere, so any rounding difference shows),
    and ``Scheduler.warm_up`` captured every graph the tree rounds replay (none is captured inside the run)."""
    cfg = CFG.replace(vocab_size=32000, hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=2,
                      head_dim=64)
    target = load_model(cfg, device="cuda", dtype=torch.bfloat16, seed=3)
    prompts = [p * 3 for p in PROMPTS]
    refs = [g.tokens for g in generate(target, prompts, drafter=None, max_new_tokens=40)]
    make = {"draft-model": lambda: DraftModel(load_model(cfg.replace(num_layers=1), device="cuda",
                                                         dtype=torch.bfloat16, seed=3)),
            "prompt-lookup": lambda: PromptLookup(3, 1),
            "oracle": lambda: OracleDraft(refs, 0.7, cost_model=load_model(cfg.replace(num_layers=1), device="cuda",
                                                                            dtype=torch.bfloat16, seed=4))}[name]
    drafter = make()
    models = [target] + [m for m in (getattr(drafter, "model", None), getattr(getattr(drafter, "_runner", None),
                                                                             "model", None)) if m is not None]
    decoder = SpeculativeDecoder(target, drafter, tree=[4, 2, 1])
    decoder._debug_round_hook = lambda dec, running: counts.append(len(target._graphs))
    counts: list[int] = []
    before = sum(m.graph_captures for m in models)
    out = decoder.generate(prompts, max_new_tokens=40)
    assert [g.tokens for g in out] == refs
    assert len(set(counts)) == 1, f"graphs captured during the run: {counts}"
    # every graph of the target and the draft model (their prefills too) was captured by the warm-up
    assert sum(m.graph_captures for m in models) - before == decoder.last_stats.graphs_captured


def _third_token_marginal(model, prompt: list[int], temperature: float) -> torch.Tensor:
    """The exact distribution [V] of the 3rd generated token under plain sampling (sum over the first two)."""
    from verispec.verify.sampling import filtered_probs

    V = model.config.vocab_size
    model.setup_cache(1, len(prompt) + 4)
    p0 = filtered_probs(model.prefill([prompt])[0], temperature, 0, 1.0).double()
    out = torch.zeros(V, dtype=torch.float64)
    for a in range(V):
        model.rollback(torch.tensor([len(prompt)]))
        p1 = filtered_probs(model.decode(torch.tensor([[a]]))[0, 0], temperature, 0, 1.0).double()
        for b in range(V):
            model.rollback(torch.tensor([len(prompt) + 1]))
            out += p0[a] * p1[b] * filtered_probs(model.decode(torch.tensor([[b]]))[0, 0], temperature, 0, 1.0).double()
    return out


def test_sampled_tree_generation_keeps_the_target_distribution():
    """The 3rd generated token (drawn inside a [2, 2] tree round: the root's children, their children or the bonus)
    follows the target's exact marginal (chi-square, N = 800 independent rows, fixed seeds); the power check: at
    this N the same test rejects the draft model's own marginal, a distribution 0.06 away at most."""
    from stats import chi2_pvalue

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
    out = generate(target, [prompt] * n, drafter=DraftModel(draft), tree=[2, 2], max_new_tokens=3, temperature=1.0,
                   seed=5)
    assert sum(g.stats.accepted for g in out) > 0.5 * n                                   # trees were accepted
    counts = torch.bincount(torch.tensor([g.tokens[2] for g in out]), minlength=16).double()
    probs = _third_token_marginal(target, prompt, 1.0)
    assert chi2_pvalue(counts, probs) > 1e-3
    wrong = torch.multinomial(_third_token_marginal(draft, prompt, 1.0), n, replacement=True, generator=g)
    assert chi2_pvalue(torch.bincount(wrong, minlength=16).double(), probs) < 1e-3


def test_a_target_without_a_tree_pass_is_refused():
    from fakes import FakeModel

    with pytest.raises(ValueError, match="FakeModel has none"):
        SpeculativeDecoder(FakeModel(), PromptLookup(), tree=[2])
