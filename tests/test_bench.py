"""``verispec bench``: every study in --quick mode on a tiny random model writes its page and valid PNGs;
analytical values in the pages are verispec.analysis's; a second run skips the rows already written; bad
arguments fail with one line (exit 2) before any model loads."""
from __future__ import annotations

import json

import matplotlib.image
import pytest

from verispec import analysis
from verispec.bench import STUDIES, BenchOptions, Workbench, check_options, run_studies
from verispec.bench.studies import window as window_study
from verispec.cli import main
from verispec.runtime import ModelConfig

TINY = ModelConfig(vocab_size=96, num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                   intermediate_size=64)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _fixed_k_policy(bench, k_max, batch, alpha):
    """A stand-in k="auto" policy: half the cap for every row (exercises the study's auto path)."""
    return lambda: (lambda running, k: [max(1, k // 2)] * len(running))


def _options(out, studies=STUDIES, draft="oracle", **kw):
    return check_options(BenchOptions(studies=tuple(studies), out=out, model=TINY, draft=draft, quick=True,
                                      device="cpu", command="pytest", **kw))


@pytest.fixture(scope="module")
def quick_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    bench = Workbench(_options(out))
    bench.auto_policy = _fixed_k_policy
    run_studies(bench.options, bench)
    return out


def _rows(out, study):
    return [json.loads(line) for line in (out / f"{study}.jsonl").read_text().splitlines()]


def _images(page: str) -> list[str]:
    return [line[line.index("(") + 1:-1] for line in page.splitlines() if line.startswith("![")]


# the tiny model has no feature head: its heads page says why, with no table (tests/test_bench_trees_heads.py)
@pytest.mark.parametrize("study", [s for s in STUDIES if s != "heads"])
def test_every_study_writes_its_page_and_valid_pngs(quick_dir, study):
    page = (quick_dir / f"{study}.md").read_text()
    assert page.startswith(f"# verispec bench: {study}")
    for field in ("- device: CPU", "- date: ", "- versions: verispec", "- command: `pytest`", "- models: target random"):
        assert field in page
    assert "| " in page                                   # a table
    images = _images(page)
    assert images, "no plot linked from the page"
    for name in images:
        data = (quick_dir / name).read_bytes()
        assert data[:8] == PNG_SIGNATURE
        pixels = matplotlib.image.imread(quick_dir / name)
        assert pixels.shape[0] >= 400 and pixels.shape[1] >= 700, pixels.shape
        assert pixels.std() > 0.01                         # not a blank canvas


def test_speedup_predictions_are_the_analysis_values(quick_dir):
    page = (quick_dir / "speedup.md").read_text()
    sd = [r for r in _rows(quick_dir, "speedup") if r["point"]["method"] == "sd"]
    assert sd
    for r in sd:
        alphas, k = r["alpha_per_position"], r["point"]["k"]
        t_draft, t_verify, t_target = r["t_draft_ms"] / 1e3, r["t_verify_ms"] / 1e3, r["t_target_ms"] / 1e3
        assert len(alphas) == k and all(0 <= a <= 1 for a in alphas)
        e = analysis.expected_tokens_from_positions(alphas)
        assert r["e_sd"] == pytest.approx(e, rel=1e-12)
        assert r["predicted"] == pytest.approx(e / (1 + k * t_draft / t_target), rel=1e-9)
        assert r["predicted_pass"] == pytest.approx(e * t_target / (k * t_draft + t_verify), rel=1e-9)
        if len(set(alphas)) == 1:   # one acceptance rate at every position: the i.i.d. model's E_SD
            assert r["e_sd"] == pytest.approx(analysis.expected_tokens_per_round(alphas[0], k), rel=1e-9)
        assert f"| {r['predicted']:.2f} | {r['predicted_pass']:.2f} |" in page
    a = sum(r["alpha_measured"] for r in sd) / len(sd)
    c = sum(r["cost_ratio"] for r in sd) / len(sd)
    best = analysis.optimal_k(a, c, k_max=max(r["point"]["k"] for r in sd))
    assert f"| {a:.3f} | {c:.4f} | {best} | {analysis.speedup(a, best, c):.2f} |" in page


def test_auto_rows_use_the_given_policy(quick_dir):
    auto = [r for r in _rows(quick_dir, "speedup") if r["point"]["method"] == "auto"]
    assert auto and not auto[0].get("skipped")
    assert auto[0]["mean_k"] == pytest.approx(max(1, auto[0]["point"]["k"] // 2), abs=1e-9)


def test_window_values_are_the_analysis_values(quick_dir):
    page = (quick_dir / "window.md").read_text()
    for r in _rows(quick_dir, "window"):
        k = r["point"]["k"]
        assert r["t_sd"] == pytest.approx(k * r["t_draft_ms"] / r["t_target_ms"], rel=1e-9)
        assert r["e_sd"] == pytest.approx(analysis.expected_tokens_from_positions(r["alpha_per_position"]), rel=1e-12)
        assert r["predicted"] == pytest.approx(r["e_sd"] / (1 + k * r["t_draft_ms"] / r["t_target_ms"]), rel=1e-9)
        assert f"| {r['e_sd']:.2f} | {r['predicted']:.2f} |" in page


def test_kernel_floor_is_bytes_over_the_measured_bandwidth(quick_dir):
    for r in _rows(quick_dir, "kernels"):
        assert r["floor_us"] == pytest.approx(r["bytes"] / (r["copy_gbps"] * 1e9) * 1e6, rel=1e-9)
        assert r["bytes"] >= r["point"]["batch"] * (r["k"] + 1) * r["vocab"] * 4   # the fp32 logits, read once


def test_report_gathers_every_study(quick_dir, capsys):
    assert main(["bench", "report", str(quick_dir)]) == 0
    report = (quick_dir / "report.md").read_text()
    for s in STUDIES:
        assert f"## {s}" in report
    for name in _images(report):
        assert (quick_dir / name).exists()


def test_resume_skips_finished_rows(tmp_path, monkeypatch):
    calls = []
    measure = window_study.measure
    monkeypatch.setattr(window_study, "measure", lambda bench, point: calls.append(point) or measure(bench, point))
    options = _options(tmp_path, studies=["window"], draft="lookup")
    run_studies(options)
    points = len(options.ks)
    assert len(calls) == points
    run_studies(options)                                   # everything written: nothing measured again
    assert len(calls) == points
    lines = (tmp_path / "window.jsonl").read_text().splitlines()
    (tmp_path / "window.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    run_studies(options)                                   # the missing point only
    assert len(calls) == points + 1
    assert calls[-1] == json.loads(lines[-1])["point"]
    assert len(_rows(tmp_path, "window")) == points


@pytest.mark.parametrize("argv, message", [
    (["bench", "nosuch", "--out", "{out}"], "unknown study 'nosuch'"),
    (["bench", "window", "--k", "0", "--out", "{out}"], "--k: k (drafts per round) must be integers >= 1, got 0"),
    (["bench", "window", "--k", ",", "--out", "{out}"], "--k: the sweep is empty"),
    (["bench", "window", "--batches", "", "--out", "{out}"], "--batches: the sweep is empty"),
    (["bench", "window", "--alphas", "1.5", "--out", "{out}"], "--alphas: acceptance rates must be in [0, 1]"),
    (["bench", "window", "--out", "{file}/sub"], "cannot write there"),
    (["bench", "window"], "--out DIR is required"),
    (["bench", "window", "--draft", "oracle:2", "--out", "{out}"], "oracle:ALPHA needs an acceptance rate"),
    (["bench", "report", "{out}"], "holds no study report"),
    (["bench", "window", "--packed", "--model", "llama-3.2-1b", "--out", "{out}"], "--packed keeps GGUF blocks"),
])
def test_bad_arguments_fail_with_one_line_before_any_work(tmp_path, monkeypatch, capsys, argv, message):
    import verispec.bench.workbench as workbench

    monkeypatch.setattr(workbench, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    (tmp_path / "afile").write_text("")
    argv = [a.format(out=tmp_path / "out", file=tmp_path / "afile") for a in argv]
    (tmp_path / "out").mkdir()
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("verispec: error: bench: ")
    assert message in err
    assert not list((tmp_path / "out").glob("*.jsonl"))


def test_unwritable_out_dir(tmp_path, capsys):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("running as a user that can write anywhere (root)")
    assert main(["bench", "window", "--out", str(locked)]) == 2
    assert "cannot write there" in capsys.readouterr().err


def test_packed_gguf_target(tmp_path):
    """--packed: a .gguf target keeps its GGUF blocks through the speedup study (no tokenizer: the oracle's target is
    peaked, make_peaked keeping the packed head's blocks), and the page says so."""
    pytest.importorskip("gguf")
    from verispec.runtime.quant.export import write_quantized_gguf
    from verispec.runtime.quant.packed import packed_weights

    path = tmp_path / "tiny-Q8_0.gguf"
    write_quantized_gguf(TINY, path, "Q8_0", device="cpu", seed=1)
    options = check_options(BenchOptions(studies=("speedup",), out=tmp_path / "out", model=str(path), draft="oracle",
                                         quick=True, device="cpu", packed=True, command="pytest"))
    bench = Workbench(options)
    (page,) = run_studies(options, bench)
    assert {"lm_head", "layers.0.w13"} <= set(packed_weights(bench.target.net))
    assert "GGUF weights packed" in page.read_text()
    assert {r["point"]["method"] for r in _rows(tmp_path / "out", "speedup")} >= {"ar", "sd"}
