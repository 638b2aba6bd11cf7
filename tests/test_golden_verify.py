"""`verify` re-derives, not just re-hashes (issue 15, category 3).

Every forgery here keeps the hashes and the digest consistent, as a careful
adversary would; only re-deriving the case from its scheme, parameters,
dtype and seed can see it. `verify` reports each; `Suite.load` refuses the
case, so `check` and the pytest plugin never hand a forged scale or
tolerance to the code under test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _golden import (
    SMALL,
    forge_arrays,
    forge_manifest,
    make_suite,
    read_manifest,
    right_output,
    write_results,
)

from relpos_ref import golden
from relpos_ref.golden import suite as suite_module


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_suite(tmp_path_factory.mktemp("verify") / "golden")


@pytest.fixture
def suite(pristine, tmp_path):
    return Path(shutil.copytree(pristine, tmp_path / "golden"))


def _tolerance(field, value):
    def edit(m):
        m["cases"][0]["arrays"]["output"]["tolerance"][field] = value(
            m["cases"][0]["arrays"]["output"]["tolerance"])
    return edit


def _case(field, value):
    def edit(m):
        m["cases"][0][field] = value(m["cases"][0])
    return edit


def _param(name, value):
    def edit(m):
        params = m["cases"][0]["params"]
        if value is None:
            params.pop(name)
        else:
            params[name] = value(params.get(name))
    return edit


def _role(name, role):
    def edit(m):
        m["cases"][0]["arrays"][name]["role"] = role
    return edit


def _loose(m):
    tol = m["cases"][0]["arrays"]["output"]["tolerance"]
    tol["atol"] = 1e6 * tol["e_max"]


FORGERIES = {
    # tolerances (the example first)
    "atol-1e6-e_max": (_loose, "tolerance does not follow the rule"),
    "atol-x10": (_tolerance("atol", lambda t: t["atol"] * 10), "does not follow the rule"),
    "atol-zero": (_tolerance("atol", lambda t: 0.0), "does not follow the rule"),
    "e_max-x10": (_tolerance("e_max", lambda t: t["e_max"] * 10), "is not the naive pipeline's"),
    "e_max-tiny": (_tolerance("e_max", lambda t: t["e_max"] / 10), "is not the naive pipeline's"),
    "k": (_tolerance("k", lambda t: t["k"] * 100), "tolerance field `k`"),
    "rtol": (_tolerance("rtol", lambda t: 0.5), "tolerance field `rtol`"),
    "ulp_floor": (_tolerance("ulp_floor", lambda t: 1e6), "tolerance field `ulp_floor`"),
    "rule": (_tolerance("rule", lambda t: "anything goes"), "tolerance field `rule`"),
    "max_abs_golden": (_tolerance("max_abs_golden", lambda t: 1e9), "does not follow the rule"),
    # the case's own numbers
    "scale": (_case("scale", lambda c: c["scale"] * 2), "is not the case's"),
    "scale-as-text": (_case("scale", lambda c: str(c["scale"])), "is not the case's"),
    "naive_method": (_case("naive_method", lambda c: "definition"), "naive_method 'definition'"),
    "seed": (_case("seed", lambda c: c["seed"] + 1), "describe case"),
    "dtype": (_case("dtype", lambda c: "float64"), "describe case"),
    "variant": (_case("variant", lambda c: "no-such-variant"), "describe case shaw/no-such-"),
    "scheme": (_case("scheme", lambda c: "no-such-scheme"), "does not know this case"),
    # parameters
    "param-K": (_param("K", lambda v: v + 1), "describe case"),
    "param-extra": (_param("window", lambda v: 3), "does not know this case"),
    "param-removed": (_param("K", None), "parameter `K` is 'absent', the case's own is 4"),
    "param-float-for-int": (_param("K", lambda v: float(v)), "must be an integer >= 1, got 4.0"),
    "param-bool-for-int": (_param("t_q", lambda v: True), "must be an integer >= 1, got True"),
    # roles
    "role-golden-as-index": (_role("output", "index"), "is declared 'index', it is 'golden'"),
    "role-golden-as-input": (_role("output", "input"), "is declared 'input', it is 'golden'"),
    "role-input-as-index": (_role("q", "index"), "is declared 'index', it is 'input'"),
    "role-index-as-input": (_role("index", "input"), "is declared 'input', it is 'index'"),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_verify_reports_a_consistent_forgery_of_the_manifest(suite, name):
    edit, text = FORGERIES[name]
    forge_manifest(suite, edit)
    report = golden.verify(suite)
    assert not report.ok
    assert any(text in p for p in report.problems), report.problems
    # the other cases are untouched and say nothing
    assert all(p.startswith(SMALL[0].id) for p in report.problems), report.problems


@pytest.mark.parametrize("name", ["atol-1e6-e_max", "scale", "role-golden-as-index", "param-K"])
def test_load_refuses_a_forged_case(suite, name):
    forge_manifest(suite, FORGERIES[name][0])
    opened = golden.load_suite(suite)
    with pytest.raises(golden.SuiteError, match=FORGERIES[name][1]):
        opened.load(next(iter(opened.cases)))
    assert opened.load(SMALL[2].id).id == SMALL[2].id  # the others still load


def test_check_does_not_accept_a_result_off_by_half_under_a_forged_tolerance(suite, tmp_path):
    def off(case):
        return {"output": right_output(case)["output"] + 0.5}

    mine = write_results(tmp_path / "mine", suite, off)
    forge_manifest(suite, _loose)
    with pytest.raises(golden.SuiteError, match="tolerance does not follow the rule"):
        golden.check(suite, mine)


def test_the_plugin_never_hands_a_forged_scale_to_the_kernel(suite, tmp_path):
    forge_manifest(suite, FORGERIES["scale"][0])
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text(textwrap.dedent("""
        def test_scale(golden_case):
            assert golden_case.scale > 0
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--golden-dir={suite}"],
        cwd=project, capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert run.returncode == 1 and "3 passed, 1 error" in run.stdout
    assert f"golden case {SMALL[0].id}:" in run.stdout and "is not the case's" in run.stdout
    assert "Traceback" not in run.stdout


def test_an_unknown_case_is_said_to_be_unknown(suite):
    def rename(m):
        entry = m["cases"][0]
        entry["scheme"] = "someone-elses"
        entry["id"] = "someone-elses/" + entry["id"].split("/", 1)[1]
        entry["file"] = entry["id"].replace("/", "__") + ".safetensors"

    old = read_manifest(suite)["cases"][0]["file"]
    forge_manifest(suite, rename)
    os.rename(suite / old, suite / read_manifest(suite)["cases"][0]["file"])
    report = golden.verify(suite)
    assert any("someone-elses/" in p and "does not know this case" in p
               for p in report.problems), report.problems


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("tolerance_rule", "atol = 1", "`tolerance_rule` is not the one"),
        ("naive_pipeline", ["float32 everything"], "`naive_pipeline` is not the one"),
    ],
)
def test_verify_reports_a_forged_rule_or_pipeline(suite, field, value, text):
    forge_manifest(suite, lambda m: m.__setitem__(field, value))
    assert any(text in p for p in golden.verify(suite).problems)


def test_verify_reports_a_forged_declared_dtype_and_shape(suite):
    def edit(m):
        m["cases"][0]["arrays"]["weights"]["dtype"] = "float32"
        m["cases"][1]["arrays"]["weights"]["shape"] = [1, 2, 3]

    forge_manifest(suite, edit)
    problems = golden.verify(suite).problems
    assert any(p.startswith(SMALL[0].id) and "`weights` is float64" in p for p in problems)
    # a shape smaller than stored: the file is larger than the manifest allows, and is
    # refused before it is read (issue 26, item 6)
    name = read_manifest(suite)["cases"][1]["file"]
    assert any(p.startswith(f"{suite / name} has ") and
               f"more than the arrays of case {SMALL[1].id} with their headers can take" in p
               for p in problems)


def test_verify_reports_a_declared_array_that_is_not_stored(suite):
    def edit(m):
        m["cases"][0]["arrays"]["extra"] = dict(m["cases"][0]["arrays"]["index"])

    forge_manifest(suite, edit)
    assert any("arrays" in p and "differ from the manifest's" in p
               for p in golden.verify(suite).problems)


# -- forged arrays, rehashed -----------------------------------------------------------


@pytest.mark.parametrize(
    ("array", "change", "text"),
    [
        ("q", lambda a: a * 2, "input `q` differs from its regeneration from the seed"),
        ("v", lambda a: a[::-1].copy(), "input `v` differs from its regeneration"),
        ("index", lambda a: np.minimum(a + 1, a.max()), "`index` differs from its recomputation"),
        ("output", lambda a: a + 1e-9, "`output` differs from its recomputation"),
        ("weights", lambda a: a * (1 + 1e-12), "`weights` differs from its recomputation"),
        ("logits", lambda a: -a, "`logits` differs from its recomputation"),
        ("output", lambda a: a[:, :, :1].copy(), "`output` has shape"),
    ],
    ids=["q", "v", "index", "output", "weights", "logits", "output-shape"],
)
def test_verify_reports_a_consistent_forgery_of_an_array(suite, array, change, text):
    forge_arrays(suite, 0, lambda arrays: arrays.__setitem__(array, change(arrays[array])))
    problems = golden.verify(suite).problems
    assert any(text in p for p in problems), problems


def test_a_forged_input_with_matching_goldens_is_still_reported(suite):
    # the adversary recomputes every golden from a changed input: the seed says otherwise
    forge_arrays(suite, 2, lambda arrays: arrays.__setitem__("k", arrays["k"] + 1))
    assert any("input `k` differs from its regeneration" in p
               for p in golden.verify(suite).problems)


def test_case_problems_is_empty_for_every_intact_case(pristine):
    opened = golden.load_suite(pristine)
    for cid, entry in opened.cases.items():
        arrays = opened.load(cid, rederive=False).arrays
        assert suite_module.case_problems(entry, arrays) == []
