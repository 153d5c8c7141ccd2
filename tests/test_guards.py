"""verispec.engine.guards: each check refuses what it must (naming the argument) and passes what it must;
ModelLease refuses a second concurrent user; DraftModel(target) drafts exactly (its own cache)."""
from __future__ import annotations

import threading

import pytest
import torch

from fakes import FakeModel, FakeTokenizer, greedy_reference
from verispec.drafters import DraftModel, PromptLookup, SelfSpeculative
from verispec.engine import SpeculativeDecoder
from verispec.engine.guards import (ModelLease, check_drafter, check_k, check_max_new_tokens, check_prompt,
                                    check_prompts, check_same_model, check_sampling, check_stop)

TOK = FakeTokenizer(40)


# ------------------------------------------------------------------------------------------ prompts
def test_prompt_kinds_give_token_ids():
    assert check_prompt("ab", None, 40, TOK) == [0, 1]
    assert check_prompt(b"ab", None, 40, TOK) == [0, 1]
    assert check_prompt([3, 4], None, 40, TOK) == [3, 4]
    assert check_prompt(torch.tensor([3, 4]), None, 40, TOK) == [3, 4]
    assert check_prompt([torch.tensor(5)], None, 40, TOK) == [5]
    assert check_prompt("ab", 0, 40, TOK, chat=True) == TOK.apply_chat_template([{"role": "user", "content": "ab"}])


@pytest.mark.parametrize("prompt, index, error, match", [
    (None, None, TypeError, "prompt is None"),
    ("", 1, ValueError, "prompt 1 is an empty string"),
    ([], 2, ValueError, "prompt 2 is empty"),
    (torch.zeros(2, 3, dtype=torch.long), None, ValueError, "2-D tensor"),
    (torch.tensor([1.0, 2.0]), None, TypeError, "integer token ids"),
    ([1, 2.5], 0, TypeError, "token ids must be integers, got 2.5"),
    ([1, True], 0, TypeError, "token ids must be integers"),
    ([1, 99], 3, ValueError, r"prompt 3: token ids must be in \[0, 40\)"),
    ([-1], None, ValueError, r"must be in \[0, 40\)"),
    (b"a\xffb", 0, ValueError, "prompt 0 is not valid UTF-8: byte 0xff at offset 1"),
    ("a\udcffb", None, ValueError, "prompt is not valid UTF-8 text: byte 0xff at character 1"),
    (3.5, None, TypeError, "must be a string"),
])
def test_bad_prompts(prompt, index, error, match):
    with pytest.raises(error, match=match):
        check_prompt(prompt, index, 40, TOK)


def test_text_without_a_tokenizer_is_refused():
    with pytest.raises(ValueError, match="no tokenizer"):
        check_prompt("ab", None, 40, None)


def test_batches_name_the_bad_index():
    assert check_prompts(["ab", [3]], 40, TOK) == ([[0, 1], [3]], True)
    assert check_prompts([3, 4], 40, TOK) == ([[3, 4]], False)
    assert check_prompts(torch.tensor([3, 4]), 40, TOK) == ([[3, 4]], False)
    with pytest.raises(ValueError, match="prompt 1 is an empty string"):
        check_prompts(["hello", ""], 40, TOK)
    with pytest.raises(ValueError, match="empty list"):
        check_prompts([], 40, TOK)
    with pytest.raises(ValueError, match="2-D tensor"):
        check_prompts(torch.zeros(2, 3, dtype=torch.long), 40, TOK)


# ------------------------------------------------------------------------------------------ settings
def test_sampling_accepts_scalars_lists_and_defaults():
    s = check_sampling([0.0, 0.7], None, [None, 0.9], 2**64 - 1, 2)
    assert s.temperature == (0.0, 0.7) and s.top_k == (0, 0) and s.top_p == (1.0, 0.9)
    assert s.seed == (-1, 0)                # the same 64 bits as 2**64 - 1; sequence b gets seed + b (wrapped)
    assert check_sampling(1.0, 5, None, None, 3).top_k == (5, 5, 5)
    drawn = check_sampling(0.0, None, None, None, 2).seed
    assert isinstance(drawn[0], int) and drawn[1] == drawn[0] + 1


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(temperature=float("nan")), ValueError, "temperature must be finite"),
    (dict(temperature=float("inf")), ValueError, "temperature must be finite"),
    (dict(temperature=-0.5), ValueError, "temperature must be finite and >= 0"),
    (dict(temperature=1e-39), ValueError, "below the smallest supported"),
    (dict(temperature=1e-7), ValueError, "use 0 for greedy"),
    (dict(temperature="hot"), TypeError, "temperature must be a number"),
    (dict(temperature=[0.5, 1.0, 2.0]), ValueError, "temperature has 3 entries for a batch of 2"),
    (dict(temperature=[0.5, float("nan")]), ValueError, r"temperature\[1\]"),
    (dict(top_k=-1), ValueError, "top_k must be >= 0"),
    (dict(top_k=2.5), TypeError, "top_k must be an integer"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=float("nan")), ValueError, "top_p"),
    (dict(seed=1.5), TypeError, "seed must be an integer"),
    (dict(seed=2.0), TypeError, "seed must be an integer"),
    (dict(seed=2**70), ValueError, "seed must fit in 64 bits"),
    (dict(seed=-(2**63) - 1), ValueError, "seed must fit in 64 bits"),
    (dict(seed=True), TypeError, "seed must be an integer"),
])
def test_bad_sampling(kwargs, error, match):
    args = dict(temperature=1.0, top_k=None, top_p=None, seed=0, batch=2) | kwargs
    with pytest.raises(error, match=match):
        check_sampling(**args)


def test_stop_and_max_new_tokens():
    assert check_stop(None) == () and check_stop("x") == ("x",) and check_stop(["a", "b"]) == ("a", "b")
    with pytest.raises(TypeError, match="got 5 \\(int\\) at index 0"):
        check_stop([5])
    with pytest.raises(ValueError, match=r"stop\[1\] is an empty string"):
        check_stop(["a", ""])
    with pytest.raises(TypeError, match="stop must be a string"):
        check_stop(5)
    assert check_max_new_tokens(3) == 3
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        check_max_new_tokens(0)
    with pytest.raises(TypeError, match="max_new_tokens"):
        check_max_new_tokens(2.0)


# ------------------------------------------------------------------------------------------ drafters
def test_drafter_must_be_an_instance():
    check_drafter(None)
    check_drafter(PromptLookup())
    with pytest.raises(TypeError, match="drafter='lookup' is a string.*PromptLookup\\(\\), DraftModel"):
        check_drafter("lookup")
    with pytest.raises(TypeError, match="is a class"):
        check_drafter(PromptLookup)
    with pytest.raises(TypeError, match="wrap it as drafter=DraftModel\\(model\\)"):
        check_drafter(FakeModel())
    with pytest.raises(TypeError, match="got a name"):
        DraftModel("smollm2-135m")
    with pytest.raises(TypeError, match="needs a loaded model"):
        DraftModel(42)
    with pytest.raises(TypeError, match="number of layers"):
        SelfSpeculative("2")


def test_k_is_capped_with_a_note():
    assert check_k(4, 100, 10, 4096) == (4, None)
    k, note = check_k(1000, 10, 5, 4096)
    assert k == 9 and "k=1000 capped to 9" in note and "max_new_tokens" in note
    k, note = check_k(200, 300, 3700, 4096)
    assert k == 4096 - 3700 - 300 - 1 and "positions" in note
    with pytest.raises(ValueError, match="max_position_embeddings 4096"):
        check_k(4, 100, 4000, 4096)
    with pytest.raises(ValueError, match="k must be >= 1"):
        check_k(0, 10, 1, None)
    with pytest.raises(TypeError, match="k must be an integer"):
        check_k(2.0, 10, 1, None)


def test_same_object_as_target_and_draft_is_exact():
    """DraftModel(target) drafts with a twin that owns its cache: greedy output == plain decoding."""
    model = FakeModel(seed=3)
    prompt = [1, 2, 3, 4, 5]
    drafter = DraftModel(model)
    out = SpeculativeDecoder(model, drafter, k=3).generate(prompt, max_new_tokens=20)
    assert drafter.model is not model
    assert out.tokens == greedy_reference(model, prompt, 20)
    assert out.stats.accepted == out.stats.proposed   # the draft is the target itself: every draft accepted
    check_same_model(model, drafter)                  # no longer shares the target's cache


def test_shared_cache_backstop():
    model = FakeModel()

    class Sharing(PromptLookup):
        pass

    d = Sharing()
    d.model = model
    with pytest.raises(ValueError, match="share one KV cache.*truncated"):
        check_same_model(model, d)


# ------------------------------------------------------------------------------------------ ownership
def test_lease_refuses_a_second_user_and_is_released():
    model, other = FakeModel(), FakeModel()
    with ModelLease(model, None, model):
        with pytest.raises(RuntimeError, match="already generating.*one generation at a time"):
            with ModelLease(other, model):
                pass
        with ModelLease(other):          # another model is free
            pass
    with ModelLease(model):              # released on exit
        pass
    with pytest.raises(ZeroDivisionError):
        with ModelLease(model):
            1 / 0
    with ModelLease(model):              # released on an exception too
        pass


def test_lease_refuses_another_thread():
    model = FakeModel()
    entered, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold():
        with ModelLease(model):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold, name="holder")
    t.start()
    entered.wait(10)
    try:
        with ModelLease(model):
            pass
    except RuntimeError as e:
        errors.append(e)
    release.set()
    t.join()
    assert len(errors) == 1 and "thread 'holder'" in str(errors[0])
