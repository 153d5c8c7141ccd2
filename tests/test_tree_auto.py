"""``tree="auto"``: each round plain decoding, a chain k or one tree shape, by expected tokens per second
(``AutoK.decide``, engine/auto_k.py "Trees"). The choice on synthetic cost tables (wide passes free at B = 1: a
tree; dear at a large batch: a chain or plain), the evidence a tree round leaves (its widths' coverage, not the
chain's acceptance), greedy output equal to plain decoding while the shape changes between rounds, seeded sampling
reproducible (sampled batches keep per-row chains), warm-up covering every candidate shape, and the errors."""
from __future__ import annotations

import collections
import json

import pytest
import torch

from verispec.drafters import DraftModel, OracleDraft, PromptLookup
from verispec.engine import Request, Scheduler, SchedulerConfig, Sequence, SpeculativeDecoder, Stats, generate
from verispec.engine.auto_k import AUTO_TREES, AutoK, CostTable, RowState
from verispec.engine.guards import parse_tree_flag
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=97, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                  intermediate_size=48)
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6], [7, 8, 9, 10, 11, 7, 8, 9, 12, 3, 1]]   # ragged
N_NEW = 24
# a draft whose top-w covers the target's token with these rates at every depth (OracleDraft's tree_rates)
RATES = {1: 0.6, 2: 0.75, 3: 0.82, 4: 0.87}
BATCHES = (1, 2, 4, 8)


def flat_table() -> CostTable:
    """Wide passes cost what a 1-token pass costs (a weight-bound pass: an H100 at B = 1), draft steps little."""
    return CostTable(BATCHES, (1, 2, 64), ((1.0, 1.0, 1.0),) * len(BATCHES), (0.05,) * len(BATCHES))


def mild_table() -> CostTable:
    """A 64-token pass costs 1.6 one-token passes: which shape wins turns on the acceptance evidence, so an oracle
    or a draft model's rounds move between chains and trees as it comes in."""
    return CostTable(BATCHES, (1, 2, 64), ((1.0, 1.0, 1.6),) * len(BATCHES), (0.05,) * len(BATCHES))


def dear_table() -> CostTable:
    """The pass grows with the tokens per row, the faster the larger the batch (compute-bound at B = 8)."""
    return CostTable(BATCHES, (1, 2, 64), tuple((1.0, 1.0 + 0.2 * b, 1.0 + 12.6 * b) for b in BATCHES),
                     (0.05,) * len(BATCHES))


def seasoned(rates=RATES, rounds: float = 200.0, depth: int = 8) -> RowState:
    """A row whose evidence says: the draft's top-w covers the target's token with probability rates[w] at every
    depth (``rounds`` tested rounds of each width)."""
    return RowState(accepted=[rates[1] * rounds] * depth, tested=[rounds] * depth,
                    wide_accepted={w: [r * rounds] * depth for w, r in rates.items() if w > 1},
                    wide_tested={w: [rounds] * depth for w in rates if w > 1})


def sequences(n: int, *, temperature: float = 0.0, state=seasoned) -> list[Sequence]:
    out = []
    for i in range(n):
        seq = Sequence(Request([1, 2], 100, temperature=temperature, seed=i, id=i), Stats())
        seq.k_state = state()
        out.append(seq)
    return out


def test_auto_picks_a_tree_where_wide_passes_are_free():
    ks, tree = AutoK(flat_table(), trees=AUTO_TREES).decide(sequences(1), 8)
    assert tree in AUTO_TREES
    assert ks == [len(tree)]


@pytest.mark.parametrize("batch", [8, 4])
def test_auto_picks_a_chain_or_plain_where_wide_passes_are_dear(batch):
    ks, tree = AutoK(dear_table(), trees=AUTO_TREES).decide(sequences(batch), 8)
    assert tree is None
    assert len(set(ks)) == 1 and ks[0] <= 2


def test_the_same_policy_picks_a_tree_at_batch_1_and_a_chain_at_batch_8_on_one_table():
    """One table shaped like the H100's (benchmarks/results/trees.md): flat in the tokens at B = 1, steep at B = 8."""
    table = CostTable(BATCHES, (1, 2, 64), ((1.0, 1.0, 1.1), (1.0, 1.0, 1.5), (1.0, 1.05, 3.0), (1.0, 1.3, 20.0)),
                      (0.05,) * len(BATCHES))
    assert AutoK(table, trees=AUTO_TREES).decide(sequences(1), 8)[1] in AUTO_TREES
    assert AutoK(table, trees=AUTO_TREES).decide(sequences(8), 8)[1] is None


def test_a_batch_with_a_sampled_row_gets_chains_and_trees_off_without_candidates():
    """A sampled row's tokens depend on the shape its round drafts, which must not depend on its neighbours."""
    mixed = sequences(1) + sequences(1, temperature=0.8)
    assert AutoK(flat_table(), trees=AUTO_TREES).decide(mixed, 8)[1] is None
    assert AutoK(flat_table()).decide(sequences(1), 8)[1] is None           # trees=(): k=auto's chains


def test_a_tree_round_is_evidence_on_its_widths_and_not_on_the_chain():
    """[2, 2, 1] accepting 2 nodes: depths 0 and 1 covered by 2 children, depth 2 (width 1) tested and rejected.
    The chain's positions 0 and 1 get nothing (a success with 2 children says nothing about the first one alone)."""
    policy = AutoK(flat_table(), trees=AUTO_TREES, decay=1.0)
    seq = sequences(1, state=RowState)[0]
    policy.state(seq)
    seq.stats.add_round(3, 2)
    policy.observe_tree([seq], (2, 2, 1), [3], [2])
    st = seq.k_state
    assert st.wide_tested[2] == [1.0, 1.0] and st.wide_accepted[2] == [1.0, 1.0]
    assert st.tested == [0.0, 0.0, 1.0] and st.accepted == [0.0, 0.0, 0.0]
    assert policy.state(seq) is st and st.tested == [0.0, 0.0, 1.0]         # the next observe does not re-read it
    seq.stats.add_round(2, 2)                                               # then a chain round of k = 2, all taken
    assert policy.state(seq).tested == [1.0, 1.0, 1.0] and st.accepted == [1.0, 1.0, 0.0]
    # coverage: width 2's evidence over its prior, never below the chain's estimate
    alpha = st.alphas(1, policy.prior_alpha, policy.prior_strength)[0]
    assert st.coverage(0, 2, alpha, policy.prior_strength) >= alpha
    assert st.coverage(0, 1, alpha, policy.prior_strength) == alpha


def test_tree_rounds_alone_move_the_chain_estimate_through_the_coverage_law():
    """A row that ran only [2, 1] trees, whose two children covered depth 0 in 5 rounds of 20: its chain estimate
    there leaves the prior (0.9) for the pooled miss rate (15 misses over 20 tests weighted by 2^-x), and width 2's
    coverage follows its rounds, not a clamp at the prior."""
    from verispec.engine.auto_k import COVERAGE_EXPONENT
    policy = AutoK(flat_table(), trees=AUTO_TREES, decay=1.0)
    st = RowState(wide_accepted={2: [5.0]}, wide_tested={2: [20.0]})
    alpha = st.alphas(1, policy.prior_alpha, policy.prior_strength)[0]
    s = policy.prior_strength
    misses = 15.0 + (1 - policy.prior_alpha) * s
    assert alpha == pytest.approx(max(0.0, 1 - misses / (s + 20.0 * 2 ** -COVERAGE_EXPONENT)))
    assert alpha < 0.3
    assert st.coverage(0, 2, alpha, s) == pytest.approx(max(alpha, (5.0 + s * (1 - (1 - alpha) * 2 ** -0.4)) / 20.5))
    assert st.coverage(0, 2, alpha, s) < 0.3
    # no tree evidence at a depth: the chain's own estimate, as before
    assert st.alphas(2, policy.prior_alpha, s)[1] == pytest.approx(policy.prior_alpha)


def _simulated_rate(rates: dict, table: CostTable, seed: int, rounds: int = 300) -> float:
    """tree="auto" at B = 1 against a synthetic draft whose top-w covers the target's token with rates[w] at every
    depth: emitted tokens per second of the table's rounds (``benchmarks/auto_sim.run_policy``)."""
    from benchmarks.auto_sim import run_policy

    policy = AutoK(table, trees=AUTO_TREES)
    return run_policy(policy, rates, 1, 8, rounds, seed, lambda shape: policy.table_round(1, shape))["tok_s"]


def _best_fixed_rate(rates: dict, table: CostTable) -> float:
    from benchmarks.auto_sim import expected_tokens

    policy = AutoK(table, trees=AUTO_TREES)
    return max(expected_tokens(shape, rates) / policy.table_round(1, shape)
               for shape in list(range(9)) + list(AUTO_TREES))


@pytest.mark.parametrize("table", [flat_table, mild_table])
def test_auto_comes_within_a_few_percent_of_the_best_fixed_shape(table):
    """A draft whose coverage follows the prior's law (alpha 0.45): tree="auto" learns it from its own rounds and
    emits >= 0.96x the tokens per second of the best fixed shape in hindsight (a row that kept the prior's alpha at
    depths only trees had tested chose trees too wide: 0.93x on the flat table)."""
    from verispec.engine.auto_k import COVERAGE_EXPONENT
    rates = {w: 1 - 0.55 * w ** -COVERAGE_EXPONENT for w in (1, 2, 3, 4)}
    auto = sum(_simulated_rate(rates, table(), seed) for seed in range(4)) / 4
    assert auto >= 0.96 * _best_fixed_rate(rates, table())


def test_measured_tree_rounds_price_the_tree():
    """A tree round measured ten times slower than the table says is priced so: the policy leaves the tree."""
    policy = AutoK(flat_table(), trees=((2, 2, 1),))
    assert policy.decide(sequences(1), 4)[1] == (2, 2, 1)
    for _ in range(5):
        policy.observe_round(1, (2, 2, 1), 12.0)
    assert policy.decide(sequences(1), 4)[1] is None


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def target():
    return load_model(CFG, device="cpu", dtype=torch.float32, seed=0)


@pytest.fixture(scope="module")
def references(target):
    return [g.tokens for g in generate(target, PROMPTS, drafter=None, max_new_tokens=N_NEW)]


@pytest.fixture
def shapes(monkeypatch):
    """The shape of every round AutoK.decide chose: a tree's widths, or a chain's widest k."""
    seen: list = []
    decide = AutoK.decide

    def recorded(self, running, k_max):
        ks, tree = decide(self, running, k_max)
        seen.append(tree if tree is not None else max(ks))
        return ks, tree

    monkeypatch.setattr(AutoK, "decide", recorded)
    return seen


DRAFTERS = {
    "oracle": lambda refs: OracleDraft(refs, RATES[1], seed=1, tree_rates=RATES),
    "draft-model": lambda refs: DraftModel(load_model(CFG.replace(num_layers=1), device="cpu", dtype=torch.float32,
                                                      seed=5)),
    "prompt-lookup": lambda refs: PromptLookup(max_ngram=3, min_ngram=1),
}


@pytest.mark.parametrize("name", DRAFTERS)
def test_greedy_auto_equals_plain_decoding_while_the_shape_changes(target, references, shapes, name, monkeypatch):
    # the choices from the table and the acceptance alone: measured round times (this machine's load) would make
    # which shapes run, not the output, depend on the moment
    monkeypatch.setattr(AutoK, "observe_round", lambda self, *a, **kw: None)
    out = generate(target, PROMPTS, drafter=DRAFTERS[name](references), k=4, tree="auto", costs=mild_table(),
                   max_new_tokens=N_NEW)
    assert [g.tokens for g in out] == references
    if name != "prompt-lookup":             # a lookup's trie depends on the text: it may settle on trees alone
        assert any(isinstance(s, tuple) for s in shapes) and any(not isinstance(s, tuple) for s in shapes), shapes


def test_greedy_auto_on_a_dear_table_runs_no_tree_and_stays_exact(target, references, shapes, monkeypatch):
    monkeypatch.setattr(AutoK, "observe_round", lambda self, *a, **kw: None)     # the table's prices alone
    out = generate(target, PROMPTS, drafter=DRAFTERS["oracle"](references), k=4, tree="auto", costs=dear_table(),
                   max_new_tokens=N_NEW)
    assert [g.tokens for g in out] == references
    assert shapes and not any(isinstance(s, tuple) for s in shapes)


def test_seeded_sampling_with_auto_is_reproducible_and_batch_independent(target, references, shapes):
    kw = dict(k=4, tree="auto", costs=flat_table(), max_new_tokens=16, temperature=0.9, top_p=0.95)
    make = DRAFTERS["draft-model"]
    batch = generate(target, PROMPTS, drafter=make(references), seed=11, **kw)
    again = generate(target, PROMPTS, drafter=make(references), seed=11, **kw)
    assert [g.tokens for g in batch] == [g.tokens for g in again]
    alone = generate(target, PROMPTS[2], drafter=make(references), seed=13, **kw)        # row 2: seed + 2
    assert alone.tokens == batch[2].tokens
    assert not any(isinstance(s, tuple) for s in shapes)       # sampled rows: each its own chain k


class _Cycle(AutoK):
    """Every shape in turn: plain, each chain k, each tree (warm-up must have covered them all)."""

    def decide(self, running, k_max):
        shapes = [0] + list(range(1, k_max + 1)) + list(self.trees)
        shape = shapes[self._turn % len(shapes)]
        self._turn += 1
        if isinstance(shape, tuple):
            return [len(shape)] * len(running), shape
        return [shape] * len(running), None


@pytest.mark.parametrize("B", [1, 3])
def test_warm_up_captures_every_candidate_shape(B):
    """With the graph path on (run eagerly on the CPU, on the same keys) a round of any chain k or any candidate
    tree after ``warm_up`` adds no graph: on a GPU none would be captured inside a request."""
    target = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    draft = load_model(CFG.replace(num_layers=1), device="cpu", dtype=torch.float32, seed=1)
    target.use_graphs = draft.use_graphs = True
    policy = _Cycle(flat_table(), trees=AUTO_TREES)
    policy._turn = 0
    k = 3
    sched = Scheduler(target, DraftModel(draft), SchedulerConfig(B, 9 + 40 + 45, k, tree="auto"), k_policy=policy)
    sched.warm_up(prompt_tokens=9)
    for i in range(B):
        sched.submit(Request(list(range(1 + i, 10 + i)), 40, id=i))
    sched.step()                                        # admission and a first round
    captured = target.graph_captures + draft.graph_captures
    for _ in range(k + 1 + len(AUTO_TREES)):
        sched._round()
    assert all(s.finish_reason is None for s in sched.running)
    assert target.graph_captures + draft.graph_captures == captured


# ------------------------------------------------------------------------------------------------ errors
def test_the_flag_parser_accepts_auto_and_names_bad_values():
    assert parse_tree_flag("auto", head=False, has_drafter=True) == "auto"
    assert parse_tree_flag("AUTO", head=False, has_drafter=True) == "auto"
    with pytest.raises(ValueError, match="or auto"):
        parse_tree_flag("auto,2", head=False, has_drafter=True)
    with pytest.raises(ValueError, match="needs a drafter"):
        parse_tree_flag("auto", head=False, has_drafter=False)
    assert parse_tree_flag("2,2,1", head=True, has_drafter=False) == [2, 2, 1]   # the feature head drafts trees


def test_bad_auto_settings_are_refused_naming_the_problem(target):
    with pytest.raises(TypeError, match='"auto"'):
        generate(target, PROMPTS[0], drafter=PromptLookup(), tree="automatic")
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(target, PROMPTS[0], drafter=None, tree="auto")
    with pytest.raises(TypeError, match="costs must be a CostTable"):
        SpeculativeDecoder(target, PromptLookup(), tree="auto", costs={"B": 1})
    with pytest.raises(ValueError, match="needs a k_policy that chooses trees"):
        Scheduler(target, PromptLookup(), SchedulerConfig(1, 64, 4, tree="auto"))
    with pytest.raises(ValueError, match="trees must be non-empty widths"):
        AutoK(flat_table(), trees=((2, 0),))


def test_measured_costs_include_each_candidate_trees_pass(target):
    """``measure_costs(..., trees=)`` times each candidate's pass at its own width (nodes + 1 tokens per row); the
    overhead of those widths is the widest chain round's (no chain round of 45 drafts is forced)."""
    from verispec.engine.auto_k import measure_costs

    table = measure_costs(target, PromptLookup(), 2, (1, 2), reps=1, trees=((2, 1), (2, 2, 1)))
    assert table.tokens == (1, 2, 3, 5, 11)
    assert all(row[3] == row[2] == row[4] for row in table.overhead_s)
    # and a whole round of each tree, timed: what AutoK prices the tree by
    assert [[w for w, _ in row] for row in table.tree_round_s] == [[(2, 1), (2, 2, 1)]] * 2
    policy = AutoK(table, trees=((2, 1), (2, 2, 1)))
    for batch, row in zip((1, 2), table.tree_round_s):
        for widths, seconds in row:
            assert seconds > 0 and policy.table_round(batch, widths) == seconds
    assert CostTable.from_json(table.to_json()) == table
    assert measure_costs(target, None, 2, (1,), reps=1, trees=((2, 1),)).tree_round_s is None      # no drafter


def test_a_cost_tables_timed_tree_rounds_are_checked_and_priced_by_bucket():
    """``CostTable.tree_round_s``: one row per batch size of (widths, seconds > 0) pairs, looked up at the batch's
    bucket; a tree it did not time is priced from its parts; a table saved without the column loads without it."""
    parts = flat_table()
    timed = CostTable(parts.batch_sizes, parts.tokens, parts.target_s, parts.draft_s,
                      tree_round_s=(((((2, 1)), 3.0),), (((2, 1), 4.0),), (), ()))
    assert timed.tree_round(1, (2, 1)) == 3.0 and timed.tree_round(2, (2, 1)) == 4.0
    assert timed.tree_round(3, (2, 1)) is None and timed.tree_round(1, (2, 2, 1)) is None     # bucket 4: none
    assert AutoK(timed, trees=((2, 1), (2, 2, 1))).table_round(1, (2, 2, 1)) == \
        AutoK(parts, trees=((2, 2, 1),)).table_round(1, (2, 2, 1))
    assert CostTable.from_json(timed.to_json()) == timed
    old = json.loads(timed.to_json())
    del old["tree_round_s"]
    assert CostTable.from_json(json.dumps(old)).tree_round_s is None
    for bad in ((((2, 1), 3.0),), ((((2, 0), 3.0),),) * 4, ((((2, 1), 0.0),),) * 4,
                ((((2, 1), float("nan")),),) * 4):
        with pytest.raises(ValueError, match="tree_round_s must be"):
            CostTable(parts.batch_sizes, parts.tokens, parts.target_s, parts.draft_s, tree_round_s=bad)


def test_serve_tree_auto_assembles_a_tree_choosing_scheduler_and_stays_exact(target, references, shapes, tmp_path,
                                                                             capsys, monkeypatch):
    """``verispec serve --tree auto`` (with its default -k auto): the server's scheduler chooses among the trees and
    the chains of up to --k-max, and its greedy output is plain decoding's; -k N with --tree auto is refused."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    import fake_server
    from fakes import FakeTokenizer
    from verispec.serve import server

    monkeypatch.setattr(target, "tokenizer", FakeTokenizer(CFG.vocab_size), raising=False)   # the app needs one

    table = tmp_path / "costs.json"
    table.write_text(flat_table().to_json())
    args = fake_server.serve_args(["--draft-lookup", "--tree", "auto", "--k-max", "4", "--cost-table", str(table),
                                   "--max-batch-size", "2", "--max-seq-len", "128"])
    drafter = PromptLookup(max_ngram=3, min_ngram=1)
    drafter.attach(target)
    engine, _ = server.assemble(target, drafter, args)
    sched = engine.scheduler
    sched.eos = set()                                   # the references ran without a tokenizer: no EOS
    assert sched.tree_auto and sched.k_policy.trees == AUTO_TREES and sched.k_max == 4
    seqs = [sched.submit(Request(p, N_NEW, id=i)) for i, p in enumerate(PROMPTS)]     # 3 requests, 2 rows
    sched.run()
    assert [s.generated for s in seqs] == references
    assert any(isinstance(s, tuple) for s in shapes)
    server._log_k_auto(sched.k_policy)                  # the stop log names tree rounds by their widths
    err = capsys.readouterr().err
    assert "tree=[" in err and "k=auto greedy probes:" in err
    with pytest.raises(SystemExit):
        fake_server.serve_args(["--draft-lookup", "--tree", "auto", "-k", "3"])
    assert "leave -k at auto" in capsys.readouterr().err


def test_benchmark_auto_config_is_exact_captures_nothing_and_reports_its_shapes():
    """``benchmarks/trees.py e2e --configs auto,...``: the auto cell's timed call (its cost table measured in the
    warm-up call) captures nothing, equals plain decoding and reports the rounds of each shape it ran."""
    from benchmarks import trees

    names = [c[0] for c in trees.parse_configs("auto,plain,k2,2-2-1")]
    assert names == ["auto", "plain", "chain k=2", "tree [2, 2, 1]"]
    with pytest.raises(ValueError, match="'k0' is none of"):
        trees.parse_configs("auto,k0")
    with pytest.raises(ValueError, match="'auto\\+2-0' is none of"):
        trees.parse_configs("auto+2-0")
    assert trees.parse_configs("auto-start+2-2+4-2")[0][3] == trees.AutoRun(False, ((2, 2), (4, 2)))
    target = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    draft = load_model(CFG.replace(num_layers=1), device="cpu", dtype=torch.float32, seed=1)
    target.use_graphs = draft.use_graphs = True
    cells = trees.e2e_cells(target, draft, (1, 3), prompt_tokens=16, new_tokens=20,
                            configs=trees.parse_configs("auto,k2"))
    auto = [c for c in cells if c["config"] == "auto"]
    assert len(auto) == 2 and all(c["captured"] == 0 and c["exact"] and c["shapes"] for c in auto)
    assert sum(auto[0]["shapes"].values()) == auto[0]["rounds"]
    assert all(CostTable.from_json(json.dumps(c["cost_table"])).batch_sizes for c in auto)   # auto_sim --prior table
    # its measured rounds by shape: counts within the rounds, positive measured and table costs
    assert all(0 < n <= auto[0]["rounds"] and m > 0 and t > 0 for n, m, t in auto[0]["round_ms"].values())
    from benchmarks.common import environment

    lines = trees.e2e_markdown(dict(env=environment(), model="tiny", draft="tiny", rates=trees.TREE_RATES, cells=cells))
    assert any(line.startswith("auto: ") and "rounds by shape" in line for line in lines)
    assert any(line.startswith("auto's measured rounds by shape") for line in lines)


def test_benchmark_repeats_interleave_the_configs_and_report_medians_and_pairs():
    """``benchmarks/trees.py e2e --repeats 3``: each config timed three times, in turn; a cell's tok/s is the median
    of its calls (each kept, repeat order), every call exact and capturing nothing; the page shows the range and the
    best tree and each auto (``auto-start``: decided at each round's start) over the best chain repeat by repeat."""
    import statistics

    from benchmarks import trees
    from benchmarks.common import environment

    target = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    draft = load_model(CFG.replace(num_layers=1), device="cpu", dtype=torch.float32, seed=1)
    target.use_graphs = draft.use_graphs = True
    from verispec.engine import auto_k

    cells = trees.e2e_cells(target, draft, (2,), prompt_tokens=12, new_tokens=12,
                            configs=trees.parse_configs("auto,auto-start+5-1,k2,2-2"), repeats=3)
    assert [c["config"] for c in cells] == ["auto", "auto +[5, 1] (decided at the round's start)", "chain k=2",
                                            "tree [2, 2]"]
    # restored after the calls of the config that set them
    assert auto_k.PLAN_AHEAD is True and (5, 1) not in auto_k.AUTO_TREES
    assert all(set(c["policy"]) >= {"probes", "debt_scale", "plans_adopted"} for c in cells[:2])
    for c in cells:
        assert len(c["tok_s_runs"]) == 3 and c["tok_s"] == statistics.median(c["tok_s_runs"])
        assert c["captured"] == 0 and c["exact"]
    lines = trees.e2e_markdown(dict(env=environment(), model="tiny", draft="tiny", rates=trees.TREE_RATES, cells=cells))
    assert any("| config | tok/s | range |" in line for line in lines)
    assert any(line.startswith("tree [2, 2] / chain k=2, repeat by repeat: ") for line in lines)
    assert any(line.startswith("auto / chain k=2, repeat by repeat: ") for line in lines)
    assert any(line.startswith("auto +[5, 1] (decided at the round's start) / chain k=2, repeat by repeat: ")
               for line in lines)
    # with the run's floor: a fixed shape's cell gets B x its tokens per round / (target + depth x draft passes' reads)
    floor = dict(bandwidth=4e12, target=3.5, draft=0.6)
    lines = trees.e2e_markdown(dict(env=environment(), model="tiny", draft="tiny", rates=trees.TREE_RATES, cells=cells,
                                    floor_ms=floor))
    assert any("| floor tok/s | % floor |" in line for line in lines)
    k2 = next(c for c in cells if c["config"] == "chain k=2")
    row = next(line for line in lines if line.startswith("| chain k=2 |"))
    assert f"| {2 * k2['tokens_per_round'] / (3.5 + 2 * 0.6) * 1e3:.1f} |" in row
    assert next(line for line in lines if line.startswith("| auto |")).endswith("|  |  |")
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        trees.e2e_cells(target, draft, (2,), 12, 12, trees.parse_configs("k2"), repeats=0)


# ------------------------------------------------------------------------------------------------ planned ahead
@pytest.mark.parametrize("name", ["oracle", "draft-model", "draft-model-loop"])
def test_planned_ahead_rounds_stay_exact_and_account_every_round(target, name, monkeypatch):
    """``plan_ahead``: the next round's shape chosen during this round's pass (``Scheduler._launched_and_plan``),
    adopted at the next round's start. Three requests through two rows (an admission once a row ends by its length,
    no plan while one waits or near a row's end) and a cancellation the plan could not foresee (dropped): greedy
    output equal to plain decoding (the cancelled request's a prefix of it), and ``chosen`` counts every round run
    once: adopted plans plus fresh decisions, the dropped plan uncounted."""
    from verispec.engine import auto_k

    monkeypatch.setattr(AutoK, "observe_round", lambda self, *a, **kw: None)     # the table's prices alone
    monkeypatch.setattr(auto_k, "PLAN_AHEAD", True)
    policy = AutoK(mild_table(), trees=AUTO_TREES)
    decided = []
    decide = policy.decide
    policy.decide = lambda running, k_max: decided.append(len(running)) or decide(running, k_max)
    # the draft model: the target's own weights (a copy), so that rounds draft and plans are made in them
    # and long enough requests that a few plans are adopted at its 5 tokens a round
    new = 64
    references = [g.tokens for g in generate(target, PROMPTS, drafter=None, max_new_tokens=new)]
    drafter = (DraftModel(load_model(CFG, device="cpu", dtype=torch.float32, seed=0)) if name.startswith("draft-model")
               else DRAFTERS[name](references))
    # "-loop": the captured draft loop's logic (the graph cache's eager program on the CPU), which a planned chain's
    # drafts are launched through before the round's outcome is read (``Drafter.prelaunch``)
    if name.startswith("draft-model"):
        drafter.model.use_graphs = name == "draft-model-loop"
    drafter.attach(target)
    sched = Scheduler(target, drafter, SchedulerConfig(2, 128, 4, tree="auto"), k_policy=policy)
    lengths = [new, new - 7, new - 3]
    seqs = [sched.submit(Request(p, n, id=i)) for i, (p, n) in enumerate(zip(PROMPTS, lengths))]
    rounds = []

    def after_round(s):
        rounds.append(1)
        if seqs[2].finish_reason is None and len(seqs[2].generated) >= 20 and s._plan is not None:
            s.cancel(2)                                      # planned for: the plan must be dropped

    sched.round_hook = after_round
    sched.run()
    assert [s.generated for s in seqs[:2]] == [r[:n] for r, n in zip(references[:2], lengths[:2])]
    assert seqs[2].finish_reason == "cancelled" and seqs[2].generated == references[2][:len(seqs[2].generated)]
    assert policy.plan_ahead and policy.plans_adopted > 0 and policy.plans_dropped > 0
    assert sum(policy.chosen.values()) == len(decided) - policy.plans_dropped
    assert sum(policy.chosen.values()) == len(rounds)
    if name == "draft-model-loop":                        # planned chains' drafts were launched a round early
        assert drafter.prelaunches_taken > 0


def test_no_plan_for_a_sampled_row_or_a_row_that_may_end_this_round(target):
    """``AutoK.plan`` plans only where a plan may stand: plan_ahead on, a round that drafts, every row greedy, no row
    near its end."""
    policy = AutoK(mild_table(), trees=AUTO_TREES, plan_ahead=True)
    rows = sequences(2)
    assert policy.plan(rows, 4) is None                       # this round drafts nothing: its debt is not yet known

    def drafting(p: AutoK) -> AutoK:                          # as in a round of 2 drafts
        p.last_k = 2
        return p

    assert drafting(policy).plan(rows, 4) is not None
    assert drafting(AutoK(mild_table(), trees=AUTO_TREES, plan_ahead=False)).plan(rows, 4) is None     # off
    assert drafting(policy).plan(sequences(2, temperature=0.8), 4) is None                 # a sampled row
    near_end = sequences(2)
    near_end[0] = Sequence(Request([1, 2], 4, id=7), Stats())             # this round (2 drafts) may be its last
    assert drafting(policy).plan(near_end, 4) is None
    plan = drafting(policy).plan(rows, 4)
    assert policy.adopt(plan, rows[::-1], 4) is None and policy.plans_dropped == 1          # another batch: dropped
    other = AutoK(mild_table(), trees=AUTO_TREES, plan_ahead=True)
    other.drop(drafting(policy).plan(rows, 4))                   # another policy's plan: nothing of its to uncount
    assert other.chosen == {} and other.plans_dropped == 1
