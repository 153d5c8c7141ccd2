"""`verispec bench serve --url URL` against a real `verispec serve` subprocess on 127.0.0.1: a tiny random
model saved as an HF checkpoint without a tokenizer (so `serve --tokenizer` supplies SmolLM2's), served with the
benchmark-only `--draft oracle:0.8`. The benchmark completes every request, its percentiles are ordered, its
goodput and throughputs agree with its own counts, and the acceptance it reads from the responses is the
oracle's; the oracle's greedy output equals plain decoding of the same (peaked) model."""
from __future__ import annotations

import json
import os
import socket

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

import verispec.cli as cli  # noqa: E402
from served import serve_cli  # noqa: E402
from verispec.runtime import ModelConfig, load_model  # noqa: E402

ALPHA = 0.8
TINY = ModelConfig(vocab_size=49152, num_layers=2, hidden_size=64, num_heads=2, num_kv_heads=1, head_dim=32,
                   intermediate_size=128, tie_word_embeddings=False, max_position_embeddings=512)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """config.json + model.safetensors of a random TINY model (no tokenizer.json)."""
    from safetensors.torch import save_file

    from verispec.runtime.loading import hf_state_dict

    path = tmp_path_factory.mktemp("tiny-ckpt")
    model = load_model(TINY, device="cpu", dtype=torch.float32, seed=3)
    save_file({k: v.detach().contiguous().clone() for k, v in hf_state_dict(model.net).items()},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=TINY.vocab_size,
        num_hidden_layers=TINY.num_layers, hidden_size=TINY.hidden_size, num_attention_heads=TINY.num_heads,
        num_key_value_heads=TINY.num_kv_heads, head_dim=TINY.head_dim, intermediate_size=TINY.intermediate_size,
        rms_norm_eps=TINY.rms_norm_eps, rope_theta=TINY.rope_theta, tie_word_embeddings=False,
        max_position_embeddings=TINY.max_position_embeddings)))
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    from verispec.runtime.loading import embedded_gguf_path

    try:
        tokenizer = embedded_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with serve_cli(["--model", str(checkpoint), "--tokenizer", str(tokenizer), "--draft", f"oracle:{ALPHA}", "-k", "4",
                    "--max-batch-size", "4", "--max-seq-len", "128", "--threads", "1", "--device", "cpu"]) as (base, _):
        yield base


def test_bench_serve_measures_every_request(server, tmp_path, capsys):
    code = cli.main(["bench", "serve", "--url", server, "--num-prompts", "12", "--request-rate", "40",
                     "--burstiness", "0.5", "--max-concurrency", "4", "--random-input-len", "12",
                     "--random-output-len", "16", "--random-range-ratio", "0.5", "--goodput", "ttft:600000",
                     "e2el:600000", "--out", str(tmp_path), "--seed", "1", "--timeout", "120"])
    assert code == 0, capsys.readouterr().err
    record = json.loads((tmp_path / "bench_serve.json").read_text())
    s, requests = record["summary"], record["requests"]
    assert s["completed"] == 12 and s["failed"] == 0 and len(requests) == 12
    assert s["total_output_tokens"] == sum(r["output_tokens"] for r in requests) > 12
    assert s["total_input_tokens"] == sum(r["prompt_tokens"] for r in requests) > 0
    assert s["goodput"] == pytest.approx(s["request_throughput"])          # SLOs no request can miss
    assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration_s"])
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < s[f"p50_{name}_ms"] <= s[f"p90_{name}_ms"] <= s[f"p99_{name}_ms"], name
    assert s["p99_ttft_ms"] <= s["p99_e2el_ms"]
    spec = s["speculative"]
    assert spec["requests"] == 12 and spec["draft_tokens_proposed"] > 50
    assert 0.6 < spec["acceptance_rate_per_position"][0] < 0.95            # the oracle's alpha, 0.8
    page = (tmp_path / "bench_serve.md").read_text()
    assert "| output token throughput (tok/s) |" in page and "| TTFT |" in page and "goodput" in page


def test_oracle_output_equals_plain_decoding_of_the_peaked_model(server, checkpoint):
    from verispec.drafters import make_peaked
    from verispec.engine import generate

    client = openai.OpenAI(base_url=server + "/v1", api_key="-", max_retries=0, timeout=60)
    prompt = [5, 17, 300, 4000, 9]
    got = client.completions.create(model=os.path.basename(str(checkpoint)), prompt=prompt, max_tokens=20,
                                    temperature=0).choices[0]
    model = load_model(str(checkpoint), device="cpu", dtype=torch.float32)
    successor = make_peaked(model)
    plain = generate(model, prompt, drafter=None, max_new_tokens=20)
    assert got.token_ids == plain.tokens
    assert plain.tokens[1:] == [successor[t] for t in plain.tokens[:-1]]   # peaked: each token the successor
    assert got.speculative_decoding_stats["draft_tokens_accepted"] > 0


def test_bench_serve_refuses_bad_options_and_reports_an_unreachable_server(capsys):
    assert cli.main(["bench", "serve", "--url", "ftp://x"]) == 2
    assert cli.main(["bench", "serve", "--url", "http://127.0.0.1:1", "--goodput", "latency:5"]) == 2
    assert cli.main(["bench", "serve", "--url", "http://127.0.0.1:1", "--request-rate", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("verispec: error: bench serve: ") for line in err)
    with socket.socket() as s:                   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["bench", "serve", "--url", f"http://127.0.0.1:{port}", "--num-prompts", "1"]) == 1
    assert "cannot benchmark" in capsys.readouterr().err
