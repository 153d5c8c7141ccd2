"""`verispec serve --draft-head` (the embedded SmolLM2 and the feature head shipped for it) as a subprocess on
127.0.0.1, driven by the official ``openai`` client: it starts, its greedy chat answers equal plain decoding's
(streamed and not, several at once), the head drafts and is accepted, and a seeded sampled request gives the same
text alone and among others. Also: every drafter's ``graph_captures`` is a count (the server adds them up at its
start and stop; the head's was once a method, and `serve --draft-head` failed to start)."""
from __future__ import annotations

import concurrent.futures as cf

import pytest
import torch

from served import serve_cli
from verispec.drafters import FeatureHead, PromptLookup, SelfSpeculative
from verispec.drafters.base import Drafter

NAME = "SmolLM2-135M-Instruct"
QUESTIONS = ["Explain glaciers to a ten-year-old.", "Why do owls hunt at night?"]


def test_every_drafters_graph_captures_is_a_count():
    for drafter in (Drafter(), PromptLookup(), SelfSpeculative(2), FeatureHead()):
        assert isinstance(drafter.graph_captures, int), type(drafter).__name__


@pytest.fixture(scope="module")
def base():
    pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from verispec.runtime.loading import embedded_gguf_path

    try:
        embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with serve_cli(["--draft-head", "-k", "2", "--max-batch-size", "4", "--max-seq-len", "256", "--threads", "1",
                    "--device", "cpu"]) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(base):
    import openai

    return openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def plain():
    from verispec.engine import generate
    from verispec.runtime import load_model

    torch.set_num_threads(1)
    model = load_model(device="cpu", dtype=torch.float32)
    return {q: generate(model, q, drafter=None, max_new_tokens=16, chat=True).text for q in QUESTIONS}


def _chat(client, question: str, stream: bool, **kw):
    messages = [{"role": "user", "content": question}]
    if not stream:
        out = client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, **kw)
        return out.choices[0].message.content, out.choices[0].model_extra.get("speculative_decoding_stats")
    chunks = list(client.chat.completions.create(model=NAME, messages=messages, max_tokens=16, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].choices[0].model_extra.get("speculative_decoding_stats")


def test_greedy_answers_equal_plain_decoding_alone_and_together(client, plain):
    for q in QUESTIONS:
        text, stats = _chat(client, q, stream=False, temperature=0)
        assert text == plain[q]
        assert stats["draft_tokens_proposed"] > 0 and stats["draft_tokens_accepted"] > 0, stats
    with cf.ThreadPoolExecutor(4) as pool:
        jobs = [(q, s) for q in QUESTIONS for s in (False, True)]
        got = list(pool.map(lambda job: _chat(client, job[0], job[1], temperature=0)[0], jobs))
    assert got == [plain[q] for q, _ in jobs]


def test_a_seeded_sampled_answer_does_not_depend_on_the_others(client):
    kw = dict(temperature=0.8, top_p=0.9, seed=4242)
    alone = _chat(client, QUESTIONS[0], stream=False, **kw)[0]
    with cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_chat, client, QUESTIONS[0], False, **kw)]
        futures += [pool.submit(_chat, client, q, True, temperature=0) for q in QUESTIONS]
        assert futures[0].result()[0] == alone
