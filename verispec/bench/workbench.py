"""``Workbench``: the models, prompts and measurements that the studies of one run share.

Models load on first use (a resumed run whose rows are all written loads nothing). ``memo`` keeps
measurements that several studies need (step times, AR outputs) for the rest of the process.

Drafters (``--draft``):
    lookup        PromptLookup: copies from the history (no model)
    self:L        SelfSpeculative: the target's first L layers
    oracle[:A]    OracleDraft: replays the target's own greedy output, each draft kept with probability A;
                  its passes cost those of ``draft_cost`` (a model source) when given
    SOURCE        DraftModel of a second model (HF dir, .gguf, or a shape name with random weights)
"""
from __future__ import annotations

import datetime
import platform
import sys
from dataclasses import dataclass, field

import torch

from ..drafters import DraftModel, OracleDraft, PromptLookup, SelfSpeculative
from ..runtime import load_model
from .options import BenchOptions, is_gguf_source
from .peaked import make_peaked

# Echo-heavy requests: prompt lookup finds most of the answer in the prompt (its favourable case), and the
# last one asks for free text (its unfavourable case), so the measured acceptance is a realistic mix.
TEXT_PROMPTS = (
    "Repeat this text exactly, word for word: Speculative decoding makes a large language model faster "
    "without changing what it writes. A cheap drafter guesses the next few tokens, and the model checks all "
    "the guesses in a single pass.",
    "Copy this list exactly: apples, oranges, pears, plums, cherries, grapes, lemons, limes, melons, figs, "
    "dates, kiwis, mangoes, peaches.",
    "Fix the typo and copy the rest: 'The cat sat on teh mat and looked at the dog, and the dog looked back "
    "at the cat on the mat.'",
    "Write two sentences about the sea.",
)


@dataclass
class Workbench:
    options: BenchOptions
    memo: dict = field(default_factory=dict)
    auto_policy: object = None     # (bench, k_max, batch, alpha) -> k-policy factory; None: the engine's own
    _target: object = None

    # ------------------------------------------------------------------------------ models
    @property
    def target(self):
        if self._target is None:
            o = self.options
            self._target = self._load(o.model, o.seed)
            if self.uses_oracle and self._target.tokenizer is None and self._target.net.lm_head is not None:
                # random weights: without a clear argmax, bf16 noise that differs between a verify pass and a
                # decode step splits the greedy paths and the oracle's replayed continuation stops matching
                make_peaked(self._target, seed=o.seed)
        return self._target

    @property
    def device_type(self) -> str:
        return self.options.device_type()

    @property
    def draft_name(self) -> str:
        return self.options.draft

    @property
    def uses_oracle(self) -> bool:
        return self.draft_name.startswith("oracle")

    def drafter(self, alpha: float | None = None, continuations=None, tree_rates: dict[int, float] | None = None):
        """A fresh drafter of the ``--draft`` kind, attached to the target (oracle: at ``alpha``, replaying
        ``continuations``, one token list per request id; in trees, a node of w children covers the target's token
        with probability ``tree_rates[w]``, else alpha)."""
        d = self.draft_name
        if d == "lookup":
            drafter = PromptLookup(max_ngram=3, min_ngram=1)
        elif d.startswith("self:"):
            drafter = SelfSpeculative(layers=int(d.split(":", 1)[1]))
        elif self.uses_oracle:
            drafter = OracleDraft(continuations, alpha, cost_model=self._draft_cost_model(), seed=self.options.seed,
                                  tree_rates=tree_rates)
        else:
            if "draft_model" not in self.memo:
                o = self.options
                self.memo["draft_model"] = self._load(d, o.seed + 1)
            drafter = DraftModel(self.memo["draft_model"])
        drafter.attach(self.target)
        return drafter

    def _draft_cost_model(self):
        source = self.options.draft_cost
        if source is None:
            return None
        if "draft_cost_model" not in self.memo:
            o = self.options
            self.memo["draft_cost_model"] = self._load(source, o.seed + 1)
        return self.memo["draft_cost_model"]

    def _load(self, source, seed: int):
        """A model of the run; ``--packed``: a GGUF source keeps its blocks (a random shape or HF dir loads dense)."""
        o = self.options
        return load_model(source, device=o.device, dtype=o.dtype, seed=seed, packed=o.packed and is_gguf_source(source))

    # ------------------------------------------------------------------------------ prompts
    def prompts(self, n: int) -> list[list[int]]:
        """``n`` prompts as token ids: the echo-heavy texts (chat-wrapped) for a model with a tokenizer, else
        random ids of ``prompt_len`` tokens (seeded)."""
        key = ("prompts", n)
        if key not in self.memo:
            tok = self.target.tokenizer
            if tok is not None:
                wrap = getattr(tok, "chat_template", None)
                texts = [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(n)]
                self.memo[key] = [list(tok.apply_chat_template([{"role": "user", "content": t}],
                                                               add_generation_prompt=True)) if wrap
                                  else list(tok.encode(t)) for t in texts]
            else:
                gen = torch.Generator().manual_seed(self.options.seed)
                vocab = self.target.config.vocab_size
                self.memo[key] = torch.randint(0, vocab, (n, self.options.prompt_len), generator=gen).tolist()
        return self.memo[key]

    # ------------------------------------------------------------------------------ description
    def describe_pair(self) -> str:
        o = self.options
        model = o.model or "the embedded SmolLM2-135M-Instruct"
        if not isinstance(model, str):   # a ModelConfig: random weights of that shape
            model = (f"random weights ({model.num_layers} layers, hidden {model.hidden_size}, "
                     f"vocab {model.vocab_size})")
        elif o.model is not None and "/" not in model and not model.endswith(".gguf"):
            model += " (random weights)"
        draft = {"lookup": "prompt lookup (PromptLookup, n-grams 1..3)"}.get(o.draft, o.draft)
        if o.draft.startswith("self:"):
            draft = f"self-speculation with the first {o.draft[5:]} layers"
        elif self.uses_oracle:
            draft = "OracleDraft (the target's own greedy output, each draft kept with probability alpha)"
            if o.draft_cost:
                draft += f", paying the passes of {o.draft_cost}"
        packed = ", GGUF weights packed (their blocks: packed.cu on CUDA)" if o.packed else ""
        return f"target {model}; draft {draft}{packed}"


def environment(options: BenchOptions) -> dict:
    """Where and with what a run happened: device, versions, date, command."""
    import matplotlib

    package = "verispec"
    env = dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
               matplotlib=matplotlib.__version__, command=options.command or " ".join(sys.argv))
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = "not installed"
    try:
        from importlib.metadata import version

        env[package] = version(package)
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        env[package] = "source"
    if options.device_type() == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["device"] = f"{props.name} ({props.multi_processor_count} SMs)"
    else:
        env["device"] = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return env
