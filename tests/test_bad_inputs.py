"""Bad inputs through the CLI and the Python API: each ends in a clear error naming the offending argument.

CLI cases fail during validation, before any model is loaded (validate-before-load is what keeps them
fast); a few run as real subprocesses to check the exit status and that stderr is one line, no traceback.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import torch

import verispec.cli as cli
from fakes import FakeModel
from verispec import verify_greedy, verify_sample
from verispec.drafters import DraftModel
from verispec.engine import Stats
from verispec.runtime import load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "latin1.txt").write_bytes(b"caf\xe9 au lait\n")
    (d / "blank.txt").write_text("\n  \n")
    (d / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 7)
    (d / "notes.txt").write_text("not a model")
    return d


def _embedded_or_skip():
    from verispec.runtime.loading import embedded_gguf_path

    try:
        embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


# argv (with {d} = the files folder), expected exit code, text the one-line message must contain
CLI_CASES = [
    (["generate", "x", "--device", "tpu"], 2, "--device: unknown device 'tpu'"),
    (["generate", "x", "--device", "mps"], 2, "--device: device 'mps' is not supported"),
    (["generate", "x", "--draft", "llama-3.2-1b", "--draft-device", "tpu"], 2, "--draft-device"),
    (["generate", "x", "--draft-device", "cpu"], 2, "--draft-device needs --draft"),
    (["generate", "--batch-file", "{d}/missing.txt"], 2, "--batch-file {d}/missing.txt: No such file"),
    (["generate", "--batch-file", "{d}/latin1.txt"], 2, "--batch-file {d}/latin1.txt is not valid UTF-8: byte 0xe9"),
    (["generate", "--batch-file", "{d}/blank.txt"], 2, "has no prompts"),
    (["generate", "x", "--batch-file", "{d}/blank.txt"], 2, "not both"),
    (["generate"], 2, "give a PROMPT"),
    (["generate", "   "], 2, "PROMPT is empty"),
    (["generate", "x\udce9y"], 2, "PROMPT is not valid UTF-8 text: byte 0xe9"),
    (["generate", "x", "--max-new-tokens", "0"], 2, "--max-new-tokens must be >= 1"),
    (["generate", "x", "--model", "llama-3.2-1b", "--max-new-tokens", "10000000"], 2,
     "--max-new-tokens 10000000 exceeds what the model can hold"),
    (["generate", "x", "-k", "0"], 2, "-k must be >= 1"),
    (["generate", "x", "--threads", "0"], 2, "--threads must be >= 1"),
    (["generate", "x", "--temperature", "nan"], 2, "--temperature must be finite"),
    (["generate", "x", "--temperature", "inf"], 2, "--temperature must be finite"),
    (["generate", "x", "--temperature", "1e-39"], 2, "--temperature 1e-39 is below the smallest supported"),
    (["generate", "x", "--temperature", "-1"], 2, "--temperature must be finite and >= 0"),
    (["generate", "x", "--temperature", "warm"], 2, "argument --temperature: invalid float value"),
    (["generate", "x", "--top-p", "0"], 2, "--top-p must be in (0, 1]"),
    (["generate", "x", "--top-p", "nan"], 2, "--top-p must be in (0, 1]"),
    (["generate", "x", "--top-k", "-1"], 2, "--top-k must be >= 0"),
    (["generate", "x", "--seed", str(2**70)], 2, "--seed must fit in 64 bits"),
    (["generate", "x", "--dtype", "int8"], 2, "--dtype 'int8' is not one of"),
    (["generate", "x", "--draft-lookup", "--ngram-min", "3", "--ngram-max", "2"], 2, "--ngram-min / --ngram-max"),
    (["generate", "x", "--draft-self", "0"], 2, "--draft-self must be >= 1"),
    (["generate", "x", "--stop", ""], 2, "--stop: stop strings must be non-empty"),
    (["generate", "x", "--model", "no-such-model"], 2, "cannot load the model no-such-model"),
    (["generate", "x", "--model", "{d}/missing/m.gguf"], 2, "does not exist"),
    (["generate", "x", "--model", "{d}/notes.txt"], 2, "is not a .gguf file"),
    (["generate", "x", "--model", "{d}/cut.gguf"], 2, "the file is truncated or corrupt"),
    (["generate", "x", "--draft", "no-such-draft"], 2, "cannot load the draft model no-such-draft"),
    (["generate", "x", "--draft-lookup", "--draft-self", "2"], 2, "not allowed with argument"),
    (["verify-demo", "--batch-size", "100000000"], 2, "--batch-size 100000000 x (--num-draft 4 + 1)"),
    (["verify-demo", "--batch-size", "0"], 2, "--batch-size must be >= 1"),
    (["verify-demo", "--num-draft", "-1"], 2, "--num-draft must be >= 0"),
    (["verify-demo", "--vocab-size", "0"], 2, "--vocab-size must be >= 1"),
    (["verify-demo", "--acceptance-rate", "2"], 2, "--acceptance-rate must be in [0, 1]"),
    (["verify-demo", "--device", "tpu"], 2, "--device: unknown device"),
    (["verify-demo", "--dtype", "int8"], 2, "--dtype 'int8'"),
    (["verify-demo", "--seed", "-1"], 2, "--seed must be in [0, 2**63)"),
    (["demo", "--max-new-tokens", "0"], 2, "--max-new-tokens must be >= 1"),
    (["translate", "x"], 2, "invalid choice: 'translate'"),
]


@pytest.mark.parametrize("argv, code, message", CLI_CASES, ids=[" ".join(c[0])[:60] for c in CLI_CASES])
def test_cli_bad_input(argv, code, message, files, capsys, monkeypatch):
    def no_load(*a, **k):   # validation must finish before anything is loaded
        raise AssertionError("a model was loaded before the arguments were validated")

    monkeypatch.setattr(cli, "_load", no_load)
    argv = [a.replace("{d}", str(files)) for a in argv]
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("verispec: error:")]
    assert e.value.code == code
    assert len(errors) == 1 and "Traceback" not in err, err
    assert message.replace("{d}", str(files)) in errors[0], err


# callable, expected exception, text its message must contain
LOGITS = torch.randn(5, 8, generator=torch.Generator().manual_seed(0)).clamp(-3, 3)   # |x| * 1e38 stays finite in fp32
DRAFTS, NUM = torch.tensor([1, 2, 3]), torch.tensor([2, 1])


def _dead_row():
    x = LOGITS.clone()
    x[3] = float("-inf")
    return x


API_CASES = [
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, temperature=float("nan")), ValueError, "temperature"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, temperature=1e-39), ValueError, "temperature 1e-39"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, temperature=torch.tensor([1e-39, 1.0])), ValueError,
     "sequence 0: a temperature / top_k / top_p tensor is out of range"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, temperature=[0.0, 1.0, 2.0]), ValueError, "temperature has 3 entries"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, temperature=[0.5, "hot"]), TypeError, "temperature[1]"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, seed=1.5), TypeError, "seed must be an integer"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, seed=2**70), ValueError, "seed must fit in 64 bits"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, seed=torch.tensor([1.5])), TypeError, "seed must be an int"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, offset=0.5), TypeError, "offset must be an integer"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, top_k=2.5), TypeError, "top_k must be an integer"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, top_k=torch.tensor([2.0, 3.0])), TypeError, "top_k must be an integer"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, top_p=[0.5, 0.0]), ValueError, "top_p[1] must be in (0, 1]"),
    (lambda: verify_sample(LOGITS, DRAFTS, NUM, generator="g"), TypeError, "generator must be a torch.Generator"),
    (lambda: verify_sample(LOGITS * 1e38, DRAFTS, NUM), ValueError, "sequence 0: max logit / temperature is beyond 2**30"),
    (lambda: verify_sample(LOGITS * 1e30, DRAFTS, NUM, temperature=0.5), ValueError,
     "sequence 0: max logit / temperature is beyond"),
    (lambda: verify_sample(_dead_row(), DRAFTS, NUM, seed=0), ValueError,
     "sequence 1: a target_logits row is entirely -inf"),
    (lambda: verify_greedy(_dead_row(), DRAFTS, NUM), ValueError, "sequence 1: a target_logits row is entirely -inf"),
    (lambda: load_model("llama-3.2-1b", device="tpu"), ValueError, "unknown device 'tpu'"),
    (lambda: DraftModel("smollm2-135m"), TypeError, "DraftModel('smollm2-135m') got a name"),
]


@pytest.mark.parametrize("call, error, message", API_CASES, ids=[str(i) for i in range(len(API_CASES))])
def test_api_bad_input(call, error, message):
    with pytest.raises(error) as e:
        call()
    assert message in str(e.value)


def test_there_are_at_least_forty_cases():
    assert len(CLI_CASES) + len(API_CASES) >= 40


# ------------------------------------------------------------------------------------------ real processes
def _run(args: list, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "verispec.cli", *args], input=stdin, capture_output=True,
                          env=env, timeout=120)


def test_subprocess_non_utf8_argv_is_one_line_exit_2():
    p = _run(["generate", b"caf\xe9"])
    assert p.returncode == 2
    assert p.stderr.decode().strip() == "verispec: error: PROMPT is not valid UTF-8 text: byte 0xe9 at character 3"


def test_subprocess_bad_device():
    p = _run(["generate", "x", "--device", "tpu"])
    assert p.returncode == 2 and p.stderr.count(b"\n") == 1 and b"--device" in p.stderr


# ------------------------------------------------------------------------------------------ in-process runs
@pytest.fixture
def fake_target(monkeypatch):
    monkeypatch.setattr(cli, "_load", lambda *a, **k: FakeModel(seed=0, eos_bias=-30.0))
    monkeypatch.setattr(cli, "_check_positions", lambda *a, **k: None)


def test_prompt_from_stdin(fake_target, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"abc abc abc\n")))
    assert cli.main(["generate", "-", "--draft-lookup", "--max-new-tokens", "5", "--no-chat", "-v"]) == 0
    out, err = capsys.readouterr()
    assert "5 tokens" in err and out.strip()


def test_stdin_not_utf8(fake_target, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ab\xffc")))
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "-"])
    assert e.value.code == 2 and "stdin is not valid UTF-8: byte 0xff at offset 2" in capsys.readouterr().err


def test_ctrl_c_prints_the_partial_result_and_exits_130(fake_target, monkeypatch, capsys):
    real = cli._Collector.__call__

    def interrupt_after_three(self, i, toks):
        real(self, i, toks)
        if len(self.tokens[0]) >= 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli._Collector, "__call__", interrupt_after_three)
    assert cli.main(["generate", "abc", "--max-new-tokens", "50", "--no-chat"]) == 130
    out, err = capsys.readouterr()
    assert out.strip()                                   # the streamed text stays
    assert "interrupted (Ctrl-C) after 3 generated token(s)" in err and "Traceback" not in err


def test_random_weight_shape_names_say_so(fake_target, capsys):
    assert cli.main(["generate", "abc", "--model", "smollm2-135m", "--max-new-tokens", "3", "-q"]) == 0
    err = capsys.readouterr().err
    assert "--model 'smollm2-135m' is a shape name: the weights are random" in err
    assert "the embedded trained SmolLM2-135M-Instruct is what you get without --model" in err


def test_k_is_capped_for_a_model_draft(fake_target, capsys):
    assert cli.main(["generate", "abc", "--draft", "llama-3.2-1b", "-k", "1000", "--max-new-tokens", "6",
                     "-q", "--no-chat"]) == 0
    assert "k=1000 capped to 5" in capsys.readouterr().err


def _stats(new_tokens, rounds, proposed, accepted, decode_s, target_s) -> Stats:
    return Stats(new_tokens=new_tokens, rounds=rounds, proposed=proposed, accepted=accepted, decode_s=decode_s,
                 target_s=target_s)


def test_hint_when_speculation_lost(capsys):
    slow = _stats(21, 20, 80, 1, decode_s=4.0, target_s=1.0)     # 0.2 s/token, a pass costs 0.05 s
    cli._hint_if_speculation_lost([("speculative", [], 4.0, slow)], None)
    assert "hint: speculation was slower than plain decoding" in capsys.readouterr().err
    good = _stats(61, 20, 80, 40, decode_s=1.0, target_s=0.9)
    cli._hint_if_speculation_lost([("speculative", [], 1.0, good)], None)
    measured_win = [("speculative", [], 1.0, _stats(61, 20, 80, 40, 1.0, 0.9)),
                    ("target-only", [], 1.0, _stats(61, 60, 0, 0, 2.0, 1.9))]
    cli._hint_if_speculation_lost(measured_win, None)
    assert capsys.readouterr().err == ""
    measured_loss = [("speculative", [], 1.0, _stats(61, 60, 80, 2, 3.0, 1.0)),
                     ("target-only", [], 1.0, _stats(61, 60, 0, 0, 1.0, 0.9))]
    cli._hint_if_speculation_lost(measured_loss, None)
    assert "measured 0.33x" in capsys.readouterr().err
