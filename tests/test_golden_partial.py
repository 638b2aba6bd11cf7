"""Part of a suite never passes as the whole (issue 26, item 5).

Before, ``relpos-ref check golden results`` with results for some of the
selected cases printed "3 of 3 case(s) match; 2 case(s) not provided" and
exited 0, and ``pytest`` without ``--golden-dir`` reported a skip and stayed
green. Now a selected case without a result fails `check` (exit 1) unless
``--allow-missing`` is given, and the summary says which; a test taking
``golden_case`` without a suite fails in one line saying how to give one,
unless ``--golden-allow-missing`` (or the ini option) skips it, said in the
summary; and ``@pytest.mark.golden(...)`` gives a test one scheme's cases
(or some ids or dtypes) without ``pytest.skip``.
"""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from _golden import PluginConfig, right_output, run_pytest, write_results

from relpos_ref import golden, pytest_plugin
from relpos_ref.cli import main

#: Twelve tiny cases of three schemes.
TWELVE = golden.default_cases().select(
    ["bias/decode-step/*", "shaw/length-1/*", "grid2d/one-token/*"])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("partial")
    golden.generate(root / "golden", TWELVE)
    write_results(root / "all", root / "golden", right_output)
    return root


def _results(pristine: Path, tmp_path: Path, keep: int) -> tuple[Path, list[str], list[str]]:
    """Results for the suite's first `keep` cases: (directory, ids given, ids missing)."""
    opened = golden.load_suite(pristine / "golden")
    ids = list(opened.cases)
    mine = tmp_path / "mine"
    mine.mkdir()
    for cid in ids[:keep]:
        name = opened.cases[cid]["file"]
        shutil.copyfile(pristine / "all" / name, mine / name)
    return mine, ids[:keep], ids[keep:]


def _check(argv: list[str], capsys) -> tuple[int, list[str]]:
    status = main(["check", *argv])
    return status, capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("keep", [1, 5, 11])
def test_check_fails_when_a_selected_case_has_no_result(pristine, tmp_path, keep, capsys):
    mine, given, missing = _results(pristine, tmp_path, keep)
    report = golden.check(pristine / "golden", mine)
    assert not report.ok and report.missing == missing and list(report.results) == given
    status, lines = _check([str(pristine / "golden"), str(mine)], capsys)
    shown = [f"FAIL {cid}: no result file" for cid in missing[:10]]
    if len(missing) > 10:
        shown.append(f"     ... and {len(missing) - 10} more with no result file")
    assert status == 1
    assert lines == [*shown, f"{keep} of 12 selected case(s) match; {12 - keep} have no result "
                     "(pass --allow-missing to check only the cases given)"]


@pytest.mark.parametrize("keep", [1, 5, 11])
def test_allow_missing_checks_the_cases_given_and_says_so(pristine, tmp_path, keep, capsys):
    mine, _, missing = _results(pristine, tmp_path, keep)
    report = golden.check(pristine / "golden", mine, allow_missing=True)
    assert report.ok and report.missing == missing
    status, lines = _check([str(pristine / "golden"), str(mine), "--allow-missing"], capsys)
    assert (status, lines) == (0, [f"{keep} of {keep} case(s) match; {12 - keep} selected "
                                   "case(s) have no result and were not checked "
                                   "(--allow-missing)"])


def test_allow_missing_does_not_excuse_a_mismatch(pristine, tmp_path, capsys):
    mine, given, _ = _results(pristine, tmp_path, 2)
    opened = golden.load_suite(pristine / "golden")
    case = opened.load(given[0])
    from relpos_ref.golden import fileformat

    wrong = {"output": case.golden("output").astype(case.dtype) + 1}
    (mine / case.entry["file"]).write_bytes(fileformat.dumps(wrong, "safetensors"))
    status, lines = _check([str(pristine / "golden"), str(mine), "--allow-missing"], capsys)
    assert status == 1 and lines[0] == f"FAIL {given[0]}"
    assert lines[-1] == ("1 of 2 case(s) match; 10 selected case(s) have no result and were "
                         "not checked (--allow-missing)")


def test_selecting_the_cases_given_needs_no_allowance(pristine, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    for path in (pristine / "all").glob("bias__*"):
        shutil.copyfile(path, mine / path.name)
    status, lines = _check([str(pristine / "golden"), str(mine), "--select", "bias/*"], capsys)
    assert (status, lines) == (0, ["4 of 4 case(s) match"])


def test_the_json_report_says_what_is_missing_and_whether_allowed(pristine, tmp_path, capsys):
    mine, _, missing = _results(pristine, tmp_path, 3)
    for allow in (False, True):
        status = main(["check", str(pristine / "golden"), str(mine), "--json",
                       *(["--allow-missing"] if allow else [])])
        report = json.loads(capsys.readouterr().out)
        assert (status, report["ok"], report["allow_missing"]) == (int(not allow), allow, allow)
        assert report["not_provided"] == missing and report["checked"] == 3


def test_a_complete_result_set_passes_as_before(pristine, capsys):
    status, lines = _check([str(pristine / "golden"), str(pristine / "all")], capsys)
    assert (status, lines) == (0, ["12 of 12 case(s) match"])


def test_the_gradients_flag_and_missing_cases_both_fail(pristine, tmp_path, capsys):
    mine, given, missing = _results(pristine, tmp_path, 11)
    report = golden.check(pristine / "golden", mine, gradients=True)
    assert not report.ok and report.missing == missing
    assert set(report.incomplete) == set(given)  # the outputs alone lack the gradients


# -- the pytest plugin ------------------------------------------------------------------------


def _project(tmp_path: Path, test: str, ini: str | None = None) -> Path:
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text(textwrap.dedent(test))
    if ini is not None:
        (project / "pytest.ini").write_text(ini)
    return project


TAKES = """
    def test_it(golden_case):
        assert golden_case.id
"""


def test_without_a_suite_a_golden_test_fails_in_one_line(tmp_path):
    run = run_pytest(_project(tmp_path, TAKES))
    assert run.returncode == 1 and "1 error" in run.stdout
    lines = run.stdout.splitlines()
    assert lines.count(pytest_plugin.NO_SUITE) == 1  # the failure is that one line
    assert any(line.startswith("ERROR test_it.py::test_it[no-golden-dir] - Failed: no golden "
                               "suite") for line in lines)


@pytest.mark.parametrize("how", ["option", "ini"])
def test_allow_missing_skips_without_a_suite_and_says_so(tmp_path, how):
    ini = "[pytest]\ngolden_allow_missing = true\n" if how == "ini" else None
    args = ["--golden-allow-missing"] if how == "option" else []
    run = run_pytest(_project(tmp_path, TAKES, ini=ini), "-rs", *args)
    allowed = "--golden-allow-missing" if how == "option" else "golden_allow_missing (ini)"
    assert run.returncode == 0 and "1 skipped" in run.stdout
    assert (f"relpos-ref: 1 test(s) taking golden_case ran on no golden case (skipped, "
            f"allowed by {allowed})") in run.stdout
    assert "no golden suite: pass --golden-dir DIR (a suite from `relpos-ref generate " \
           f"--out DIR`) or set golden_dir in the ini file (allowed by {allowed})" in run.stdout


MARKED = """
    import pytest

    @pytest.mark.golden(scheme="shaw")
    def test_shaw(golden_case):
        assert golden_case.scheme == "shaw"

    @pytest.mark.golden("bias", "grid2d", dtypes=["float16"])
    def test_two_schemes_in_float16(golden_case):
        assert golden_case.dtype == "float16" and golden_case.scheme != "shaw"

    @pytest.mark.golden(select="*/bfloat16/*")
    def test_bfloat16(golden_case):
        assert golden_case.dtype == "bfloat16"

    @pytest.mark.golden(scheme="t5")
    def test_t5(golden_case):
        pass

    def test_every_case(golden_case):
        pass
"""


def test_a_marker_gives_a_test_only_its_cases(pristine, tmp_path):
    project = _project(tmp_path, MARKED)
    suite = pristine / "golden"
    run = run_pytest(project, f"--golden-dir={suite}", "-rA")
    counts = {name: run.stdout.count(f"PASSED test_it.py::{name}[")
              for name in ("test_shaw", "test_two_schemes_in_float16", "test_bfloat16",
                           "test_every_case")}
    assert counts == {"test_shaw": 4, "test_two_schemes_in_float16": 2, "test_bfloat16": 3,
                      "test_every_case": 12}, run.stdout
    assert run.returncode == 1 and "SKIPPED" not in run.stdout
    why = (f"@pytest.mark.golden(scheme='t5') selects no case of the suite {suite}; "
           "generate those cases, or change the marker")
    assert why in run.stdout.splitlines()
    assert "ERROR test_it.py::test_t5[no-golden-case] - Failed: @pytest.mark.golden" in run.stdout
    allowed = run_pytest(project, f"--golden-dir={suite}", "--golden-allow-missing", "-rA")
    assert allowed.returncode == 0 and "1 skipped" in allowed.stdout
    assert ("relpos-ref: 1 test(s) taking golden_case ran on no golden case (skipped, "
            "allowed by --golden-allow-missing)") in allowed.stdout


def _marker(*args, **kwargs):
    return pytest.mark.golden(*args, **kwargs).mark


ENTRIES = [{"id": c.id, "scheme": c.scheme, "dtype": c.dtype} for c in TWELVE]


@pytest.mark.parametrize(("marker", "count"), [
    (_marker(scheme="bias"), 4),
    (_marker("bias", "shaw"), 8),
    (_marker(scheme=["grid2d"], dtypes="float64"), 1),
    (_marker(select=["shaw/*", "*/float32/*"]), 6),
    (_marker(select="nothing/*"), 0),
])
def test_the_marker_selects_by_scheme_glob_and_dtype(marker, count):
    kept, written = pytest_plugin._marked(ENTRIES, marker)
    assert len(kept) == count and written.startswith("@pytest.mark.golden(")


@pytest.mark.parametrize(("marker", "message"), [
    (_marker(scheme="shwa"), "@pytest.mark.golden: unknown scheme 'shwa' (known: "),
    (_marker(dtypes="float8"), "@pytest.mark.golden: unknown dtype 'float8' (known: "),
    (_marker(schemes="shaw"), "@pytest.mark.golden takes scheme=, select=, dtypes= and "
                              "kind=, got schemes"),
    (_marker(select=3), "@pytest.mark.golden: `select` must be a name or a list of names, "
                        "got 3"),
])
def test_a_wrong_marker_is_a_usage_error(marker, message):
    with pytest.raises(pytest.UsageError) as info:
        pytest_plugin._marked(ENTRIES, marker)
    assert str(info.value).startswith(message)


def test_the_plugin_registers_its_marker():
    lines = []

    class Config(PluginConfig):
        def addinivalue_line(self, name, line):
            lines.append((name, line))

    pytest_plugin.pytest_configure(Config())
    assert lines == [("markers", pytest_plugin._MARKER)]
