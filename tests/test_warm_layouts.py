"""Warm-up's verification layouts reach every Triton specialization class a round can meet (an integer argument
equal to 1, divisible by 16, or neither: each class is a separate compile, inside a request if warm-up missed it)."""
import pytest

from verispec.engine.round import warm_layouts
from verispec.verify.triton.greedy import small_block, split_vocab


def _class(x: int) -> str:
    return "one" if x == 1 else "d16" if x % 16 == 0 else "other"


def _key(rows: int, drafts: int, width: int, vocab: int) -> tuple:
    """The greedy scan kernel's specialization: its integer arguments' classes and its block sizes (H100 tiling)."""
    _, splits = split_vocab(vocab, rows, 8192, 8 * 132)
    return _class(rows), _class(drafts), _class(width), _class(splits), small_block(width), small_block(splits)


@pytest.mark.parametrize("max_batch,k,vocab", [(32, 8, 128256), (16, 4, 49152), (32, 2, 128256)])
def test_every_reachable_layout_class_is_warmed(max_batch, k, vocab):
    warmed = {_key(sum(nd) + b, sum(nd), max(nd) + 1, vocab)
              for b in range(1, max_batch + 1) for nd in warm_layouts(b, k)}
    missed = set()
    for b in range(1, max_batch + 1):
        for width in range(1, k + 2):                     # the widest row's drafts + 1
            for drafts in range(width - 1, b * (width - 1) + 1) if width > 1 else [0]:
                key = _key(drafts + b, drafts, width, vocab)
                if key not in warmed:
                    missed.add((b, drafts, width))
    assert not missed, f"layouts warm-up never compiles: {sorted(missed)[:5]}"


def test_the_uniform_layouts_alone_miss_one_draft_among_15_rows():
    # the class the H100 compiled inside a request (_greedy_scan_kernel, 15:37 and 15:55 UTC): rows 16, drafts 1
    uniform = {_key(b * (n + 1), b * n, n + 1, 49152) for b in range(1, 17) for n in range(5)}
    assert _key(16, 1, 2, 49152) not in uniform
    assert [1] + [0] * 14 in warm_layouts(15, 4)
