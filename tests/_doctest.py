"""Float-tolerant doctest comparison, for docstrings and for the docs' code blocks.

A printed float may differ in its last digits between BLAS builds, array
libraries and platforms. `FloatTolerantChecker` accepts an example when the
text around the numbers is the same (whitespace aside) and each number is
within the precision it was written with (or 1e-6 relative).
"""

from __future__ import annotations

import doctest
import re

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _decimals(literal: str) -> int:
    mantissa, _, exponent = literal.lower().partition("e")
    places = len(mantissa.partition(".")[2])
    return places - int(exponent or 0)


def numbers_close(want: str, got: str) -> bool:
    """Whether `got` equals `want` up to the precision of each number written in `want`."""
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


class FloatTolerantChecker(doctest.OutputChecker):
    """doctest's checker, then a float-tolerant second look."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        if super().check_output(want, got, optionflags):
            return True
        return numbers_close(want, got)


def run_docstring_examples(module) -> doctest.TestResults:
    """Run a module's docstring examples with the float-tolerant checker."""
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(checker=FloatTolerantChecker(), optionflags=FLAGS)
    for test in finder.find(module, module.__name__, globs=vars(module).copy()):
        runner.run(test)
    return runner.summarize(verbose=False)


def run_text_examples(text: str, name: str, globs: dict) -> doctest.TestResults:
    """Run the ``>>>`` examples of a block of text in the namespace `globs`."""
    parser = doctest.DocTestParser()
    test = parser.get_doctest(text, globs, name, name, 0)
    runner = doctest.DocTestRunner(checker=FloatTolerantChecker(), optionflags=FLAGS)
    runner.run(test, clear_globs=False)
    globs.update(test.globs)  # DocTest works on a copy; later blocks see these names
    return runner.summarize(verbose=False)
