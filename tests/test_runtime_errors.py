"""Bad input to verispec.runtime gives errors that say what was wrong and what to do."""
import json

import pytest
import torch

from verispec.runtime import ModelConfig, load_model

TINY = ModelConfig(vocab_size=50, num_layers=1, hidden_size=16, num_heads=2, num_kv_heads=1, head_dim=8,
                   intermediate_size=32)


def test_unknown_shape_name():
    with pytest.raises(ValueError, match="known shapes.*llama-3.1-8b"):
        load_model("llama-9-huge", device="cpu")


def test_missing_path():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model("/nonexistent/model.gguf", device="cpu")


def test_dir_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path, device="cpu")


def test_dir_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(
        model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=50, hidden_size=16,
        intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(tmp_path, device="cpu")


def test_unknown_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(model_type="gpt2", architectures=["GPT2LMHeadModel"])))
    with pytest.raises(ValueError, match="unsupported architecture.*gpt2.*HFModel"):
        load_model(tmp_path, device="cpu")


def test_unsupported_rope_scaling():
    with pytest.raises(ValueError, match="yarn"):
        TINY.replace(rope_scaling={"rope_type": "yarn", "factor": 4.0})


@pytest.fixture
def model():
    m = load_model(TINY, device="cpu")
    m.setup_cache(2, 8)
    return m


def test_dtype_strings():
    assert load_model(TINY, device="cpu", dtype="bf16").dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        load_model(TINY, device="cpu", dtype="int3")


def test_no_cache_yet():
    with pytest.raises(RuntimeError, match="setup_cache"):
        load_model(TINY, device="cpu").prefill([[1]])


def test_prompt_longer_than_cache(model):
    with pytest.raises(ValueError, match="prompt 1 has 9 tokens > max_seq_len 8"):
        model.prefill([[1], list(range(9))])


def test_empty_prompt(model):
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        model.prefill([[], [1, 2]])


def test_wrong_number_of_prompts(model):
    with pytest.raises(ValueError, match="3 prompts but the cache holds 2"):
        model.prefill([[1], [2], [3]])


def test_cache_full(model):
    model.prefill([[1, 2, 3], [4, 5, 6, 7, 8]])
    model.append(torch.ones(2, 2, dtype=torch.long))               # 5 and 7 tokens
    model.rollback(torch.tensor([5, 5]))                             # host bound is stale (7) ...
    model.append(torch.ones(2, 3, dtype=torch.long))                 # ... but 8 still fits: exact check near the end
    with pytest.raises(ValueError, match="cache full.*max_seq_len 8"):
        model.decode(torch.ones(2, 1, dtype=torch.long))


def test_no_chat_template():
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models

    from verispec.runtime import Tokenizer
    tok = Tokenizer(HFTok(models.BPE(vocab={"a": 0}, merges=[])), eos_token_ids=[0])
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
