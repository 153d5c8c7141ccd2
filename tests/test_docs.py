"""The documentation runs as written: every ``>>>`` example in verispec/ (doctest) and the README's
Python snippets (on the CPU; the README's model snippet loads the embedded SmolLM2)."""
from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# public modules whose docstrings must keep at least one runnable example
DOCUMENTED = ["verispec.analysis", "verispec.runtime.loading", "verispec.verify.api", "verispec.verify.reference",
              "verispec.verify.rng", "verispec.verify.sampling"]


def _modules_with_examples() -> list[str]:
    paths = (p for p in (ROOT / "verispec").rglob("*.py") if ">>>" in p.read_text())
    return [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in paths]


@pytest.mark.parametrize("name", sorted(set(DOCUMENTED) | set(_modules_with_examples())))
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (output above)"
    assert result.attempted > 0, f"{name} has no >>> examples"


def readme_snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


def test_readme_has_snippets():
    assert len(readme_snippets()) >= 2


@pytest.mark.parametrize("index", range(len(readme_snippets())))
def test_readme_snippet_runs(index, monkeypatch, capsys):
    """Each snippet in a fresh namespace. ``generate`` defaults to 8 new tokens instead of 128: the
    snippets' calls are what is checked, and 128 tokens of SmolLM2 take minutes on a small CPU."""
    import verispec

    snippet = readme_snippets()[index]
    if "load_model()" in snippet:
        from verispec.runtime.loading import embedded_gguf_path

        try:
            embedded_gguf_path()
        except FileNotFoundError as e:
            pytest.skip(str(e))
    generate = verispec.generate
    monkeypatch.setattr(verispec, "generate", lambda *args, **kw: generate(*args, **{"max_new_tokens": 8, **kw}))
    exec(compile(snippet, f"README.md python block {index + 1}", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out
    if "print(" in snippet:
        assert printed.strip(), "the snippet prints nothing"
