"""`verispec serve --stream-interval MS` over real HTTP on 127.0.0.1 with the fake model (tests/fake_server.py):
a stream's chunks then carry the tokens of several rounds, the concatenated text and ids are those of the same
request unstreamed, the first token still goes at once (its own chunk), the chunks are bounded by the stream's
duration over the interval, and a bad value is refused before anything loads."""
from __future__ import annotations

import json
import time
import urllib.request

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import verispec.cli as cli  # noqa: E402
from fake_server import NAME, running  # noqa: E402

INTERVAL_MS = 30.0


def _post(base, body, stream: bool):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps({**body, "stream": stream}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        if not stream:
            return json.loads(r.read())
        lines = [line.decode().strip() for line in r]
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def test_stream_interval_keeps_the_text_and_bounds_the_chunks():
    body = {"model": NAME, "prompt": "one two three", "max_tokens": 40, "temperature": 0}
    with running(["--max-batch-size", "1", "--pass-s", "0.004", "--stream-interval", str(INTERVAL_MS)]) as srv:
        whole = _post(srv.base, body, stream=False)["choices"][0]
        start = time.monotonic()
        chunks = _post(srv.base, body, stream=True)
        elapsed = time.monotonic() - start
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(c["text"] for c in choices) == whole["text"]
    assert [t for c in choices for t in c.get("token_ids", [])] == whole["token_ids"]
    token_chunks = [c for c in choices if c.get("token_ids") and c.get("finish_reason") is None]
    # the first chunk, then at most one per interval: 40 rounds of >= 4 ms span >= 160 ms, so the bound is below
    # 40 chunks on any machine whose rounds are shorter than the interval (rounds had to merge)
    assert len(token_chunks) <= 2 + elapsed * 1e3 / INTERVAL_MS


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_bad_stream_interval_is_refused_before_loading(capsys, monkeypatch, value):
    def no_load(*a, **kw):
        raise AssertionError("a model was loaded before the arguments were checked")
    monkeypatch.setattr("verispec.runtime.loading.load_model", no_load)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "--stream-interval", value])
    assert exit_info.value.code == 2
    assert "--stream-interval must be a finite number of milliseconds >= 0" in capsys.readouterr().err
