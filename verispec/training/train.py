"""``verispec train-head``: train a feature head for a target by self-distillation (distill.py's corpus) with
EAGLE-3's training-time test (``HeadNet.unrolled``: ``ttt_steps`` draft steps per entry, each on the head's own
previous outputs).

Loss: for entry j (target states at j, token t_{j+1}) and step s, the cross-entropy of the head's distribution
against the target's own next-token distribution at position j + 1 (softmax of its logits: soft labels), over the
entries with a chain (j >= s), weighted 0.8^s (EAGLE-3's decay); mean over the batch's entries. With a draft
vocabulary (``draft_vocab``: the Vd ids the target predicts most often in the corpus, ``draft_ids``) both
distributions are over those ids only, which makes every step about V / Vd times cheaper in the LM head.

The loss and the metrics cover the answers' positions only (what drafting predicts; a chat template's prompt tokens
are nearly free to predict and would inflate them).
Held-out metrics (prompts on topics the training never sees, prompts.py): the loss, and ``acc_s``, how often step
s's argmax equals the target's (the chance a greedy draft at depth s + 1 is accepted once the drafts before it
were), and ``tau`` = 1 + acc_0 + acc_0 acc_1 + ... (tokens per round a chain of ``ttt_steps`` drafts would emit,
treating the depths as independent).

Files in ``out``: the head (config.json + head.safetensors, usable at every checkpoint), ``train_state.pt``
(optimizer, step, metrics: ``resume``), ``corpus.pt`` (the distilled data, reused by any later run in ``out``
recording the same layers: delete it to distill again). Batches are a
function of (seed, step), so a resumed run takes the same steps an uninterrupted one would.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..drafters.head_net import HeadConfig, HeadNet
from ..runtime.transformer import rms_norm
from .distill import Corpus, distill, target_argmax
from .prompts import prompt_ids

STEP_DECAY = 0.8


@dataclass(frozen=True)
class TrainConfig:
    out: str                          # directory of the head, its training state and its corpus
    tokens: int = 20000               # training corpus size (prompt + answer tokens) to distill
    held_out_tokens: int = 2000       # held-out corpus size
    distill_batch: int | None = None  # prompts answered at once while distilling; None = distill's default
    steps: int | None = None          # optimizer steps; None = 3 passes over the corpus
    batch_tokens: int = 2048          # tokens per batch (whole sequences, at least one)
    max_new_tokens: int = 96          # answer length per prompt
    ttt_steps: int = 3                # unrolled draft steps per entry (training-time test)
    lr: float = 1e-3                  # peak AdamW learning rate (20-step warm-up, cosine to 10%)
    weight_decay: float = 0.0
    eval_every: int = 50              # steps between held-out evaluations (and checkpoints)
    checkpoint_s: float = 60.0        # also checkpoint when this many seconds passed since the last one
    seed: int = 0
    resume: bool = False              # continue from ``out``'s train_state.pt and corpus.pt
    time_limit_s: float | None = None # stop (with a checkpoint) once training ran this long; --resume continues
    max_run_steps: int | None = None  # stop (with a checkpoint) after this many steps in this call
    intermediate_size: int | None = None   # the head's MLP width; None = the target's
    save_dtype: str | None = None     # the head file's float dtype ("bfloat16", ...); None = fp32 (training's)
    draft_vocab: int | None = None    # Vd: its own LM head over the Vd ids the target predicts most often in the
                                      # training corpus (d2t), initialized from the target's rows; None = shared
    init_from: str | None = None      # a trained head's directory to start from (its shape and draft vocabulary
                                      # replace intermediate_size / draft_vocab); None = a fresh head


def _batches(corpus: Corpus, batch_tokens: int, seed: int, step: int) -> list[int]:
    """The sequence indices of ``step``'s batch: a seeded permutation per pass, cut into runs of about
    ``batch_tokens`` tokens (a pure function of (corpus, batch_tokens, seed, step): resume takes the same ones)."""
    sizes = [t.numel() for t in corpus.tokens]
    per_pass = max(1, sum(sizes) // max(batch_tokens, 1))
    epoch, index = divmod(step, per_pass)
    order = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)).tolist()
    batches, cur, n = [], [], 0
    for i in order:
        cur.append(i)
        n += sizes[i]
        if n >= batch_tokens:
            batches.append(cur)
            cur, n = [], 0
    if cur:
        batches.append(cur)
    return batches[index % len(batches)]


def _pad(corpus: Corpus, idx: list[int]):
    """tokens [B, T], states [B, T, C + 1, E], valid [B, T] bool (the answer's positions: the loss and the metrics
    cover what drafting predicts, not the prompt's chat template), top [B, T] for sequences ``idx``
    (right-padded)."""
    T = max(corpus.tokens[i].numel() for i in idx)
    dev = corpus.tokens[idx[0]].device
    tokens = torch.zeros(len(idx), T, dtype=torch.long, device=dev)
    states = torch.zeros(len(idx), T, *corpus.states[idx[0]].shape[1:], dtype=corpus.states[idx[0]].dtype, device=dev)
    valid = torch.zeros(len(idx), T, dtype=torch.bool, device=dev)
    top = torch.zeros(len(idx), T, dtype=torch.long, device=dev)
    for b, i in enumerate(idx):
        n = corpus.tokens[i].numel()
        start = corpus.prompt_len[i] if corpus.prompt_len else 0
        tokens[b, :n], states[b, :n], valid[b, start:n] = corpus.tokens[i], corpus.states[i], True
        top[b, :n] = corpus.top[i]
    return tokens, states, valid, top


def draft_ids(corpus: Corpus, size: int, vocab: int) -> torch.Tensor:
    """The ``size`` target ids the target predicts (argmax) most often in ``corpus`` (ties and unseen ids: the
    lowest ids first), ascending: the head's d2t map."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for t in corpus.top:
        counts += torch.bincount(t.cpu(), minlength=vocab)
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))[:size]
    return torch.tensor(sorted(order), dtype=torch.long, device=corpus.top[0].device)


def _lm_head(target):
    """The target's LM head in fp32 (the head trains in fp32; a bf16 target's head is cast once per call)."""
    w = target.net.lm_head_weight
    return w.float() if isinstance(w, torch.Tensor) and w.dtype != torch.float32 else w


def _step_logits(net: HeadNet, out, lm_head):
    """The head's logits at one unrolled step over its own vocabulary: [..., Vd] with a draft vocabulary (its ids
    map to the target's through ``net.d2t``; no V-wide tensor), else [..., V] through the target's LM head."""
    if net.lm_head is not None:
        return F.linear(rms_norm(out, net.norm, net.cfg.rms_norm_eps), net.lm_head)
    return net.logits(out, lm_head)


def _unrolled(net: HeadNet, target, tokens, states, valid, steps: int):
    """The head's ``steps`` unrolled draft steps over one padded batch (module docstring) -> [(mask [B, T-1], out
    [B, T-1, E])]: entry j of step s is live where t_{j+1} is a real answer token and j >= s."""
    C = len(net.cfg.target_layers)
    outs = net.unrolled(net.fuse(states[:, :-1, :C].float()), tokens[:, 1:], target.net.embed, steps)
    live = valid[:, 1:]                                                                        # [B, T-1]
    j = torch.arange(live.shape[1], device=tokens.device)
    return [(live & (j >= s)[None], out) for s, out in enumerate(outs)]


def losses(net: HeadNet, target, tokens, states, valid, top, steps: int, lm_head=None):
    """(loss, per-step [matches, entries]) of one padded batch (module docstring). Entry j of row b uses states[b,
    j, :C] and token t_{j+1}, target distribution softmax(logits at j + 1); entries j = 0..T-2 where t_{j+1} is
    real and an answer token (valid[j + 1]: the first drafted token is the answer's second, predicted by entry
    P - 1). ``top`` [B, T]: the target's argmax at each position (what a greedy draft must match). With a draft
    vocabulary the target's distribution is taken over the draft ids only (renormalized: the head cannot draft
    the others) and the head's logits stay [.., Vd] (no V-wide tensor: the point of a draft vocabulary)."""
    C = len(net.cfg.target_layers)
    p_top = top[:, 1:]
    lm_head = _lm_head(target) if lm_head is None else lm_head
    draft = net.lm_head is not None
    with torch.no_grad():
        last = states[:, 1:, C].float()
        if draft:   # the target's logits over the draft ids only
            h = rms_norm(last, target.net.norm.float(), target.config.rms_norm_eps)
            p_logits = F.linear(h, lm_head[net.d2t])                                          # [B, T-1, Vd]
        else:
            p_logits = target.net.logits(states[:, 1:, C]).float()                             # [B, T-1, V]
        p = torch.softmax(p_logits, dim=-1)
    total, weight, counts = 0.0, 0.0, []
    for s, (mask, out) in enumerate(_unrolled(net, target, tokens, states, valid, steps)):
        q_logits = _step_logits(net, out, lm_head)                                             # [B, T-1, Vd or V]
        logq = torch.log_softmax(q_logits.float(), dim=-1)
        ce = -(p * logq).sum(-1)                                                               # [B, T-1]
        n = mask.sum().clamp(min=1)
        total = total + STEP_DECAY ** s * (ce * mask).sum() / n
        weight += STEP_DECAY ** s
        guess = logq.argmax(-1)
        if draft:
            guess = net.d2t[guess]
        hits = ((guess == p_top) & mask).sum()
        counts.append((hits, mask.sum()))
    return total / weight, counts


@torch.no_grad()
def evaluate(net: HeadNet, target, corpus: Corpus, steps: int, batch_tokens: int) -> dict:
    """Held-out loss, acc per step and tau over the whole corpus (module docstring)."""
    net.eval()
    loss_sum, n_batches = 0.0, 0
    hits, seen = [0] * steps, [0] * steps
    batch, size, chunks = [], 0, []
    for i in range(len(corpus.tokens)):
        batch.append(i)
        size += corpus.tokens[i].numel()
        if size >= batch_tokens:
            chunks.append(batch)
            batch, size = [], 0
    if batch:
        chunks.append(batch)
    lm_head = _lm_head(target)
    for idx in chunks:
        loss, counts = losses(net, target, *_pad(corpus, idx), steps, lm_head)
        loss_sum += float(loss)
        n_batches += 1
        for s, (h, m) in enumerate(counts):
            hits[s] += int(h)
            seen[s] += int(m)
    net.train()
    acc = [h / max(m, 1) for h, m in zip(hits, seen)]
    tau, run = 1.0, 1.0
    for a in acc:
        run *= a
        tau += run
    return {"loss": loss_sum / max(n_batches, 1), "acc": acc, "tau": tau}


@torch.no_grad()
def top_w_coverage(net: HeadNet, target, corpus: Corpus, steps: int, max_width: int,
                   batch_size: int = 16) -> tuple[list[list[float]], int]:
    """How often the target's next token (its argmax) is among the head's ``w`` most likely tokens at unrolled step
    s, over ``corpus``'s answer positions: ([steps][max_width] coverage, w = 1..max_width; the entries of step 0).
    Step s, width 1 is ``evaluate``'s acc_s; width w is what a tree node of w children covers at depth s + 1
    (module docstring: the states and inputs as in training)."""
    vocab = net.cfg.draft_vocab or target.config.vocab_size
    if not 1 <= max_width <= vocab:
        raise ValueError(f"max_width must be in [1, {vocab}] (the head's vocabulary), got {max_width}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    training = net.training
    net.eval()
    lm_head = _lm_head(target)
    device = target.device
    hits = torch.zeros(steps, max_width, dtype=torch.long, device=device)   # read back once, at the end
    seen = torch.zeros(steps, dtype=torch.long, device=device)
    for start in range(0, len(corpus.tokens), batch_size):
        tokens, states, valid, top = _pad(corpus, list(range(start, min(start + batch_size, len(corpus.tokens)))))
        p_top = top[:, 1:]
        for s, (mask, out) in enumerate(_unrolled(net, target, tokens, states, valid, steps)):
            ids = _step_logits(net, out, lm_head).topk(max_width, dim=-1).indices             # [B, T-1, W]
            if net.lm_head is not None:
                ids = net.d2t[ids]
            covered = (ids == p_top[..., None]).cumsum(-1) > 0                                 # covered by the top w
            hits[s] += (covered & mask[..., None]).sum(dim=(0, 1))
            seen[s] += mask.sum()
    net.train(training)
    seen_host = seen.tolist()
    return [[h / max(n, 1) for h in row] for row, n in zip(hits.tolist(), seen_host)], seen_host[0]


def _lr(cfg: TrainConfig, step: int, total: int) -> float:
    warm = min(20, max(total // 10, 1))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    t = (step - warm) / max(total - warm, 1)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(t, 1.0))))


def _corpora(target, cfg: TrainConfig, layers, out: Path, log) -> tuple[Corpus, Corpus]:
    """(train, held-out) corpora: ``out``/corpus.pt when it exists for these layers (a resumed run, or a new run
    over data distilled before: delete the file to distill again), else distilled now and saved there."""
    path = out / "corpus.pt"
    if path.is_file():
        d = torch.load(path, map_location=target.device)
        if tuple(d["train"]["layers"]) == tuple(layers):
            log(f"corpus: {path} (reused; delete it to distill again)")
            return tuple(_corpus_from(d[k], target) for k in ("train", "held"))
        log(f"corpus: {path} was recorded for layers {d['train']['layers']}, not {list(layers)}: distilling again")
    corpora = []
    for split, budget in (("held-out", cfg.held_out_tokens), ("train", cfg.tokens)):
        prompts = prompt_ids(target, split)
        per_prompt = cfg.max_new_tokens + sum(len(p) for p in prompts) / max(len(prompts), 1)
        need = max(2, math.ceil(budget / per_prompt * 1.1))
        prompts = (prompts * math.ceil(need / len(prompts)))[:need]   # past the prompts: more sampled answers
        t0 = time.perf_counter()
        corpus = distill(target, prompts, layers, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                         batch_size=cfg.distill_batch,
                         progress=lambda n, s=split: log(f"distill {s}: {n} tokens", transient=True))
        log(f"distill {split}: {len(corpus.tokens)} sequences, {corpus.num_tokens} tokens in "
            f"{time.perf_counter() - t0:.0f} s")
        corpora.append(corpus)
    held, train = corpora
    torch.save({k: {"layers": list(c.layers), "tokens": [t.cpu() for t in c.tokens],
                    "states": [s.cpu() for s in c.states], "top": [t.cpu() for t in c.top],
                    "prompt_len": list(c.prompt_len)}
                for k, c in (("train", train), ("held", held))}, path)
    return train, held


def _corpus_from(d: dict, target) -> Corpus:
    corpus = Corpus(tuple(d["layers"]), d["tokens"], d["states"], d.get("top") or [], d.get("prompt_len") or [])
    if not corpus.top:   # a corpus saved without the argmax: recompute it from the last-layer states
        corpus.top = [target_argmax(target, s[:, -1]) for s in corpus.states]
    return corpus


def _initial_head(target, directory: str) -> HeadNet:
    """The trained head in ``directory`` (``TrainConfig.init_from``), checked against ``target``, in fp32."""
    from ..drafters.feature_head import FeatureHead

    head = FeatureHead(directory)
    head.check_fits(target)
    return head.net.float()


def train_head(target, cfg: TrainConfig, *, head_config: HeadConfig | None = None, log=None) -> dict:
    """Distill (or reuse) the corpus, train the head, write ``cfg.out``; returns the final held-out metrics (with
    "untrained": the metrics of the head before its first step: a fresh head's, or ``init_from``'s head's)."""
    log = log or (lambda msg, transient=False: None)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "train_state.pt"
    if cfg.resume and not state_path.is_file():
        raise FileNotFoundError(f"--resume: {state_path} does not exist (no run to continue in {out})")
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True   # the head trains in fp32; TF32 matmuls on a GPU are plenty
    vocab = cfg.draft_vocab if cfg.draft_vocab and cfg.draft_vocab < target.config.vocab_size else None
    # a resumed run of an init_from run takes its shape from the same head (its state replaces the weights below)
    start = _initial_head(target, cfg.init_from) if cfg.init_from else None
    hc = start.cfg if start is not None else head_config or HeadConfig.for_target(
        target.config, intermediate_size=cfg.intermediate_size, draft_vocab=vocab)
    train, held = _corpora(target, cfg, hc.target_layers, out, log)
    device = target.device
    net = HeadNet(hc).to(device)
    net.reset_parameters(cfg.seed)
    if start is not None and not cfg.resume:
        net.load_state_dict(start.state_dict())
        log(f"starting from the head in {cfg.init_from} (its draft vocabulary and weights)")
    elif net.lm_head is not None:
        d2t = draft_ids(train, hc.draft_vocab, target.config.vocab_size)
        with torch.no_grad():
            net.d2t.copy_(d2t)
            net.lm_head.copy_(_lm_head(target)[d2t].float())
        covered = sum(int(torch.isin(t, d2t).sum()) for t in held.top) / max(held.num_tokens, 1)
        log(f"draft vocabulary: {hc.draft_vocab} ids cover {covered:.1%} of the held-out greedy next tokens")
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    per_pass = max(1, train.num_tokens // cfg.batch_tokens)
    total = cfg.steps if cfg.steps is not None else 3 * per_pass
    step, history, untrained = 0, [], None
    if cfg.resume:
        st = torch.load(state_path, map_location=device)
        net.load_state_dict(st["net"])
        opt.load_state_dict(st["opt"])
        step, history, untrained = st["step"], st["history"], st.get("untrained")
        log(f"resume at step {step}")
    else:
        untrained = evaluate(net, target, held, cfg.ttt_steps, cfg.batch_tokens)
        log(f"{'before training' if start is not None else 'untrained'}: held-out loss {untrained['loss']:.3f}, "
            f"acc0 {untrained['acc'][0]:.3f}")

    def checkpoint(metrics: dict | None) -> None:
        summary = {"step": step, "steps": total, "train_tokens": train.num_tokens, "held_out": metrics,
                   "untrained": untrained, "config": {k: v for k, v in asdict(cfg).items() if k != "resume"}}
        net.save(out, extra={"training": summary},
                 dtype=getattr(torch, cfg.save_dtype) if cfg.save_dtype else None)
        torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step, "history": history,
                    "untrained": untrained}, state_path)

    metrics = history[-1]["held_out"] if history else None
    started = last_ckpt = time.perf_counter()
    first_step = step
    bar = _progress(total, step)
    lm_head = _lm_head(target)
    net.train()
    while step < total:
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step, total)
        loss, counts = losses(net, target, *_pad(train, _batches(train, cfg.batch_tokens, cfg.seed, step)),
                              cfg.ttt_steps, lm_head)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        step += 1
        acc0 = float(counts[0][0]) / max(float(counts[0][1]), 1.0)
        stop = (cfg.max_run_steps is not None and step - first_step >= cfg.max_run_steps) or (
            cfg.time_limit_s is not None and time.perf_counter() - started >= cfg.time_limit_s)
        done = step == total or stop
        if step % cfg.eval_every == 0 or done:
            metrics = evaluate(net, target, held, cfg.ttt_steps, cfg.batch_tokens)
            history.append({"step": step, "train_loss": loss.item(), "held_out": metrics})
        bar.update(loss=loss.item(), acc0=acc0, held=metrics)
        if step % cfg.eval_every == 0 or done or time.perf_counter() - last_ckpt > cfg.checkpoint_s:
            checkpoint(metrics)
            last_ckpt = time.perf_counter()
        if stop:
            log(f"stopped at step {step} of {total} (resume with --resume)")
            break
    bar.close()
    if not (out / "head.safetensors").is_file():   # a run that had nothing left to do still leaves a head
        checkpoint(metrics)
    return {**(metrics or {}), "untrained": untrained, "step": step}


class _progress:
    """A tqdm bar (loss, step-0 accuracy on the batch, held-out acc0 and tau) when tqdm is installed, else nothing."""

    def __init__(self, total: int, start: int):
        try:
            from tqdm import tqdm
        except ImportError:
            self.bar = None
            return
        self.bar = tqdm(total=total, initial=start, desc="train-head", unit="step", dynamic_ncols=True)

    def update(self, loss: float, acc0: float, held: dict | None) -> None:
        if self.bar is None:
            return
        post = {"loss": f"{loss:.3f}", "acc0": f"{acc0:.2f}"}
        if held:
            post.update(held_loss=f"{held['loss']:.3f}", held_acc0=f"{held['acc'][0]:.2f}", tau=f"{held['tau']:.2f}")
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
