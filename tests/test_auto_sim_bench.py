"""``benchmarks/auto_sim.py``: tree="auto"'s policy simulated on measured round costs (CPU, seconds). It finds the
dominant shape where one dominates (a tree at B = 1, chain k = 1 at a large batch), its measure can tell a policy
without that shape (the tree-less run falls short), and a file that is not an e2e result is refused by name."""
import json

import pytest

from benchmarks import auto_sim

RATES = {"1": 0.6, "2": 0.75}


def _e2e(costs: dict) -> dict:
    """A trees.py e2e result of fixed configs at the given round costs (ms), {B: {config: ms}}."""
    cells = [dict(B=B, config=name, ms_per_round=ms, tok_s=1.0) for B, row in costs.items() for name, ms in row.items()]
    return dict(rates=RATES, cells=cells, command="python benchmarks/trees.py e2e ...")


COSTS = {1: {"plain": 5.0, "chain k=1": 6.3, "chain k=2": 7.5, "tree [2, 2]": 7.6},          # the tree wins at B = 1
         8: {"plain": 5.4, "chain k=1": 7.6, "chain k=2": 9.6, "tree [2, 2]": 14.0}}        # chain k=1 at B = 8


def test_the_policy_finds_the_dominant_shape_and_a_policy_without_it_falls_short():
    res = auto_sim.run(_e2e(COSTS), rounds=120, seeds=3)
    for cell in res["cells"]:
        best = max(cell["fixed"].values())
        assert min(cell["auto"]) > 0.9 * best, cell
    b1 = next(c for c in res["cells"] if c["B"] == 1)
    assert max(b1["fixed"], key=b1["fixed"].get) == "tree [2, 2]" and b1["chosen"].get((2, 2), 0) > 60
    # the measure has teeth: without the tree among its candidates the same policy stays below the tree's rate
    no_tree = {B: {n: ms for n, ms in row.items() if not n.startswith("tree")} for B, row in COSTS.items()}
    chains_only = auto_sim.run(_e2e(no_tree), rounds=120, seeds=3)["cells"][0]
    assert max(chains_only["auto"]) < 0.97 * b1["fixed"]["tree [2, 2]"]
    assert all(len(c["ahead"]) == 3 for c in res["cells"])          # the same seeds, planned ahead
    lines = auto_sim.markdown(res, "x.json")
    assert any(line.startswith("auto, simulated: ") for line in lines)
    assert any(line.startswith("Planned ahead (") for line in lines)


def test_the_runs_own_cost_table_can_be_the_prior(tmp_path, capsys):
    """``--prior table``: the policy prices shapes by the auto cell's kept table (here one that prices the tree at a
    chain as wide, 2.5x its measured round: the policy does not try it and stays at the chains' rate), against the
    measured prior that finds it; without a kept table the option is refused by name."""
    e2e = _e2e({1: COSTS[1]})
    right = auto_sim.run(e2e, rounds=120, seeds=2)["cells"][0]
    dear = auto_sim.CostTable((1,), (1, 2, 3, 7), ((5.0e-3, 6.3e-3, 7.5e-3, 19e-3),), (0.0,))
    e2e["cells"].append(dict(B=1, config="auto", ms_per_round=7.0, tok_s=1.0, cost_table=json.loads(dear.to_json())))
    table = auto_sim.run(e2e, rounds=120, seeds=2, prior="table")
    assert table["prior"] == "table" and table["cells"][0]["chosen"].get((2, 2), 0) < 10
    assert max(table["cells"][0]["auto"]) < min(right["auto"])
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps(_e2e(COSTS)))
    with pytest.raises(SystemExit):
        auto_sim.main([str(path), "--prior", "table"])
    assert "needs the auto cell's cost table at B = 1" in capsys.readouterr().err


def test_bad_inputs_are_named(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit):
        auto_sim.main([str(bad)])
    assert "not a trees.py e2e result" in capsys.readouterr().err
    no_plain = tmp_path / "no_plain.json"
    no_plain.write_text(json.dumps(_e2e({1: {"chain k=1": 6.0, "tree [2, 2]": 7.0}})))
    with pytest.raises(SystemExit):
        auto_sim.main([str(no_plain)])
    assert "needs plain and at least one chain" in capsys.readouterr().err
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(_e2e({1: {"plain": 5.0, "chain k=1": float("nan")}})))
    with pytest.raises(SystemExit):
        auto_sim.main([str(nan)])
    assert "'chain k=1' needs a batch size B >= 1 and a positive, finite ms_per_round" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        auto_sim.main([str(no_plain), "--rounds", "0"])
    assert "--rounds and --seeds must be >= 1" in capsys.readouterr().err
