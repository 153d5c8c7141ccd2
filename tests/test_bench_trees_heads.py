"""``verispec bench trees`` and ``verispec bench heads`` on a tiny random model (CPU, seconds): the sweeps' points,
one measured run of each study (every greedy output equals plain decoding's; nodes per round are the trees'
sizes), the pages and plots, the heads study's skip for a target with no head, and bad --trees / --draft-head
values failing with one line that names the option before any model loads."""
from __future__ import annotations

import json

import matplotlib.image
import pytest

from verispec.bench import BenchOptions, Workbench, check_options, run_studies
from verispec.bench.studies import heads as heads_study
from verispec.bench.studies import trees as trees_study
from verispec.cli import main
from verispec.drafters.head_net import HeadConfig, HeadNet
from verispec.engine.scheduler import tree_nodes
from verispec.runtime import ModelConfig

TINY = ModelConfig(vocab_size=96, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                   intermediate_size=64)
DRAFT_COST = ModelConfig(vocab_size=96, num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                         intermediate_size=64)      # the oracle's trees pay a draft model's tree passes (the GPU setup)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _options(out, studies, draft="oracle", **kw):
    return check_options(BenchOptions(studies=tuple(studies), out=out, model=TINY, draft=draft, quick=True,
                                      device="cpu", command="pytest", **kw))


def _rows(out, study):
    return [json.loads(line) for line in (out / f"{study}.jsonl").read_text().splitlines()]


def _check_plots(out, page):
    images = [line[line.index("(") + 1:-1] for line in page.splitlines() if line.startswith("![")]
    assert images, "no plot linked from the page"
    for name in images:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
        pixels = matplotlib.image.imread(out / name)
        assert pixels.shape[0] >= 400 and pixels.shape[1] >= 700 and pixels.std() > 0.01


@pytest.fixture(scope="module")
def trees_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("trees")
    run_studies(_options(out, ["trees"], trees=((2, 1), (1, 1, 1)), ks=(1, 3), batches=(1, 2), draft_cost=DRAFT_COST))
    return out


def test_trees_points_cover_every_batch_chain_and_shape(tmp_path):
    o = _options(tmp_path, ["trees"], trees=((2, 1), (3, 2, 1)), ks=(2, 4), batches=(1, 8), alphas=(0.6, 0.9))
    pts = trees_study.points(Workbench(o))
    for b in (1, 8):
        assert {"batch": b, "method": "plain"} in pts
        for a in (0.6, 0.9):
            assert [p["k"] for p in pts if p["batch"] == b and p.get("alpha") == a and p["method"] == "chain"] == [2, 4]
            assert [p["tree"] for p in pts if p["batch"] == b and p.get("alpha") == a
                    and p["method"] == "tree"] == [[2, 1], [3, 2, 1]]
            assert {"batch": b, "alpha": a, "method": "tree-auto", "k": 4} in pts
    assert len(pts) == 2 * (1 + 2 * (2 + 2 + 1))
    lookup = trees_study.points(Workbench(_options(tmp_path, ["trees"], draft="lookup", batches=(1,))))
    assert {p.get("alpha") for p in lookup} == {None}          # no nominal alpha without the oracle


def test_oracle_coverage_grows_with_the_width():
    assert trees_study.coverage(0.7, 1) == pytest.approx(0.7)
    rates = [trees_study.coverage(0.7, w) for w in range(1, 9)]
    assert all(a < b < 1 for a, b in zip(rates, rates[1:]))
    assert trees_study.tree_rates(None) is None


def test_trees_rows_are_exact_and_count_the_nodes(trees_dir):
    rows = _rows(trees_dir, "trees")
    live = [r for r in rows if not r.get("skipped")]
    assert {r["point"]["batch"] for r in live} == {1, 2}
    for r in live:
        assert r["exact"], r["point"]                 # greedy: every output is plain decoding's
        assert r["tokens_per_round"] >= 1.0
        m = r["point"]["method"]
        if m == "tree":                               # the oracle proposes the full tree every round
            assert r["nodes_per_round"] == pytest.approx(tree_nodes(r["point"]["tree"]))
        elif m == "chain":
            assert 0 < r["nodes_per_round"] <= r["point"]["k"]
        elif m == "plain":
            assert r["nodes_per_round"] == 0 and r["tokens_per_round"] == pytest.approx(1.0)
    auto = [r for r in rows if r["point"]["method"] == "tree-auto"]
    assert len(auto) == 2
    for r in auto:                                    # tree="auto": its table measured, then exact like every shape
        assert not r.get("skipped") and r["exact"] and r["tokens_per_round"] >= 1.0


def test_trees_page_compares_with_the_best_chain(trees_dir):
    page = (trees_dir / "trees.md").read_text()
    assert page.startswith("# verispec bench: trees")
    rows = [r for r in _rows(trees_dir, "trees") if not r.get("skipped")]
    for b in (1, 2):
        group = [r for r in rows if r["point"]["batch"] == b]
        best = max((r for r in group if r["point"]["method"] == "chain"), key=lambda r: r["tokens_per_s"])
        assert f"Batch {b}, oracle alpha 0.6 (best chain: chain K={best['point']['k']}):" in page
        for r in group:
            if r["point"]["method"] == "tree":
                shape = "tree " + "-".join(map(str, r["point"]["tree"]))
                ratio = f"{r['tokens_per_s'] / best['tokens_per_s']:.2f}"
                assert any(line.startswith(f"| {shape} |") and f"| {ratio} | yes |" in line
                           for line in page.splitlines()), (shape, ratio)
    _check_plots(trees_dir, page)


def test_heads_measures_a_given_head(tmp_path):
    head = HeadNet(HeadConfig.for_target(TINY))
    head.reset_parameters(1)
    head.save(tmp_path / "head")
    out = tmp_path / "out"
    run_studies(_options(out, ["heads"], draft="lookup", draft_head=str(tmp_path / "head"), ks=(2,)))
    rows = _rows(out, "heads")
    assert [r["point"] for r in rows] == [{"batch": 1, "method": "plain"}, {"batch": 1, "method": "lookup", "k": 2},
                                          {"batch": 1, "method": "head", "k": 2}]
    for r in rows:
        assert not r.get("skipped") and r["exact"], r
        assert r["prompts"] == heads_study.QUICK_HEAD_PROMPTS and r["tokens_per_round"] >= 1.0
        assert len(r["alpha_per_position"]) == r["point"].get("k", 0)
        assert r["alpha_per_position"][:1] != [None] or r["point"]["method"] == "plain"   # position 0 is always tested
    page = (out / "heads.md").read_text()
    assert "| feature head | 2 |" in page and "| prompt lookup | 2 |" in page and "| plain decoding | - |" in page
    _check_plots(out, page)


def test_heads_skips_a_target_without_a_head(tmp_path):
    run_studies(_options(tmp_path, ["heads"], draft="lookup"))
    rows = _rows(tmp_path, "heads")
    assert rows and all(r.get("skipped") and "--draft-head" in r["reason"] for r in rows)
    page = (tmp_path / "heads.md").read_text()
    assert "Not measured: no feature head for this target" in page and "![" not in page


def test_trees_and_draft_head_flags_reach_the_options(tmp_path, monkeypatch):
    import verispec.bench.runner as runner

    seen = []
    monkeypatch.setattr(runner, "run_studies", lambda options: seen.append(options) or [])
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "config.json").write_text("{}")
    assert main(["bench", "trees", "heads", "--out", str(tmp_path / "out"), "--device", "cpu",
                 "--trees", "2,2,1; 4,2,2,1", "--draft-head", str(tmp_path / "head")]) == 0
    assert seen[0].trees == ((2, 2, 1), (4, 2, 2, 1)) and seen[0].draft_head == str(tmp_path / "head")
    assert seen[0].studies == ("trees", "heads")


@pytest.mark.parametrize("argv, message", [
    (["--trees", "2,x"], "--trees: '2,x' is not comma-separated integers"),
    (["--trees", " ; "], "--trees: no tree given"),
    (["--trees", "2,0"], "--trees: tree[1] must be >= 1"),
    (["--trees", "2,1;8,8"], "--trees: tree [8, 8] has 72 nodes"),
    (["--draft-head", "{out}/nohead"], "--draft-head {out}/nohead: not a head directory"),
])
def test_bad_tree_and_head_options_fail_with_one_line(tmp_path, monkeypatch, capsys, argv, message):
    import verispec.bench.workbench as workbench

    monkeypatch.setattr(workbench, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "out"
    code = main(["bench", "trees", "heads", "--out", str(out), *[a.format(out=out) for a in argv]])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("verispec: error: bench: ")
    assert message.format(out=out) in err
