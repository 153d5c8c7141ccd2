"""benchmarks/round_host.py on tiny CPU models: the instrumented call's figures, the functions put back after it,
its configs and its refusal without a GPU."""
from __future__ import annotations

import pytest
import torch

from benchmarks import round_host
from verispec.engine import scheduler as scheduler_module
from verispec.engine.scheduler import Scheduler
from verispec.runtime import ModelConfig, load_model

CFG = ModelConfig(vocab_size=97, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                  intermediate_size=48, max_position_embeddings=512)


def test_configs_parse_and_a_bad_one_is_named():
    assert round_host.parse_config("plain") == (None, None)
    assert round_host.parse_config("k3") == (3, None)
    assert round_host.parse_config("2-2") == (None, (2, 2))
    assert round_host.parse_config("auto") == (4, "auto")
    assert round_host.parse_config("auto-k1") == (4, "auto")
    for bad in ("k0", "2-0", "tree"):
        with pytest.raises(ValueError, match=f"'{bad}' is none of"):
            round_host.parse_config(bad)


def test_auto_k1_fixes_the_choice_at_one_draft_and_puts_it_back():
    from verispec.engine.auto_k import AutoK
    before = AutoK.__dict__["_choose_greedy_shape"]
    with round_host.choice_fixed(True):
        assert AutoK._choose_greedy_shape(None, [], 4, []) == 1
    with round_host.choice_fixed(False):
        assert AutoK.__dict__["_choose_greedy_shape"] is before
    assert AutoK.__dict__["_choose_greedy_shape"] is before


def test_measure_times_the_rounds_and_puts_every_function_back():
    target = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    draft = load_model(CFG.replace(num_layers=1), device="cpu", dtype=torch.float32, seed=1)
    draft.use_graphs = True               # the captured loop's logic (eager on the CPU): its drafts can be prelaunched
    before = Scheduler.__dict__["_round"]
    cells = [round_host.measure(target, draft, c, 2, 12, 0.8, {1: 0.6, 2: 0.75}, lambda: None, repeats=2)
             for c in ("plain", "k2", "2-2", "auto", "auto-k1")]
    assert Scheduler.__dict__["_round"] is before and scheduler_module.PRELAUNCH is True     # restored
    for c in cells:
        assert c["exact"] and c["rounds"] >= 1 and c["ms_per_round"] > 0
        assert 0 <= c["wait_ms"] <= c["instrumented_ms_per_round"] and c["ms_per_round_without"] > 0
        assert c["ms_range"][0] <= c["ms_per_round"] <= c["ms_range"][1]
        if not c["config"].startswith("auto"):                                # auto: as its plans go
            assert (c["prelaunched_rounds"] > 0) == (c["config"] != "plain")  # a fixed k or tree
        ms, per_round = c["functions"]["Scheduler._round"]
        assert per_round == pytest.approx(1.0) and 0 < ms <= c["instrumented_ms_per_round"]
    assert "OracleDraft.propose" in cells[1]["functions"] and "OracleDraft.propose_tree" in cells[2]["functions"]
    assert "AutoK.decide" in cells[3]["functions"] and "AutoK.observe_round" in cells[3]["functions"]
    from benchmarks.common import environment

    page = round_host.markdown(dict(env=environment(), command="x", alpha=0.8, rates={1: 0.6}, batch=2,
                                    new_tokens=12, repeats=2,
                                    parts=[dict(weights="bf16", target="tiny", draft="tiny", cells=cells)]))
    assert "| config | ms per round | range | prelaunched | without prelaunch |" in page
    assert "`Scheduler._round`" in page
    assert "## tiny target, tiny draft" in page and "| plain |" in page and "| 1.000 |" in page   # vs plain
    floored = round_host.markdown(dict(env=environment(), command="x", alpha=0.8, rates={1: 0.6}, batch=2,
                                       new_tokens=12, repeats=2, parts=[dict(
                                           weights="bf16", target="tiny", draft="tiny", cells=cells,
                                           floor_ms=dict(bandwidth=4e12, target=1.0, draft=0.25))]))
    k2 = next(line for line in floored.splitlines() if line.startswith("| k2 |"))
    assert "| floor ms | % floor |" in floored and "| 1.500 |" in k2                 # 1.0 + 2 x 0.25
    assert next(line for line in floored.splitlines() if line.startswith("| auto |")).endswith("|  |  |")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_the_script_refuses_without_a_gpu_and_names_a_bad_config_first(capsys):
    with pytest.raises(SystemExit) as e:
        round_host.main(["--configs", "plain"])
    assert e.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        round_host.main(["--configs", "k0"])
    assert e.value.code == 2 and "'k0' is none of" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        round_host.main(["--weights", "bf16,int4"])
    assert e.value.code == 2 and "--weights: 'bf16,int4'" in capsys.readouterr().err
