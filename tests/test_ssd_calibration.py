"""benchmarks/ssd_calibrate.py --quick runs on the CPU and ssd_sim.py loads what it writes."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU --quick path only")
def test_quick_calibration_feeds_the_simulator(tmp_path):
    pytest.importorskip("matplotlib")
    calibrate, ssd_sim = load("ssd_calibrate"), load("ssd_sim")
    calibrate.main(["--quick", "--out", str(tmp_path)])
    raw = json.loads((tmp_path / "ssd_calibration.json").read_text())
    # the quick grid: B in {1, 2}; decode + K + 1 for K in {2, 3}; draft rows B * F for F in {1, 2}
    assert {B: sorted(row) for B, row in raw["target"].items()} == {"1": ["1", "3", "4"], "2": ["1", "3", "4"]}
    assert sorted(raw["draft"], key=int) == ["1", "2", "4"]
    assert raw["tp1"]["backend"] == "gloo" and set(raw["tp1"]["tp1"]) == {"1"}
    assert "## Target pass" in (tmp_path / "ssd_calibration.md").read_text()

    targets, draft, _ = ssd_sim.load_calibration(tmp_path / "ssd_calibration.json")
    assert targets[2](2 * 3) == raw["target"]["2"]["3"]           # B = 2, K = 2: 6 tokens per pass
    assert draft(4) == raw["draft"]["4"]
    ssd_sim.main(["--out", str(tmp_path), "--calibration", str(tmp_path / "ssd_calibration.json")])
    report = (tmp_path / "ssd.md").read_text()
    assert "measured by `benchmarks/ssd_calibrate.py`" in report
    check = report.split("## Check")[1]
    measured_b1 = [c for c in ssd_sim.measured_sd_cells() if c["B"] == 1]
    assert len([ln for ln in check.splitlines() if ln.startswith("| 1 |")]) == len(measured_b1) > 0


def test_refuses_a_file_that_is_not_a_calibration(tmp_path):
    ssd_sim = load("ssd_sim")
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"target": {}}))
    with pytest.raises(ValueError, match="no 'draft' section"):
        ssd_sim.load_calibration(bad)
