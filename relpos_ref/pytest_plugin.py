"""pytest plugin (entry point ``pytest11``): run your tests over a golden suite.

Options: ``--golden-dir DIR`` (a suite from ``relpos-ref generate``; or the
ini option ``golden_dir``, relative to the ini file) and ``--golden-select
GLOB`` (repeatable; globs over case ids). A test that takes
the ``golden_case`` fixture runs once per selected case and receives a
`relpos_ref.golden.GoldenCase`; without ``--golden-dir`` it is skipped with
the reason. Importing the plugin imports nothing beyond the standard library,
so it costs nothing in projects that do not use it.

Example test::

    from relpos_ref.testing import assert_matches

    def test_my_kernel(golden_case):
        if golden_case.scheme != "shaw":
            pytest.skip("only shaw is implemented")
        inputs = golden_case.inputs_as("torch")   # bfloat16 included
        out = my_kernel(**inputs, **golden_case.kwargs)  # scale, causal, q_offset, options
        assert_matches(golden_case, {"output": out})

A failing case reports one line per array that misses its tolerance (the
worst element, the tolerance, the ratio to the naive pipeline's error), not
the assertion helper's source.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = [
    "golden_case",
    "golden_dir",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
]


#: What a suite on disk can make reading raise: said in one line, never a traceback.
_USER_ERRORS = (ValueError, TypeError, OSError, OverflowError, RecursionError, MemoryError)


def _say(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return f"out of memory ({str(exc) or 'no details'})"
    if isinstance(exc, RecursionError):
        return "input nested too deeply to read"
    return " ".join((str(exc) or type(exc).__name__).split())


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("relpos-ref", "relpos-ref golden fixtures")
    group.addoption(
        "--golden-dir",
        default=None,
        metavar="DIR",
        help="golden suite directory (from `relpos-ref generate`) for the golden_case fixture",
    )
    parser.addini(
        "golden_dir",
        "golden suite directory for the golden_case fixture, relative to the ini file "
        "(--golden-dir overrides it)",
        default=None,
    )
    group.addoption(
        "--golden-select",
        action="append",
        default=None,
        metavar="GLOB",
        help="only golden cases whose id matches GLOB (repeatable)",
    )


def golden_dir(config: Any) -> tuple[str | None, str]:
    """The suite directory (``--golden-dir``, else ``golden_dir`` from the ini file) and
    the option it came from; ``(None, "")`` when neither is set."""
    directory = config.getoption("--golden-dir")
    if directory is not None:
        return directory, "--golden-dir"
    ini = config.getini("golden_dir")
    if not ini:
        return None, ""
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return str(base / ini), "golden_dir (ini)"


def pytest_configure(config: Any) -> None:
    """Open the suite named by ``--golden-dir`` up front, so a bad one is a usage error."""
    directory, option = golden_dir(config)
    if directory is None:
        return
    from .golden import load_suite

    try:
        suite = load_suite(directory)
    except _USER_ERRORS as exc:  # said in one line, never an INTERNALERROR
        raise pytest.UsageError(f"{option}: {_say(exc)}") from None
    try:
        config._relpos_ref_entries = suite.select(
            config.getoption("--golden-select"), option="--golden-select"
        )
    except _USER_ERRORS as exc:
        raise pytest.UsageError(_say(exc)) from None
    config._relpos_ref_suite = suite


def pytest_generate_tests(metafunc: Any) -> None:
    if "golden_case" not in metafunc.fixturenames:
        return
    directory, _ = golden_dir(metafunc.config)
    if directory is None:
        reason = "no --golden-dir given (nor golden_dir in the ini file)"
        metafunc.parametrize(
            "golden_case",
            [pytest.param(None, marks=pytest.mark.skip(reason=reason))],
            ids=["no-golden-dir"],
            indirect=True,
        )
        return
    ids = [e["id"] for e in metafunc.config._relpos_ref_entries]
    metafunc.parametrize("golden_case", ids, ids=ids, indirect=True)


@pytest.fixture
def golden_case(request: Any) -> Any:
    """The `relpos_ref.golden.GoldenCase` this test instance runs on.

    The case is read through `relpos_ref.golden.Suite.load`: its SHA-256 and
    a re-derivation of what it claims are checked first, and a case that
    fails them errors this test with the reason (no traceback).
    """
    try:
        return request.config._relpos_ref_suite.load(request.param)
    except _USER_ERRORS as exc:
        pytest.fail(f"golden case {request.param}: {_say(exc)}", pytrace=False)
