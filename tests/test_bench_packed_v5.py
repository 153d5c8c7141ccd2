"""benchmarks/packed_v5.py's report on the CPU: its tables and its computed reading from a saved run's rows
(the kernels themselves run on a GPU: tests/test_quant_gpu.py checks v5 == v3; the ablation's own .cu compiles in
tests/test_cuda_compile.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.packed_v5 import V5, WALKS, findings, markdown  # noqa: E402


def _row(shape, typ, v3, v4, v5, walk, split=None, same=True):
    r = dict(shape=shape, type=typ, N=4096, K=4096, M=1, packed_mb=9.4, floor_us=2.2, v3_us=v3, v4_us=v4, v5_us=v5,
             equals_v3=same)
    r.update({f"v5c{c}_us": v5 + c for c in range(len(V5))})
    r.update({f"walk{c}_us": walk + c for c in range(len(WALKS))})
    if split:
        r.update(loads_us=split[0], math_us=split[1], loads_pf_us=split[0] + 5)
    return r


def _res(rows):
    env = dict(device="NVIDIA H200", sms=132, l2_mib=60, driver="x", date="2026-11-29 06:51 UTC", torch="2.11",
               cuda="13.0", triton="3.6.0", transformers="5.17.0", python="3.12.3")
    return dict(env=env, bandwidth=4.28e12, rows=rows)


def test_findings_are_computed_from_the_rows():
    rows = [_row("gate+up", "Q4_K", 38.8, 38.7, 35.8, 39.1, split=(23.1, 21.9)),
            _row("down", "Q4_K", 20.0, 19.7, 18.1, 18.8),
            _row("gate+up", "Q6_K", 65.0, 60.0, 40.0, 65.0)]
    text = "\n".join(findings(rows))
    assert "Q4_K, one row of x" in text and "1.08-1.09x" in text          # 38.7 / 35.8, 19.7 / 18.1
    assert "Q6_K, one row of x" in text and "1.50-1.50x" in text
    assert "loads alone 23.1 us, arithmetic alone 21.9" in text and "(loads + arithmetic 45.0)" in text
    assert "every kernel's output == v3's bit for bit: yes" in text


def test_a_kernel_that_differs_from_v3_is_reported():
    rows = [_row("gate+up", "Q4_K", 38.8, 38.7, 35.8, 39.1, same=False)]
    assert "every kernel's output == v3's bit for bit: NO" in "\n".join(findings(rows))
    table = "\n".join(markdown(_res(rows), "cmd"))
    assert "| gate+up | Q4_K | 1 |" in table and table.rstrip().endswith("bit for bit: NO.")


def test_markdown_has_one_column_per_configuration():
    table = markdown(_res([_row("q/o", "Q4_K", 7.3, 7.3, 6.8, 7.3)]), "python benchmarks/packed_v5.py")
    cells = next(line for line in table if line.startswith("| shape")).strip("| ").split(" | ")
    assert sum(c.startswith("v5 ") and c.endswith("b") for c in cells) == len(V5)
    assert sum(c.startswith("walk") for c in cells) == len(WALKS)
    assert "Command: `python benchmarks/packed_v5.py`." in table


@pytest.mark.parametrize("argv, message", [(["--types", "Q4_0"], "--types"), (["--ms", "0"], "--ms"),
                                           (["--ms", "1,x"], "--ms"), (["--calls", "0"], "--calls")])
def test_bad_flags_are_refused_by_name(argv, message, capsys):
    from benchmarks.packed_v5 import main

    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err
