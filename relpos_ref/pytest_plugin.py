"""pytest plugin (entry point ``pytest11``): run your tests over a golden suite.

Options: ``--golden-dir DIR`` (a suite from ``relpos-ref generate``; or the
ini option ``golden_dir``, relative to the ini file), ``--golden-select
GLOB`` (repeatable; globs over case ids) and ``--golden-allow-missing`` (or
the ini option ``golden_allow_missing = true``). A test that takes the
``golden_case`` fixture runs once per selected case and receives a
`relpos_ref.golden.GoldenCase`. Without a suite it fails, in one line saying
how to give one, so that a CI that forgot the suite is not green; with
``--golden-allow-missing`` it is skipped instead, and the summary says so.
Importing the plugin imports nothing beyond the standard library, so it
costs nothing in projects that do not use it.

The marker ``@pytest.mark.golden(scheme=..., select=..., dtypes=...,
kind=...)`` gives a test only some of the suite's cases (one scheme's, say,
or ``kind="decode"``: the decode cases, `relpos_ref.golden.decode`), without
``pytest.skip``; each takes a name or a list. A marker that selects no case
of the suite fails the test (or, with ``--golden-allow-missing``, skips it).

Example test::

    import pytest
    from relpos_ref.testing import assert_matches

    @pytest.mark.golden(scheme="shaw")          # only the suite's shaw cases
    def test_my_kernel(golden_case):
        inputs = golden_case.inputs_as("torch")   # bfloat16 included
        out = my_kernel(**inputs, **golden_case.kwargs)  # scale, causal, q_offset, options
        assert_matches(golden_case, {"output": out})

A failing case reports one line per array that misses its tolerance (the
worst element, in units of the tolerance, and the tolerance), not the
assertion helper's source.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest

__all__ = [
    "golden_case",
    "golden_dir",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_terminal_summary",
]

#: What a suite on disk can make reading raise: said in one line, never a traceback.
_USER_ERRORS = (ValueError, TypeError, OSError, OverflowError, RecursionError, MemoryError)

NO_SUITE = (
    "no golden suite: pass --golden-dir DIR (a suite from `relpos-ref generate --out DIR`) "
    "or set golden_dir in the ini file; --golden-allow-missing (ini: golden_allow_missing "
    "= true) skips the tests that take golden_case instead"
)
_MARKER = ("golden(scheme=None, select=None, dtypes=None, kind=None): give the test only the "
           "golden cases of these schemes, id globs, dtypes and kinds (forward, decode) "
           "(relpos-ref)")


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
    group.addoption(
        "--golden-allow-missing",
        action="store_true",
        default=None,
        help="skip the tests that take golden_case when no suite is given (or their "
             "marker selects no case), instead of failing them",
    )
    parser.addini(
        "golden_allow_missing",
        "skip the tests that take golden_case when no suite is given, instead of failing "
        "them (--golden-allow-missing)",
        type="bool",
        default=False,
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


def _allow_missing(config: Any) -> str | None:
    """The option that allows missing golden cases, or ``None``."""
    if config.getoption("--golden-allow-missing"):
        return "--golden-allow-missing"
    if config.getini("golden_allow_missing"):
        return "golden_allow_missing (ini)"
    return None


def pytest_configure(config: Any) -> None:
    """Open the suite named by ``--golden-dir`` up front, so a bad one is a usage error."""
    if hasattr(config, "addinivalue_line"):
        config.addinivalue_line("markers", _MARKER)
    config._relpos_ref_skipped = 0
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


def _names(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    msg = f"@pytest.mark.golden: `{what}` must be a name or a list of names, got {value!r}"
    raise pytest.UsageError(msg)


def _marked(entries: list[dict[str, Any]], marker: Any) -> tuple[list[dict[str, Any]], str]:
    """The entries a ``golden`` marker keeps, and the marker as written."""
    from .golden import FLOAT_DTYPES, SCHEMES
    from .golden.manifest import KINDS

    given = dict(marker.kwargs)
    if marker.args:
        given.setdefault("scheme", list(marker.args))
    unknown = sorted(set(given) - {"scheme", "select", "dtypes", "kind"})
    if unknown:
        msg = (f"@pytest.mark.golden takes scheme=, select=, dtypes= and kind=, got "
               f"{', '.join(unknown)}")
        raise pytest.UsageError(msg)
    written = ", ".join(f"{k}={v!r}" for k, v in given.items())
    keep = list(entries)
    for key, known, field in (("scheme", SCHEMES, "scheme"), ("dtypes", FLOAT_DTYPES, "dtype"),
                              ("kind", KINDS, "kind")):
        if key in given:
            names = _names(given[key], key)
            wrong = [n for n in names if n not in known]
            if wrong:
                msg = (f"@pytest.mark.golden: unknown {field} {wrong[0]!r} (known: "
                       f"{', '.join(known)})")
                raise pytest.UsageError(msg)
            keep = [e for e in keep if e.get(field, "forward") in names]
    if "select" in given:
        globs = _names(given["select"], "select")
        keep = [e for e in keep if any(fnmatch.fnmatchcase(e["id"], g) for g in globs)]
    return keep, f"@pytest.mark.golden({written})"


def pytest_generate_tests(metafunc: Any) -> None:
    if "golden_case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    allowed = _allow_missing(config)
    directory, _ = golden_dir(config)
    if directory is None:
        _nothing(metafunc, NO_SUITE, allowed, "no-golden-dir")
        return
    entries = config._relpos_ref_entries
    marker = metafunc.definition.get_closest_marker("golden")
    if marker is not None:
        entries, written = _marked(entries, marker)
        if not entries:
            select = config.getoption("--golden-select")
            also = f" and --golden-select {' '.join(select)}" if select else ""
            why = (f"{written}{also} selects no case of the suite {directory}; generate "
                   "those cases, or change the marker")
            _nothing(metafunc, why, allowed, "no-golden-case")
            return
    ids = [e["id"] for e in entries]
    metafunc.parametrize("golden_case", ids, ids=ids, indirect=True)


def _nothing(metafunc: Any, why: str, allowed: str | None, name: str) -> None:
    """Parametrize with one instance that fails saying `why`, or skips when `allowed`."""
    if allowed:
        metafunc.config._relpos_ref_skipped += 1
        mark = pytest.mark.skip(reason=f"{why.split(';')[0]} (allowed by {allowed})")
        metafunc.parametrize("golden_case", [pytest.param(None, marks=mark)], ids=[name],
                             indirect=True)
        return
    metafunc.parametrize("golden_case", [("missing", why)], ids=[name], indirect=True)


@pytest.fixture
def golden_case(request: Any) -> Any:
    """The `relpos_ref.golden.GoldenCase` this test instance runs on.

    The case is read through `relpos_ref.golden.Suite.load`: its SHA-256 and
    a re-derivation of what it claims are checked first, and a case that
    fails them errors this test with the reason (no traceback). Without a
    suite, the test fails saying how to give one.
    """
    if isinstance(request.param, tuple):
        pytest.fail(request.param[1], pytrace=False)
    try:
        return request.config._relpos_ref_suite.load(request.param)
    except _USER_ERRORS as exc:
        pytest.fail(f"golden case {request.param}: {_say(exc)}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """Say that tests taking golden cases were skipped because missing cases were allowed."""
    skipped = getattr(config, "_relpos_ref_skipped", 0)
    if skipped:
        allowed = _allow_missing(config)
        terminalreporter.write_line(
            f"relpos-ref: {skipped} test(s) taking golden_case ran on no golden case "
            f"(skipped, allowed by {allowed})", yellow=True)
