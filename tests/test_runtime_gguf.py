"""The embedded SmolLM2-135M-Instruct GGUF: loads, tokenizes, and greedy-decodes exactly like a transformers
LlamaForCausalLM built from the same dequantized weights (no hub access)."""
import pytest
import torch

from verispec.runtime import load_model
from verispec.runtime.loading import to_transformers, unpermute_qk

PROMPT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
NUM_NEW = 24


@pytest.fixture(scope="module")
def smol():
    try:
        return load_model(None, device="cpu")
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_config_and_eos(smol):
    c = smol.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and smol.dtype == torch.float32
    tok = smol.tokenizer
    assert tok.eos_token_ids == [2] and tok.token_to_id("<|im_end|>") == 2
    assert tok.vocab_size == 49152


def test_tokenizer_round_trip_and_specials(smol):
    tok = smol.tokenizer
    text = "Hello, world! Numbers 12345 and ünïcödé — ok?\n  indented"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids[0] != 1                                             # SmolLM2 adds no BOS
    assert len(tok.encode("12345")) == 5                           # smollm pre-tokenizer: one token per digit
    assert tok.encode("<|im_start|>user") [0] == 1                 # special tokens are matched whole
    chat = tok.apply_chat_template(PROMPT)
    assert chat[0] == 1 and tok.decode(chat[-3:], skip_special_tokens=False).endswith("assistant\n")


def test_unpermute_inverts_llama_cpp_permute():
    w = torch.randn(4 * 8, 5)                                      # 4 heads of D=8
    permuted = w.reshape(4, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)  # convert_hf_to_gguf.permute
    torch.testing.assert_close(unpermute_qk(permuted, 4), w)


def test_greedy_matches_transformers_reference(smol):
    pytest.importorskip("transformers")
    ref = to_transformers(smol.net)

    ids = smol.tokenizer.apply_chat_template(PROMPT)
    # ours: prefill + decode loop over the static cache
    smol.setup_cache(1, len(ids) + NUM_NEW)
    logits = smol.prefill([ids])
    with torch.no_grad():
        ref_logits = ref(torch.tensor([ids])).logits[0, -1]
    assert ((logits[0] - ref_logits).abs().max() / ref_logits.abs().max()) < 1e-4
    ours = []
    for _ in range(NUM_NEW):
        nxt = logits.argmax(-1)                                    # [1]
        ours.append(int(nxt))
        if ours[-1] in smol.tokenizer.eos_token_ids:
            break
        logits = smol.decode(nxt[:, None])[:, 0]
    # reference: transformers' own greedy loop (its DynamicCache), stopping at the same EOS
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=NUM_NEW, do_sample=False, eos_token_id=2, pad_token_id=2)
    theirs = out[0, len(ids):].tolist()
    assert ours == theirs[: len(ours)] and len(ours) >= 5
    text = smol.tokenizer.decode(ours)
    assert "Paris" in text and text.isascii() and " the " in f" {text.lower()} ", text
