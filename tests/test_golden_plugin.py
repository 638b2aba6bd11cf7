"""The pytest plugin and `GoldenCase` as a consumer project meets them (issue 18, part 3).

A short repr, a one-screen failure without the helper's source, the
``golden_dir`` ini option, `GoldenCase.kwargs` (every keyword a kernel
needs) and `GoldenCase.inputs_as` (bfloat16 included).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _golden import make_suite, run_pytest

import relpos_ref
from relpos_ref import catalog, golden


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return make_suite(tmp_path_factory.mktemp("plugin") / "golden")


def _project(tmp_path: Path, test: str, ini: str | None = None) -> Path:
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text(textwrap.dedent(test))
    if ini is not None:
        (project / "pytest.ini").write_text(ini)
    return project


RIGHT = """
    from relpos_ref.testing import assert_matches

    def test_it(golden_case):
        assert_matches(golden_case, {"output": golden_case.expected["output"]})
"""


def test_the_ini_option_names_the_suite_relative_to_the_ini_file(small, tmp_path):
    relative = os.path.relpath(small, tmp_path / "consumer")
    project = _project(tmp_path, RIGHT, ini=f"[pytest]\ngolden_dir = {relative}\n")
    run = run_pytest(project)
    assert run.returncode == 0 and "4 passed" in run.stdout, run.stdout
    # run from elsewhere: still relative to the ini file
    run = run_pytest(tmp_path, str(project / "test_it.py"), "-c", str(project / "pytest.ini"))
    assert run.returncode == 0 and "4 passed" in run.stdout, run.stdout + run.stderr


def test_the_command_line_overrides_the_ini_option(small, tmp_path):
    project = _project(tmp_path, RIGHT, ini="[pytest]\ngolden_dir = nowhere\n")
    assert run_pytest(project, f"--golden-dir={small}", "--golden-select=shaw/*").returncode == 0
    run = run_pytest(project)
    assert run.returncode == 4
    assert "golden_dir (ini): " in run.stderr and "nowhere is not a directory" in run.stderr


def test_without_a_suite_the_tests_fail_saying_how_to_give_one(tmp_path):
    # issue 26, item 5: a CI that forgot the suite is not green (tests/test_golden_partial.py)
    run = run_pytest(_project(tmp_path, RIGHT))
    assert run.returncode == 1 and "1 error" in run.stdout
    assert "no golden suite: pass --golden-dir DIR" in run.stdout


def test_a_failing_case_fits_on_one_screen(small, tmp_path):
    project = _project(tmp_path, """
        from relpos_ref.testing import assert_matches

        def test_it(golden_case):
            assert_matches(golden_case, {"output": golden_case.expected["output"] + 1})
    """)
    run = run_pytest(project, f"--golden-dir={small}", "--golden-select=bias/*/float32/*")
    assert run.returncode == 1
    failure = run.stdout.split("_ test_it[", 1)[1].split("short test summary", 1)[0]
    assert "output: MISMATCH" in failure
    assert "isinstance(require, str)" not in failure  # assert_matches's own source is hidden
    assert len(failure.splitlines()) <= 20, failure


def test_a_golden_case_has_a_short_repr(small):
    opened = golden.load_suite(small)
    case = opened.load(next(iter(opened.cases)))
    text = repr(case)
    assert text.startswith(f"GoldenCase({case.id!r}, arrays: ") and "output" in text
    assert "array(" not in text and len(text) < 300


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("plugin-all") / "golden"
    golden.generate(out, list(golden.default_cases().select(dtypes=["float64"])))
    return golden.load_suite(out)


def test_the_kwargs_are_every_keyword_the_case_was_computed_with(suite):
    # relpos_ref's own functions, called with the inputs and kwargs alone, give the goldens
    for cid in suite.cases:
        case = suite.load(cid, rederive=False)
        entry = catalog.get(case.scheme)
        inputs = dict(case.inputs)
        tables = entry.table_args({t.name: inputs[t.name] for t in entry.tables
                                   if t.name in inputs})
        function = getattr(relpos_ref, f"{case.scheme}_attention")
        out = function(inputs["q"], inputs["k"], inputs["v"], *tables,
                       mask=inputs.get("mask"), **case.kwargs)
        (result,) = case.compare({"output": out})
        assert result.passed, (cid, case.kwargs, result.summary())
    shaw = next(suite.load(c) for c in suite.cases if c.startswith("shaw/zero/"))
    assert shaw.kwargs == {"scale": 0.25, "causal": False, "q_offset": 0, "beyond": "zero"}


def test_inputs_as_converts_every_input_bfloat16_included(small):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    opened = golden.load_suite(small)
    case = opened.load(next(c for c in opened.cases if "bfloat16" in c))
    got = case.inputs_as("torch", cotangent=True)
    assert sorted(got) == sorted([*case.inputs, "d_output"])
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 for x in got.values())
    np.testing.assert_array_equal(got["q"].float().numpy(), case.inputs["q"].astype(np.float32))
    assert sorted(case.inputs_as("numpy")) == sorted(case.inputs)


def test_inputs_as_names_an_unknown_or_unavailable_library(small):
    opened = golden.load_suite(small)
    case = opened.load(next(iter(opened.cases)))
    with pytest.raises(ValueError, match="unknown backend 'tensorflow'"):
        case.inputs_as("tensorflow")
    from relpos_ref import backends

    missing = next((n for n in backends.names() if backends.get(n).unavailable_reason()), None)
    if missing is None:
        pytest.skip("every backend is available here")
    with pytest.raises(ValueError, match=rf"^`library` {missing!r} cannot run here: "):
        case.inputs_as(missing)
