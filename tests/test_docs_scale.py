"""Every statement of the docs about the default ``scale`` agrees with the catalog (issue 26, 7).

`docs/schemes/t5.md` once said "pass ``scale=None`` for 1/sqrt(d)" while the
code (rightly) gives T5 ``scale = 1``. The statements read here, from every
page of ``docs/`` and the README, outside code blocks (those run as tests):

- a sentence with ``scale=None`` in it: the scheme is the one it names
  (``t5_attention``, ``scheme="t5"``), else the page's (``docs/schemes/<name>.md``),
  else plain attention; the value is the first one written after
  ``scale=None`` ("unscaled", ``scale=1``, ``1/\\sqrt{d}``, ...);
- "``$s = ...$``, the default of ``<scheme>_attention``";
- (the table of defaults in ``docs/conventions.md`` is generated from the catalog at
  build time, and tested in ``tests/test_docs.py``);
- the "scaling" rows of the conventions tables ("T5: 1", "T5 uses $s = 1$").

Each is compared with ``catalog.get(name).defaults.scale(d, tables)``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from relpos_ref import catalog

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md")
                                      if "_build" not in p.parts and "_generated" not in p.parts)])
D = 16

#: A written value -> the scale it means for feature width d and f = 1 + tables given.
VALUES = [
    (re.compile(r"1\s*/\s*\\?(?:math\.)?sqrt\s*[({]\s*d\s*\\?,?\s*f\s*[)}]"), "1/sqrt(d f)"),
    (re.compile(r"1\s*/\s*\\?(?:math\.)?sqrt\s*[({]\s*d\s*[)}]"), "1/sqrt(d)"),
    (re.compile(r"\bunscaled\b|\bnever scales\b|`scale=1(?:\.0)?`|\$1\$|\$s = 1\$|^1\b"),
     "1"),
]
SCHEME_NAME = re.compile(r"`(\w+)_attention\b|scheme=\"(\w+)\"")
DISPLAY_NAMES = {"T5": "t5", "DeBERTa": "deberta", "ALiBi": "alibi", "RoPE": "rope",
                 "Transformer-XL": "transformer_xl", "Swin": "swin"}


def _value(text: str) -> tuple[int, str] | None:
    found = [(m.start(), meaning) for pattern, meaning in VALUES for m in pattern.finditer(text)]
    return min(found) if found else None


def _prose(page: Path) -> list[tuple[int, str]]:
    # (line number, text) of the lines outside fenced code blocks
    out, fenced = [], False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def _sentences(page: Path) -> list[tuple[int, str]]:
    # paragraphs joined, then split at ". " (a sentence keeps the line it starts on)
    out, buffer, start = [], [], 0
    for number, line in [*_prose(page), (0, "")]:
        if line.strip() and not line.lstrip().startswith("|"):
            if not buffer:
                start = number
            buffer.append(line.strip())
            continue
        text = " ".join(buffer)
        out += [(start, s) for s in re.split(r"(?<=[.;])\s+(?=[A-Z`])", text) if s]
        buffer = []
    return out


def statements(page: Path) -> list[tuple[str, int, str, str]]:
    """(page, line, scheme, value) of each statement about the default scale on `page`."""
    where = page.relative_to(ROOT).as_posix()
    own = page.stem if page.parent.name == "schemes" and page.stem in catalog.names() else None
    found = []
    for number, sentence in _sentences(page):
        if "scale=None" in sentence:
            after = sentence[sentence.index("scale=None"):]
            named = {a or b for a, b in SCHEME_NAME.findall(sentence)} & set(catalog.names())
            value = _value(after)
            if value is not None:
                for scheme in sorted(named) or [own or "plain"]:
                    found.append((where, number, scheme, value[1]))
        for match in re.finditer(r"\$s = ([^$]+)\$, the default of `(\w+)_attention`", sentence):
            value = _value(f"${match[1]}$" if match[1].strip() == "1" else match[1])
            found.append((where, number, match[2], value[1] if value else match[1]))
    for number, line in _prose(page):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if where == "docs/conventions.md" and len(cells) == 4 and "`" in cells[0] \
                and _value(cells[1]) is not None and cells[0] != "scheme":
            named = re.findall(r"`(\w+)`", cells[0])
            if "every scheme not listed" in cells[0]:
                named = ["plain", "absolute", "shaw", "bias", "general", "grid2d", "alibi",
                         "swin", "rope"]
            found += [(where, number, n, _value(cells[1])[1]) for n in named]
        if cells and cells[0] == "scaling":
            for display, scheme in DISPLAY_NAMES.items():
                for match in re.finditer(rf"\b{re.escape(display)}(?: uses)?:?\s", line):
                    value = _value(line[match.end():match.end() + 25])
                    if value is not None and value[0] <= 2:  # after a $ or a backtick
                        found.append((where, number, scheme, value[1]))
    return found


def _catalog_value(scheme: str, meaning: str) -> bool:
    entry = catalog.get(scheme)
    if meaning == "1/sqrt(d f)":  # f = 1 + the tables given: try one and two
        return all(math.isclose(entry.defaults.scale(D, tables), (D * (1 + n)) ** -0.5)
                   for n, tables in ((1, ("K", None)), (2, ("K", "Q"))))
    want = {"1": 1.0, "1/sqrt(d)": D**-0.5}[meaning]
    return math.isclose(entry.defaults.scale(D, ()), want)


ALL = [s for page in PAGES for s in statements(page)]


@pytest.mark.parametrize("statement", ALL, ids=[f"{p}:{n}:{s}" for p, n, s, _ in ALL])
def test_each_statement_of_the_default_scale_agrees_with_the_catalog(statement):
    page, line, scheme, meaning = statement
    assert _catalog_value(scheme, meaning), (
        f"{page}:{line} says scale=None is {meaning} for {scheme}; the catalog's "
        f"defaults give {catalog.get(scheme).defaults.scale(D, ('K', 'Q'))} at d = {D}")


def test_the_statements_are_found():
    # T5's page (the sentence and its formula), the conventions' prose and scaling row,
    # the README's sentence and scaling row
    where = {(p, s) for p, _, s, _ in ALL}
    assert ("docs/schemes/t5.md", "t5") in where and ("README.md", "t5") in where
    # the table of defaults is generated from the catalog (tests/test_docs.py checks it)
    assert {s for p, _, s, _ in ALL if p == "docs/conventions.md"} >= {"t5", "deberta"}
    assert len(ALL) >= 8


def test_the_old_t5_sentence_would_be_refused(tmp_path):
    page = tmp_path / "schemes" / "t5.md"
    page.parent.mkdir()
    page.write_text("- **Scaling**: `scale=1.0` is T5's; pass `scale=None` for "
                    "$1/\\sqrt{d}$.\n", encoding="utf-8")
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        found = statements(page)
    finally:
        ROOT = root
    assert found == [("schemes/t5.md", 1, "t5", "1/sqrt(d)")]
    assert not _catalog_value("t5", "1/sqrt(d)")
