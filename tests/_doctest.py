"""Doctest comparison for docstrings and the docs' code blocks, on two array libraries.

Examples are written against ``array_api_strict`` (``import array_api_strict
as xp``), as array-api-extra writes its own, and print what it prints. Each
is run twice, with the kernels of `relpos_ref.kernels` disabled: as written,
and with that import replaced by ``import array_api_compat.numpy as xp``.
`LibraryTolerantChecker` accepts an output when it equals the expected text
up to the two libraries' array decorations (``Array(...)`` and ``dtype=`` on
one side, ``array(...)`` on the other), whitespace, and printed floats within
the precision they were written with (or 1e-6 relative).
"""

from __future__ import annotations

import contextlib
import copy
import doctest
import re

from relpos_ref import kernels

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
STRICT_IMPORT = "import array_api_strict as xp"
NUMPY_IMPORT = "import array_api_compat.numpy as xp"
_DTYPE = re.compile(r",\s*dtype=(?:array_api_strict\.)?\w+")
_ARRAY = re.compile(r"\bArray\(")


def _decimals(literal: str) -> int:
    mantissa, _, exponent = literal.lower().partition("e")
    places = len(mantissa.partition(".")[2])
    return places - int(exponent or 0)


def plain_reprs(text: str) -> str:
    """`text` with array reprs of either library in one form: ``array([...])``, no dtype."""
    return _ARRAY.sub("array(", _DTYPE.sub("", text))


def numbers_close(want: str, got: str) -> bool:
    """Whether `got` equals `want` up to the precision of each number written in `want`."""
    want, got = plain_reprs(want), plain_reprs(got)
    want_parts, got_parts = NUMBER.split(want), NUMBER.split(got)
    if len(want_parts) != len(got_parts):
        return False
    for w, g in zip(want_parts, got_parts, strict=True):
        if " ".join(w.split()) != " ".join(g.split()):
            return False
    for w_text, g_text in zip(NUMBER.findall(want), NUMBER.findall(got), strict=True):
        w, g = float(w_text), float(g_text)
        tolerance = max(1e-6 * max(abs(w), abs(g)), 1.5 * 10.0 ** -_decimals(w_text), 1e-12)
        if abs(w - g) > tolerance:
            return False
    return True


class LibraryTolerantChecker(doctest.OutputChecker):
    """doctest's checker, then a second look up to array decorations and float printing."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        if super().check_output(want, got, optionflags):
            return True
        return numbers_close(want, got)


FloatTolerantChecker = LibraryTolerantChecker


def on_numpy(test: doctest.DocTest) -> doctest.DocTest | None:
    """A copy of `test` with its array-api-strict import swapped for NumPy's, or ``None``."""
    if not any(STRICT_IMPORT in e.source for e in test.examples):
        return None
    twin = copy.copy(test)
    twin.name = f"{test.name} [numpy]"
    twin.examples = [copy.copy(e) for e in test.examples]
    for example in twin.examples:
        example.source = example.source.replace(STRICT_IMPORT, NUMPY_IMPORT)
    twin.globs = dict(test.globs)
    return twin


def _runner() -> doctest.DocTestRunner:
    return doctest.DocTestRunner(checker=LibraryTolerantChecker(), optionflags=FLAGS)


def run_docstring_examples(module, *, with_kernels: bool = False) -> doctest.TestResults:
    """Run a module's docstring examples on array-api-strict and NumPy, kernels disabled.

    `with_kernels` leaves them on, for the examples of `relpos_ref.kernels` itself.
    """
    finder = doctest.DocTestFinder()
    runner = _runner()
    with contextlib.nullcontext() if with_kernels else kernels.disabled():
        for test in finder.find(module, module.__name__, globs=vars(module).copy()):
            for variant in (test, on_numpy(test)):
                if variant is not None:
                    runner.run(variant)
    return runner.summarize(verbose=False)


def run_text_examples(text: str, name: str, globs: dict) -> doctest.TestResults:
    """Run the ``>>>`` examples of a block of text in the namespace `globs`, kernels disabled."""
    parser = doctest.DocTestParser()
    test = parser.get_doctest(text, globs, name, name, 0)
    runner = _runner()
    with kernels.disabled():
        runner.run(test, clear_globs=False)
    globs.update(test.globs)  # DocTest works on a copy; later blocks see these names
    return runner.summarize(verbose=False)
