"""``verispec train-head`` and ``--draft-head``: bad arguments end in one line naming the problem (exit 2), before
any model loads."""
from __future__ import annotations

import pytest

import verispec.cli as cli


@pytest.fixture
def no_load(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("the model must not load for a bad argument")
    monkeypatch.setattr(cli, "_load", load)


@pytest.mark.parametrize("extra, message", [
    (["--tokens", "0"], "--tokens must be >= 1, got 0"),
    (["--ttt-steps", "0"], "--ttt-steps must be >= 1, got 0"),
    (["--lr", "-1"], "--lr must be > 0, got -1.0"),
    (["--time-limit", "0"], "--time-limit must be > 0 seconds, got 0.0"),
    (["--held-out-tokens", "0"], "--held-out-tokens must be >= 1, got 0"),
    (["--distill-batch", "-2"], "--distill-batch must be >= 1, got -2"),
    (["--init", "embedded", "--draft-vocab", "4096"], "--init takes the head's shape from the head it starts "
                                                      "from: drop --draft-vocab"),
    (["--init", "/nonexistent/head"], "--init /nonexistent/head: no trained head there (config.json + "
                                      "head.safetensors, written by `verispec train-head`)"),
])
def test_train_head_bad_arguments(no_load, capsys, tmp_path, extra, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["train-head", "--out", str(tmp_path)] + extra)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"verispec: error: {message}"]


def test_train_head_resume_without_a_run(no_load, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.main(["train-head", "--out", str(tmp_path), "--resume"])
    assert e.value.code == 2
    assert "no run to continue" in capsys.readouterr().err


def test_draft_head_that_is_not_a_head_directory(monkeypatch, capsys, tmp_path):
    from fakes import FakeModel

    monkeypatch.setattr(cli, "_load", lambda *a, **k: FakeModel(seed=0))
    monkeypatch.setattr(cli, "_check_positions", lambda *a, **k: None)
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "abc", "--draft-head", str(tmp_path), "--max-new-tokens", "4"])
    assert e.value.code == 2
    assert "is not a feature-head directory" in capsys.readouterr().err


def test_draft_head_with_a_published_head_that_does_not_fit(monkeypatch, capsys, tmp_path):
    from fakes import FakeModel
    from test_published_heads import write_head

    monkeypatch.setattr(cli, "_load", lambda *a, **k: FakeModel(seed=0))
    monkeypatch.setattr(cli, "_check_positions", lambda *a, **k: None)
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "abc", "--draft-head", str(write_head(tmp_path / "eagle3")), "--max-new-tokens", "4"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "config.json: does not fit the target: hidden_size 32 != the target's" in err, err


def test_train_head_init_that_does_not_fit_the_model(monkeypatch, capsys, tmp_path):
    from fakes import FakeModel

    monkeypatch.setattr(cli, "_load", lambda *a, **k: FakeModel(seed=0))
    with pytest.raises(SystemExit) as e:
        cli.main(["train-head", "--out", str(tmp_path), "--init", "embedded"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("verispec: error: --init embedded: feature head does not fit this target: hidden size 576"), err


@pytest.mark.parametrize("flags, k", [(["--draft-head"], cli.HEAD_K), (["--draft-head", "-k", "5"], 5),
                                      (["--draft-lookup"], 8), (["--draft-head", "--tree", "auto"], 4)])
def test_generate_default_k_per_drafter(monkeypatch, flags, k):
    """Without -k: the head's chains draft HEAD_K (its best measured k), prompt lookup 8, the rest (tree=auto's
    longest chain included) 4; an explicit -k wins."""
    seen = {}
    monkeypatch.setattr(cli, "_run_generate", lambda args: seen.setdefault("k", args.k) and 0)
    cli.main(["generate", "hello", *flags])
    assert seen["k"] == k
