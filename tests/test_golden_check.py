"""`check`, `assert_matches` and the plugin compare what matters (issue 15, category 1).

A case counts as matching only when its ``output`` is present and every
array given is within tolerance. A missing output, two files for one case, a
file named like no case, a directory, link or special file in place of a
result, a copy of the golden file, the suite itself as results: each is
named, with a non-zero exit.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import numpy as np
import pytest
from _golden import SMALL, make_suite, result_name, right_output, run_pytest, write_results

from relpos_ref import golden
from relpos_ref.cli import main
from relpos_ref.golden import fileformat
from relpos_ref.golden.dtypes import numpy_dtype
from relpos_ref.testing import assert_matches


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return make_suite(tmp_path_factory.mktemp("check") / "golden")


@pytest.fixture(scope="module")
def case(suite):
    return golden.load_suite(suite).load(SMALL[0].id)


def _only(*names):
    def make(case):
        dt = numpy_dtype(case.dtype)
        arrays = {**case.inputs, **case.expected}
        return {n: np.asarray(arrays[n]).astype(dt if arrays[n].dtype.kind == "f"
                                                else arrays[n].dtype) for n in names}
    return make


# -- a case matches only with its output -------------------------------------------


@pytest.mark.parametrize(
    "names",
    [("q",), ("weights",), ("logits",), ("weights", "logits"), ("q", "k", "v")],
    ids=lambda n: "+".join(n),
)
def test_results_without_the_output_do_not_match(suite, tmp_path, names):
    mine = write_results(tmp_path / "mine", suite, _only(*names))
    report = golden.check(suite, mine)
    assert not report.ok
    assert set(report.incomplete) == {c.id for c in SMALL}
    assert all(v == ["output"] for v in report.incomplete.values())
    text = "\n".join(report.lines())
    assert "output: MISSING" in text and f"0 of {len(SMALL)} case(s) match" in text
    cases = report.as_dict()["cases"]
    assert all(c["passed"] is False and c["missing_outputs"] == ["output"] for c in cases.values())


def test_the_cli_exits_1_when_only_the_input_was_given(suite, tmp_path, capsys):
    mine = write_results(tmp_path / "mine", suite, _only("q"))
    assert main(["check", str(suite), str(mine)]) == 1
    out = capsys.readouterr().out
    assert out.count("output: MISSING") == len(SMALL) and "0 of 4 case(s) match" in out


def test_the_right_output_matches(suite, tmp_path):
    mine = write_results(tmp_path / "mine", suite, right_output)
    report = golden.check(suite, mine)
    assert report.ok and len(report.results) == len(SMALL) and not report.incomplete


@pytest.mark.parametrize("error", [0.5, 0.1, np.nan, np.inf, -np.inf])
def test_a_wrong_output_does_not_match(suite, tmp_path, error):
    def make(case):
        out = right_output(case)["output"].copy()
        out.flat[3] = out.flat[3] + error
        return {"output": out}

    mine = write_results(tmp_path / "mine", suite, make)
    report = golden.check(suite, mine)
    assert not report.ok
    assert all(not r.passed for rs in report.results.values() for r in rs)


def test_a_right_output_with_a_wrong_intermediate_does_not_match(suite, tmp_path):
    def make(case):
        arrays = {**right_output(case), **_only("weights")(case)}
        arrays["weights"] = arrays["weights"] * 2
        return arrays

    report = golden.check(suite, write_results(tmp_path / "mine", suite, make))
    assert not report.ok
    assert {r.name for rs in report.results.values() for r in rs if not r.passed} == {"weights"}


# -- what the results directory may hold -----------------------------------------------


def test_two_files_for_one_case_are_refused(suite, tmp_path):
    mine = write_results(tmp_path / "mine", suite, right_output)
    wrong = {"output": right_output(golden.load_suite(suite).load(SMALL[0].id))["output"] + 1}
    (mine / result_name(suite, 0, ".npz")).write_bytes(fileformat.dumps(wrong, "npz"))
    with pytest.raises(golden.SuiteError, match="which one is the result") as info:
        golden.check(suite, mine)
    assert result_name(suite, 0, ".npz") in str(info.value)
    assert result_name(suite, 0) in str(info.value)


@pytest.mark.parametrize(
    "name", ["notes.txt", ".DS_Store", "shaw__clip.safetensors", "output.npz", "x.safetensors.bak"]
)
def test_a_file_named_like_no_case_is_refused(suite, tmp_path, name):
    mine = write_results(tmp_path / "mine", suite, right_output)
    (mine / name).write_bytes(b"")
    with pytest.raises(golden.SuiteError, match="named like no case") as info:
        golden.check(suite, mine)
    assert name in str(info.value)


def test_a_result_with_another_extension_is_refused(suite, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    name = result_name(suite, 0, ".pt")
    (mine / name).write_bytes(b"x")
    with pytest.raises(golden.SuiteError, match="named like no case") as info:
        golden.check(suite, mine)
    assert name in str(info.value)


def test_a_directory_in_place_of_a_result_is_refused(suite, tmp_path):
    mine = write_results(tmp_path / "mine", suite, right_output)
    name = result_name(suite, 1)
    (mine / name).unlink()
    (mine / name).mkdir()
    with pytest.raises(golden.SuiteError, match="is a directory; results are plain files"):
        golden.check(suite, mine)


def test_a_link_in_place_of_a_result_is_refused(suite, tmp_path):
    mine = write_results(tmp_path / "mine", suite, right_output)
    name = result_name(suite, 1)
    (tmp_path / "elsewhere").write_bytes((mine / name).read_bytes())
    (mine / name).unlink()
    (mine / name).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(golden.SuiteError, match="is a symbolic link; results are plain files"):
        golden.check(suite, mine)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_named_pipe_in_place_of_a_result_is_refused_without_blocking(suite, tmp_path):
    mine = write_results(tmp_path / "mine", suite, right_output)
    name = result_name(suite, 2)
    (mine / name).unlink()
    os.mkfifo(mine / name)
    with pytest.raises(golden.SuiteError, match="is a special file; results are plain files"):
        golden.check(suite, mine)


def test_a_copy_of_the_golden_file_is_not_a_result(suite, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copyfile(suite / result_name(suite, 0), mine / result_name(suite, 0))
    with pytest.raises(golden.SuiteError, match="is a copy of the golden file of case"):
        golden.check(suite, mine)


def test_the_suite_is_not_its_own_results(suite):
    with pytest.raises(golden.SuiteError, match="is the suite itself"):
        golden.check(suite, suite)
    with pytest.raises(golden.SuiteError, match="is the suite itself"):
        golden.check(suite, suite / ".." / suite.name)


def test_results_that_are_not_a_directory_are_refused(suite, tmp_path):
    (tmp_path / "file").write_bytes(b"")
    for where in (tmp_path / "file", tmp_path / "absent"):
        with pytest.raises(golden.SuiteError, match="is not a directory of results"):
            golden.check(suite, where)


def test_an_empty_results_directory_is_refused(suite, tmp_path):
    (tmp_path / "mine").mkdir()
    with pytest.raises(golden.SuiteError, match="holds no file named like a selected case"):
        golden.check(suite, tmp_path / "mine")


@pytest.mark.parametrize("keep", [0, 9, -3])
def test_a_truncated_result_is_named(suite, tmp_path, keep):
    mine = write_results(tmp_path / "mine", suite, right_output)
    path = mine / result_name(suite, 0)
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(golden.SuiteError, match="not a valid safetensors file") as info:
        golden.check(suite, mine)
    assert path.name in str(info.value)


def test_results_of_unselected_cases_are_allowed_and_not_compared(suite, tmp_path):
    mine = write_results(tmp_path / "mine", suite, right_output)
    report = golden.check(suite, mine, select=["bias/*"])
    assert report.ok and set(report.results) == {c.id for c in SMALL if c.scheme == "bias"}


# -- assert_matches ---------------------------------------------------------------


def test_assert_matches_requires_the_output(case):
    weights = _only("weights")(case)
    with pytest.raises(AssertionError, match=r"lacks 'output' \(got \['weights'\]\)"):
        assert_matches(case, weights)
    assert_matches(case, weights, require=())  # only what is passed, when asked for


def test_assert_matches_names_every_required_array(case):
    with pytest.raises(AssertionError, match=r"lacks 'output', 'logits'"):
        assert_matches(case, _only("weights")(case), require=("output", "logits"))


def test_assert_matches_refuses_a_string_for_require(case):
    with pytest.raises(TypeError, match="`require` must be a collection of names"):
        assert_matches(case, right_output(case), require="output")


def test_assert_matches_refuses_no_outputs(case):
    with pytest.raises(ValueError, match="`outputs` is empty"):
        assert_matches(case, {})


# -- the plugin ------------------------------------------------------------------


def test_the_plugin_fails_a_test_that_returns_no_output(suite, tmp_path):
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text(textwrap.dedent("""
        from relpos_ref.testing import assert_matches

        def test_weights_only(golden_case):
            assert_matches(golden_case, {"weights": golden_case.expected["weights"]})
    """))
    run = run_pytest(project, f"--golden-dir={suite}")
    assert run.returncode == 1 and f"{len(SMALL)} failed" in run.stdout
    assert "lacks 'output'" in run.stdout


def test_the_plugin_names_its_own_option_for_a_bad_glob(suite, tmp_path):
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text("def test_x(golden_case):\n    pass\n")
    run = run_pytest(project, f"--golden-dir={suite}", "--golden-select=nope/*")
    assert run.returncode == 4
    assert "--golden-select 'nope/*' matches no case" in run.stderr
    assert "holds 4 cases, e.g. 'shaw/clip/" in run.stderr


def test_check_json_says_what_is_missing(suite, tmp_path, capsys):
    mine = write_results(tmp_path / "mine", suite, _only("weights"))
    assert main(["check", str(suite), str(mine), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["checked"] == len(SMALL)
    assert {c["missing_outputs"][0] for c in report["cases"].values()} == {"output"}
