"""Hidden states from the target pass (``Model.capture_hidden``): the chosen layers' outputs for every token a
prefill, decode or verify pass scores equal those of a plain transformers forward pass over the same tokens, come
from the same pass (the passes are counted), change no logits, and cost nothing when off.

The CPU model runs the graph path's code with ``use_graphs`` forced on (padded batch rows and width buckets, the
programs run eagerly on the same buffers), so the view ``Model.hidden`` takes of the padded layout is checked too.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from verispec.runtime import ModelConfig, load_model  # noqa: E402
from verispec.runtime.loading import to_transformers  # noqa: E402
from verispec.runtime.transformer import rms_norm  # noqa: E402

CFG = ModelConfig(vocab_size=101, num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=96, rms_norm_eps=1e-6, max_position_embeddings=512)
LAYERS = (1, 0, 2)    # out of order on purpose: slot j holds layer LAYERS[j]


def tiny_model(use_graphs: bool):
    model = load_model(CFG, device="cpu", dtype=torch.float32, seed=0)
    model.use_graphs = use_graphs
    return model


def reference_states(model, tokens: list[int]) -> torch.Tensor:
    """[T, C, E]: the outputs of LAYERS for every token, from one plain transformers forward pass (its last entry
    is after the final norm, so the last layer's raw output is compared through that norm by the caller)."""
    hf = to_transformers(model.net)
    with torch.no_grad():
        hs = hf(torch.tensor([tokens], device=model.device), output_hidden_states=True).hidden_states  # N+1 x [1, T, E]
    return torch.stack([hs[layer + 1][0] for layer in LAYERS], dim=1).cpu()


def comparable(states: torch.Tensor, model) -> torch.Tensor:
    """The last layer's slot through the final norm (what transformers reports for it), the others as they are."""
    out = states.clone()
    j = LAYERS.index(CFG.num_layers - 1)
    out[:, j] = rms_norm(states[:, j], model.net.norm, CFG.rms_norm_eps)
    return out


@pytest.mark.parametrize("use_graphs", [False, True], ids=["eager", "graph-layout"])
def test_states_of_prefill_decode_and_verify_equal_a_plain_forward(use_graphs):
    model = tiny_model(use_graphs)
    model.capture_hidden(LAYERS)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 101, (n,), generator=g).tolist() for n in (7, 3, 12)]
    model.setup_cache(4, 64, empty=True)
    model.admit(prompts[:2])
    model.admit(prompts[2:])                                                   # a second admission: rows 2..
    seen = [[model.take_prompt_hidden(b)] for b in range(3)]                   # per row: [P, C, E] chunks
    histories = [list(p) for p in prompts]
    for k in (3, 1, 4, 2):                                                     # verify, decode, widths 5 and 2
        tokens = torch.randint(0, 101, (3, k), generator=g)
        model.append(tokens)
        assert model.hidden.shape == (3, k, len(LAYERS), CFG.hidden_size)
        keep = [k, 1, k - 1 if k > 1 else 1]                                   # ragged rollbacks, like rounds
        for b in range(3):
            seen[b].append(model.hidden[b, :keep[b]].clone())
            histories[b] += tokens[b, :keep[b]].tolist()
        model.rollback(model.lengths - k + torch.tensor(keep))
    for b in range(3):
        got = torch.cat(seen[b])                                               # [len, C, E]
        ref = reference_states(model, histories[b])
        assert got.shape == ref.shape
        torch.testing.assert_close(comparable(got, model), ref, rtol=1e-4, atol=1e-5)


def test_prompt_states_move_with_their_rows_and_are_handed_over_once():
    model = tiny_model(False)
    model.capture_hidden(LAYERS)
    model.setup_cache(3, 32, empty=True)
    model.admit([[1, 2, 3], [4, 5], [6, 7, 8, 9]])
    first = model.take_prompt_hidden(0)
    model.keep([2, 1])                                                         # row 2 -> 0, row 1 stays
    assert model.take_prompt_hidden(0).shape[0] == 4 and model.take_prompt_hidden(1).shape[0] == 2
    assert first.shape[0] == 3
    with pytest.raises(KeyError, match="no prompt states for row 1"):
        model.take_prompt_hidden(1)


def count_passes(model) -> dict:
    counts = {"append": 0, "prefill": 0}
    for name in counts:
        inner = getattr(model.net, name)

        def counted(*args, _inner=inner, _name=name, **kwargs):
            counts[_name] += 1
            return _inner(*args, **kwargs)
        setattr(model.net, name, counted)
    return counts


def test_capture_adds_no_pass_and_changes_no_logits():
    from verispec.drafters import PromptLookup
    from verispec.engine import generate

    runs = {}
    for capture in (False, True):
        model = tiny_model(False)
        if capture:
            model.capture_hidden(LAYERS)
        passes = count_passes(model)
        out = generate(model, [[5, 6, 7, 5, 6], [8, 9, 10, 11, 12]], drafter=PromptLookup(2, 1), k=3,
                       max_new_tokens=12)
        runs[capture] = ([o.tokens for o in out], dict(passes))
    assert runs[True] == runs[False]
    assert runs[True][1]["prefill"] == 2 and runs[True][1]["append"] > 0   # one prefill a prompt, one pass a round


@pytest.mark.parametrize("device, use_graphs", [
    ("cpu", False), ("cpu", True),
    pytest.param("cuda", True, marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the "
                                                        "tree pass's kernels in a CUDA graph writing the states")),
], ids=["eager", "graph-layout", "cuda-graphs"])
def test_a_tree_pass_writes_each_nodes_states_as_its_path_run_as_a_chain(device, use_graphs):
    """``append_tree``'s ``hidden`` [B, T, C, E]: node n's states are those of the plain forward pass over the
    history and the node's root-to-node path (a feature head reads the accepted path's nodes from it), in a batch of
    two rows with different histories (the graph path pads the rows to a bucket)."""
    model = load_model(CFG, device=device, dtype=torch.float32, seed=0)
    model.use_graphs = use_graphs
    model.capture_hidden(LAYERS)
    histories = [[5, 9, 14, 3, 8], [40, 41]]
    parents = (-1, 0, 0, 1, 3, 2)                      # the root, two children, a chain of two under node 1, ...
    tokens = torch.tensor([[8, 20, 21, 22, 23, 24], [41, 30, 31, 32, 33, 34]])   # node 0 is the root (certain)
    model.setup_cache(2, 32, empty=True)
    model.admit([h[:-1] for h in histories])
    model.append_tree(tokens.to(device), [parents, parents])
    assert model.hidden.shape == (2, len(parents), len(LAYERS), CFG.hidden_size)
    for b, history in enumerate(histories):
        for n in range(len(parents)):
            path, node = [], n
            while node > 0:
                path.insert(0, int(tokens[b, node]))
                node = parents[node]
            ref = reference_states(model, history + path)[-1:]                # [1, C, E]
            got = comparable(model.hidden[b, n:n + 1], model).cpu()
            tol = dict(rtol=1e-4, atol=2e-5) if device == "cpu" else dict(rtol=2e-3, atol=2e-3)   # GPU: TF32 matmuls
            torch.testing.assert_close(got, ref, **tol)


def test_off_by_default_and_bad_layers_are_refused():
    model = tiny_model(False)
    model.setup_cache(1, 16)
    model.prefill([[1, 2]])
    model.append(torch.tensor([[3]]))
    assert model.hidden is None and model._hidden_buf is None
    with pytest.raises(RuntimeError, match="capture_hidden"):
        model.take_prompt_hidden(0)
    for bad in ([3], [0, 0], [-1]):
        with pytest.raises(ValueError, match=r"distinct indices in \[0, 3\)"):
            model.capture_hidden(bad)


def _kernel_devices():
    import os

    from verispec.runtime import ops
    if not ops.AVAILABLE:
        return []
    return (["cuda"] if torch.cuda.is_available() else []) + (["cpu"] if os.environ.get("TRITON_INTERPRET") == "1"
                                                              else [])


@pytest.mark.parametrize("device", _kernel_devices())
def test_kernel_paths_write_the_states_of_the_torch_paths(device):
    """append_kernels / prefill_kernels (CUDA's passes; here under the Triton interpreter on a CPU) write the same
    states as the torch paths checked against transformers above."""
    import copy

    model = load_model(CFG, device=device, dtype=torch.float32, seed=0, use_graphs=False)
    net, C, E = model.net, len(LAYERS), CFG.hidden_size
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 101, (1, 9), generator=g).to(device)
    model.setup_cache(2, 32)
    states = {}
    for name in ("torch", "kernels"):
        cache = copy.deepcopy(model.cache)
        buf = torch.zeros(9, C, E, device=device)
        last = torch.tensor([8], device=device)
        if name == "torch":
            net._prefill_torch(prompt, last, model._rope[:9], cache, 3, 0, buf, LAYERS)
        else:
            net.prefill_kernels(prompt, last, model._rope, cache, 3, torch.tensor([0], device=device), buf, LAYERS)
        cache.lengths[:] = torch.tensor([9, 0], device=device)
        tokens = torch.randint(0, 101, (2, 3), generator=torch.Generator().manual_seed(3)).to(device)
        step = torch.zeros(6, C, E, device=device)
        f = net._append_torch if name == "torch" else net.append_kernels
        f(tokens, cache.lengths, model._rope, cache, 3, step, LAYERS)
        states[name] = (buf, step)
    for a, b in zip(states["kernels"], states["torch"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
