"""Tokenizer: a ``tokenizers.Tokenizer`` + chat template + the ids that end generation.

Built from an HF ``tokenizer.json`` (+ tokenizer_config.json for the chat template) or from GGUF metadata
(byte-level BPE vocab/merges, ``tokenizer.chat_template``, ``tokenizer.ggml.eos_token_id``).
"""
from __future__ import annotations

import json
from pathlib import Path


class Tokenizer:
    def __init__(self, tok, *, eos_token_ids: list[int], chat_template: str | None = None,
                 bos_token: str | None = None, eos_token: str | None = None, add_bos: bool | None = None):
        self._tok = tok                       # tokenizers.Tokenizer
        self.eos_token_ids = list(dict.fromkeys(int(i) for i in eos_token_ids))  # dedup, keep order
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token
        self._add_bos = add_bos               # None: the tokenizer.json post-processor decides
        self._template = None                 # (source, compiled jinja2 Template) of ``chat_template``

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._add_bos and self.bos_token is not None:
            bos = self._tok.token_to_id(self.bos_token)
            if not ids or ids[0] != bos:
                ids = [bos] + ids
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return self._compiled_template().render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def _compiled_template(self):
        """``chat_template`` compiled once (recompiled if it is replaced): compiling costs milliseconds, which a
        server would otherwise pay per request on its event loop, rendering costs tens of microseconds."""
        if not self.chat_template:
            raise ValueError("this model's tokenizer has no chat template; encode a plain prompt with "
                             "tokenizer.encode(text) instead")
        if self._template is not None and self._template[0] == self.chat_template:
            return self._template[1]
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent, ensure_ascii=False)
        env.globals["raise_exception"] = raise_exception
        template = env.from_string(self.chat_template)
        self._template = (self.chat_template, template)
        return template

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        # the template writes special tokens (BOS included, if the family uses one) as text
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)


def _token_str(tok) -> str | None:
    if tok is None:
        return None
    return tok if isinstance(tok, str) else tok.get("content")


def tokenizer_from_hf_dir(path: Path, hf_config: dict) -> Tokenizer:
    from tokenizers import Tokenizer as HFTok

    tj = path / "tokenizer.json"
    if not tj.exists():
        raise FileNotFoundError(f"{tj} not found: verispec needs a fast tokenizer file (tokenizer.json) next to "
                                f"config.json; save it with AutoTokenizer.from_pretrained(...).save_pretrained(dir)")
    tok = HFTok.from_file(str(tj))
    tcfg = {}
    if (path / "tokenizer_config.json").exists():
        tcfg = json.loads((path / "tokenizer_config.json").read_text())
    template = tcfg.get("chat_template")
    if template is None and (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
    eos_tok, bos_tok = _token_str(tcfg.get("eos_token")), _token_str(tcfg.get("bos_token"))
    eos_ids: list[int] = []
    gen = {}
    if (path / "generation_config.json").exists():
        gen = json.loads((path / "generation_config.json").read_text())
    for src in (gen.get("eos_token_id"), hf_config.get("eos_token_id")):
        if src is not None:
            eos_ids += src if isinstance(src, list) else [src]
    if eos_tok is not None and tok.token_to_id(eos_tok) is not None:
        eos_ids.append(tok.token_to_id(eos_tok))
    add_bos = tcfg.get("add_bos_token")  # slow-tokenizer style flag (Llama 2); None -> trust tokenizer.json
    return Tokenizer(tok, eos_token_ids=eos_ids, chat_template=template, bos_token=bos_tok, eos_token=eos_tok,
                     add_bos=add_bos)


_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's tokenizer.ggml.pre -> the Split regex of the model's own tokenizer.json
_SPLIT_REGEX = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT,
                "qwen2": _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")}


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    """Byte-level BPE ("gpt2" GGUF tokenizer model) from GGUF metadata ``meta`` (field name -> value)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTok

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2'); "
                         f"load the HF checkpoint directory instead")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = HFTok(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    pre_type = meta.get("tokenizer.ggml.pre", "default")
    if pre_type in _SPLIT_REGEX:   # the same Split + ByteLevel pair as these models' tokenizer.json
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_REGEX[pre_type]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre_type in ("smollm", "starcoder", "refact"):  # GPT-2 regex with one token per digit
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:  # "gpt2" / "default": GPT-2's regex; other llama.cpp pre-tokenizers are approximated by it
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # CONTROL (3) and USER_DEFINED (4) tokens are matched whole in the text, like HF's added tokens
    # (the strings are already in the vocab, so their ids do not change)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    tok.add_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    eos_ids = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    bos = tokens[bos_id] if bos_id is not None else None
    eos = tokens[eos_ids[0]] if eos_ids else None
    return Tokenizer(tok, eos_token_ids=eos_ids, chat_template=meta.get("tokenizer.chat_template"),
                     bos_token=bos, eos_token=eos, add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)))
