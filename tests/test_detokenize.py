"""Incremental detokenization (verispec/engine/detokenize.py, verispec/serve/text.py) on the real tokenizer of
the embedded SmolLM2 (byte-level BPE): the text equals decoding the whole list, on random token sequences with
multi-byte characters split across tokens and across chunks; stop strings are found at the same token and cut
at the same character as full decodes find them; and the cost per token does not grow with the length
(counted in ids passed to decode, never timed)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from verispec.engine.detokenize import WINDOW, IncrementalDetokenizer, StopScanner
from verispec.engine.request import Request, Sequence
from verispec.engine.stats import Stats
from verispec.serve.text import IncrementalText

TEXT = ("Exact speculative decoding — naïve café, déjà vu; 日本語のテキスト、中文字符 and emoji 😀🚀👩‍🔬. "
        "Ünïcödé ß ø Ω ∑ ≤ ≥ → ← ✓ «quotes» “curly” ‘single’ … ½ ¾ € £ ¥ ₹ 한국어 Ελληνικά русский العربية.\n")


@pytest.fixture(scope="module")
def tok():
    from verispec.runtime.loading import load_tokenizer

    try:
        return load_tokenizer()
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def partial_ids(tok) -> list[int]:
    """Tokens whose text alone is an incomplete or invalid UTF-8 piece (a part of a multi-byte character)."""
    ids = [i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i])]
    assert len(ids) > 100
    return ids


def random_ids(rng: random.Random, tok, partial: list[int], n: int) -> list[int]:
    """A mix of pieces of multi-byte characters, random vocabulary ids and slices of real multilingual text."""
    text_ids = tok.encode(TEXT * 3, add_special_tokens=False)
    out: list[int] = []
    while len(out) < n:
        r = rng.random()
        if r < 0.3:
            out.append(rng.choice(partial))
        elif r < 0.6:
            out.append(rng.randrange(tok.vocab_size))
        else:
            start = rng.randrange(len(text_ids))
            out += text_ids[start:start + rng.randint(1, 12)]
    return out[:n]


def chunks(rng: random.Random, ids: list[int], largest: int = 6):
    i = 0
    while i < len(ids):
        c = rng.randint(1, largest)
        yield i, ids[i:i + c]
        i += c


def test_incremental_text_equals_the_full_decode(tok, partial_ids):
    rng = random.Random(0)
    for trial in range(300):
        ids = random_ids(rng, tok, partial_ids, rng.randint(0, 120))
        d = IncrementalDetokenizer(tok.decode)
        emitted = ""
        for i, chunk in chunks(rng, ids):
            emitted += d.add(chunk)
            # what is out plus what is pending = the full decode of the tokens so far, less an incomplete end
            assert emitted + d.pending == tok.decode(ids[:i + len(chunk)]).rstrip("\ufffd"), trial
        assert emitted + d.flush() == tok.decode(ids), trial
        assert not d.whole           # the window held for this tokenizer: never fell back to whole decodes


def test_a_character_split_over_tokens_waits_for_its_last_byte(tok):
    ids = tok.encode("😀", add_special_tokens=False)
    assert len(ids) >= 2             # 4 UTF-8 bytes, more than one byte-level token
    d = IncrementalDetokenizer(tok.decode)
    assert [d.add([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert d.add(ids[-1:]) == "😀"


def reference_stop(tok, ids: list[int], stops: tuple[str, ...]) -> tuple[int, int] | None:
    """The definition: the first n such that decode(ids[:n]) contains a stop string, and where the earliest
    one starts in it (full decodes: quadratic, for the test only)."""
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n])
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            return n, min(hits)
    return None


def test_stop_strings_found_at_the_same_token_and_character_as_full_decodes(tok, partial_ids):
    rng = random.Random(1)
    found = 0
    for trial in range(150):
        ids = random_ids(rng, tok, partial_ids, rng.randint(5, 60))
        full = tok.decode(ids)
        # stop strings drawn from the text itself (so they occur, often spanning tokens and chunks), or absent
        stops = []
        for _ in range(rng.randint(1, 3)):
            a = rng.randrange(len(full))
            stops.append(full[a:a + rng.randint(1, 6)].replace("\ufffd", "") or "x")
        if rng.random() < 0.2:
            stops = ["\u2603 never here"]
        stops = tuple(stops)
        scanner, consumed, got = StopScanner(tok.decode, stops), 0, None
        for i, chunk in chunks(rng, ids):
            hit = scanner.scan(chunk)
            if hit is not None:
                got = (i + hit[0], hit[1])
                break
        assert got == reference_stop(tok, ids, stops), (trial, stops)
        found += got is not None
    assert found > 100


def test_sequence_cuts_tokens_and_text_at_the_stop_string(tok):
    ids = tok.encode("one two three four five six", add_special_tokens=False)
    eos = set(tok.eos_token_ids)
    seq = Sequence(Request(prompt=[1], max_new_tokens=100, stop=("three f",)), Stats())
    kept = []
    for i in range(0, len(ids), 3):
        chunk = ids[i:i + 3] + ([tok.eos_token_ids[0]] if i + 3 >= len(ids) else [])
        kept += seq.emit(chunk, eos, tok.decode)
        if seq.finish_reason:
            break
    n, cut = reference_stop(tok, ids, ("three f",))
    assert seq.finish_reason == "stop" and seq.generated == kept == ids[:n]
    assert seq.result(tok.decode).text == "one two "[:cut] == tok.decode(ids)[:cut]


def test_a_stop_string_before_eos_in_the_same_chunk_is_a_stop(tok):
    ids = tok.encode("alpha beta gamma", add_special_tokens=False) + [tok.eos_token_ids[0]]
    seq = Sequence(Request(prompt=[1], max_new_tokens=100, stop=("beta",)), Stats())
    seq.emit(ids, set(tok.eos_token_ids), tok.decode)
    assert seq.finish_reason == "stop" and seq.result(tok.decode).text == "alpha "


def test_streamed_text_equals_the_final_text_and_never_shows_a_stop_string(tok, partial_ids):
    rng = random.Random(2)
    for trial in range(120):
        ids = random_ids(rng, tok, partial_ids, rng.randint(1, 60))
        full = tok.decode(ids)
        a = rng.randrange(len(full)) if full else 0
        stops = (full[a:a + rng.randint(2, 5)].replace("\ufffd", "") or "zz",) if rng.random() < 0.7 else ()
        ref = reference_stop(tok, ids, stops) if stops else None
        fed = ids[:ref[0]] if ref else ids                 # the engine stops feeding at the stop's token
        text = IncrementalText(tok.decode, set(tok.eos_token_ids), stops)
        pieces = [text.add(chunk) for _, chunk in chunks(rng, fed)]
        pieces.append(text.finish(SimpleNamespace(text_cut=ref[1] if ref else None)))
        final = tok.decode(fed)[:ref[1]] if ref else tok.decode(fed)
        assert "".join(pieces) == final, trial
        assert not any(s in "".join(pieces) for s in stops), trial


def counting(tok):
    calls: list[int] = []

    def decode(ids):
        calls.append(len(ids))
        return tok.decode(ids)
    return decode, calls


def costs(tok, n: int) -> dict[str, list[int]]:
    """The lengths of the id lists decoded while n tokens arrive in chunks of 1..5, for the detokenizer, the
    engine's stop-string check (a stop string that never comes) and the server's streamed text."""
    ids = (tok.encode(TEXT, add_special_tokens=False) * (n // 20 + 1))[:n]
    out = {}
    for name in ("detokenizer", "stop check", "stream"):
        rng = random.Random(0)
        calls: list[int] = []

        def decode(ids, calls=calls):
            calls.append(len(ids))
            return tok.decode(ids)
        detok = IncrementalDetokenizer(decode)
        seq = Sequence(Request(prompt=[1], max_new_tokens=n, stop=("never in this text",)), Stats())
        text = IncrementalText(decode, set(), ("a stop",))
        for _, chunk in chunks(rng, ids, 5):
            if name == "detokenizer":
                detok.add(chunk)
            elif name == "stop check":
                seq.emit(chunk, set(), decode)
            else:
                text.add(chunk)
        out[name] = calls
    return out


def test_the_cost_per_token_does_not_grow_with_the_length(tok):
    """Each decode sees a bounded window (WINDOW ids before the new chunk, the chunk, and the tokens of a run
    of characters still incomplete), whatever the length: 4x the tokens, the same ids decoded per token.
    The old code decoded the whole list every chunk (4x the ids per token here)."""
    short, long = costs(tok, 400), costs(tok, 1600)
    for name in short:
        assert max(long[name]) <= 3 * WINDOW and max(short[name]) <= 3 * WINDOW, name
        per_token_short, per_token_long = sum(short[name]) / 400, sum(long[name]) / 1600
        assert per_token_long <= 1.1 * per_token_short, name
