"""The CLI: argument handling and the --compare report (on the fake runtime), one real smoke run."""
from __future__ import annotations

import re

import pytest

import verispec.cli as cli
from fakes import FakeModel


@pytest.fixture
def fake_load(monkeypatch):
    loaded = []

    def load(source, device, dtype, what="model"):
        if source == "nope":
            cli._die(f"cannot load the {what} nope: 'nope' is neither an existing path nor a known shape name")
        model = FakeModel(seed=0, eos_bias=-30.0) if source != "other-vocab" else FakeModel(vocab_size=41)
        loaded.append((source, what))
        return model

    real_check_positions = cli._check_positions

    def check_positions(args, what, source):   # the fake names are not on disk: only "nope" reaches the real one
        if source == "nope":
            real_check_positions(args, what, source)

    monkeypatch.setattr(cli, "_load", load)
    monkeypatch.setattr(cli, "_check_positions", check_positions)
    return loaded


def test_generate_compare_reports_both_speeds_and_identity(fake_load, capsys):
    assert cli.main(["generate", "abc abc abc", "--draft-lookup", "--ngram-min", "1", "--compare",
                     "--max-new-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    assert "speculative" in err and "target-only" in err and "tok/s" in err
    assert "outputs identical: yes" in err
    assert "speedup:" in err


def test_generate_with_draft_model_and_batch_file(fake_load, tmp_path, capsys):
    batch = tmp_path / "prompts.txt"
    batch.write_text("hello there\nabc abc\n")
    assert cli.main(["generate", "--batch-file", str(batch), "--draft", "draft-name", "-k", "3",
                     "--max-new-tokens", "6", "--compare"]) == 0
    out, err = capsys.readouterr()
    assert out.count("--- [") == 2 and "outputs identical: yes" in err
    assert ("draft-name", "draft model") in fake_load


def test_generate_self_speculative_sampling(fake_load, capsys):
    assert cli.main(["generate", "abc", "--draft-self", "2", "--temperature", "0.8", "--top-k", "5",
                     "--max-new-tokens", "6", "--compare", "-v"]) == 0
    err = capsys.readouterr().err
    # -v adds each run's per-phase summary under its headline: speculative (drafts proposed), then target-only
    details = [line for line in err.splitlines() if line.startswith("[verispec]   6 tokens, ")]
    assert len(details) == 2, err
    assert re.search(r"accepted \d+/[1-9]\d* \(", details[0]) and "accepted 0/0 (0%)" in details[1]
    assert all(re.search(r"draft [\d.]+s target [\d.]+s verification [\d.]+s commit [\d.]+s$", d) for d in details)
    assert re.search(r"^\[verispec\] outputs identical: (yes|no \(expected when sampling)", err, re.M)


@pytest.mark.parametrize("argv, message", [
    (["generate", "abc", "--draft-lookup", "-k", "0"], "-k must be >= 1 (drafts per round), got 0"),
    (["generate", "abc", "--model", "nope"],
     "cannot load the model nope: 'nope' is neither an existing path nor a known shape name; known shapes: "
         "['llama-3.1-8b', 'llama-3.2-1b', 'mistral-7b', 'qwen2.5-0.5b', 'qwen2.5-7b', 'qwen3-0.6b', 'smollm2-135m']"),
    (["generate", "abc", "--draft", "other-vocab"],
     "draft model vocab 41 != target vocab 40: the draft model must share the target's tokenizer and vocabulary"),
    (["generate", "abc", "--draft-self", "9"], "SelfSpeculative(layers=9): need 1 <= layers < the target's 3 layers"),
    (["generate", ""], "PROMPT is empty"),
    (["generate", "abc", "--top-p", "1.5", "--temperature", "1"], "--top-p must be in (0, 1] (1 = off), got 1.5"),
    (["generate"], "give a PROMPT, - to read it from stdin, or --batch-file FILE"),
])
def test_bad_arguments_exit_with_a_clear_message(fake_load, capsys, argv, message):
    """Exit status 2 and exactly one error line that names the offending value."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"verispec: error: {message}"]


def test_exclusive_drafters(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "abc", "--draft-lookup", "--draft-self", "2"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "verispec: error: verispec generate: argument --draft-self: not allowed with argument --draft-lookup")


def test_cuda_device_without_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "abc", "--device", "cuda"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "verispec: error: --device: device 'cuda' was asked for but CUDA is not available here; use 'cpu'"]


def test_verify_demo(capsys):
    pytest.importorskip("verispec.verify.workloads")
    assert cli.main(["verify-demo", "--batch-size", "4", "--num-draft", "3", "--vocab-size", "500"]) == 0
    assert "matches the known answer: yes" in capsys.readouterr().out


@pytest.mark.slow
def test_real_model_compare_smoke(capsys):
    """The embedded SmolLM2 through the whole CLI (loads the model: ~10 s)."""
    from verispec.runtime.loading import embedded_gguf_path

    try:
        embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    assert cli.main(["generate", "Repeat exactly: one two three four five six.", "--draft-lookup", "--compare",
                     "--max-new-tokens", "16"]) == 0
    out, err = capsys.readouterr()
    assert "outputs identical: yes" in err
    assert "one two three" in out.lower()


def _refused(capsys, argv) -> str:
    """Runs the CLI, expects exit 2 and exactly one line on stderr; returns it."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def _config_dir(tmp_path, layers=4):
    """An HF checkpoint directory with config.json only: enough for the checks that read no weight."""
    import json

    (tmp_path / "config.json").write_text(json.dumps(dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=64, num_hidden_layers=layers,
        hidden_size=32, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)))
    return str(tmp_path)


def test_serve_refuses_bad_settings_before_loading(capsys, tmp_path, monkeypatch):
    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the arguments were checked")
    monkeypatch.setattr("verispec.runtime.loading.load_model", no_load)
    assert "--port must be in 1..65535, got 70000" in _refused(capsys, ["serve", "--port", "70000"])
    model = _config_dir(tmp_path)
    assert "--draft-self 99: need 1 <= L < the model's 4 layers" in _refused(
        capsys, ["serve", "--model", model, "--draft-self", "99"])
    assert "oracle:ALPHA needs an acceptance rate" in _refused(capsys, ["serve", "--draft", "oracle:2"])
    assert "pass --tokenizer" in _refused(capsys, ["serve", "--model", "llama-3.1-8b"])
    import socket
    with socket.socket() as s:          # a port that is taken: refused now, not after the model loads
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert "cannot listen there" in _refused(capsys, ["serve", "--port", str(s.getsockname()[1])])


def test_generate_refuses_draft_self_beyond_the_layers_before_loading(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(cli, "_load", lambda *a, **kw: pytest.fail("loaded before checking --draft-self"))
    err = _refused(capsys, ["generate", "hi", "--model", _config_dir(tmp_path), "--draft-self", "99"])
    assert "--draft-self 99: need 1 <= L < the model's 4 layers" in err


def _subparser(command: str):
    import argparse

    parser = cli._parser()
    for word in command.split():
        if word == "serve" and parser.prog.endswith("bench"):
            from verispec.bench.serving import build_parser
            return build_parser(cli._Parser, cli._Formatter)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


@pytest.mark.parametrize("command", ["serve", "bench", "bench serve", "quantize"])
def test_help_documents_every_option_with_its_default(capsys, command):
    """Every option of `verispec serve --help` / `bench --help` / `bench serve --help` has a help text, and
    every option that takes a value shows its default."""
    with pytest.raises(SystemExit) as e:
        cli.main([*command.split(), "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for action in _subparser(command)._actions:
        if not action.option_strings or action.dest == "help":
            continue
        assert action.help, action.option_strings
        if action.nargs != 0:                       # flags (store_true) have no default worth printing
            assert f"(default: {action.default})" in out, action.option_strings


def test_package_import_is_lazy():
    """`verispec --help` imports the package: it must not import torch (seconds) to print help."""
    import subprocess
    import sys

    code = "import sys, verispec.cli as c; c._parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
