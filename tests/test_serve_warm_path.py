"""``warm_request_path`` (serve/app.py): before the port opens, the HTTP side of a chat and a completion request
runs once without the engine (the first wave of requests after startup paid that one-time work for its first
token), and a tokenizer that cannot serve one of the two (no chat template) leaves the server starting."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from fakes import FakeTokenizer  # noqa: E402
from verispec.serve.app import ServedModel, warm_request_path  # noqa: E402


class CountingTokenizer(FakeTokenizer):
    def __init__(self, chat: bool = True):
        super().__init__()
        self.calls = {"encode": 0, "decode": 0, "chat": 0}
        self.chat = chat

    def encode(self, text):
        self.calls["encode"] += 1
        return super().encode(text)

    def decode(self, ids):
        self.calls["decode"] += 1
        return super().decode(ids)

    def apply_chat_template(self, messages, add_generation_prompt=True):
        if not self.chat:
            raise ValueError("this tokenizer has no chat template")
        self.calls["chat"] += 1
        return super().apply_chat_template(messages, add_generation_prompt)


def test_the_request_path_runs_once_for_chat_and_completions():
    tok = CountingTokenizer()
    warm_request_path(ServedModel("m", tok, 40, 64, 1))
    assert tok.calls["chat"] == 1 and tok.calls["encode"] >= 1 and tok.calls["decode"] >= 1


def test_a_tokenizer_without_a_chat_template_still_warms_completions():
    tok = CountingTokenizer(chat=False)
    warm_request_path(ServedModel("m", tok, 40, 64, 1))
    assert tok.calls["encode"] >= 1


def test_build_app_warms_the_path_and_leaves_the_metrics_at_zero():
    from verispec.serve.app import build_app
    from verispec.serve.metrics import Metrics

    tok, metrics = CountingTokenizer(), Metrics("m")
    before = metrics.render()
    build_app(engine=None, served=ServedModel("m", tok, 40, 64, 1), metrics=metrics)
    assert tok.calls["chat"] == 1
    assert metrics.render() == before                # no request, error or token counted
