"""Golden suites on disk: file formats, atomic generation, verify, check, CLI, pytest plugin."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from relpos_ref import golden
from relpos_ref.cli import main
from relpos_ref.golden import fileformat
from relpos_ref.golden.dtypes import numpy_dtype
from relpos_ref.golden.manifest import MANIFEST, SCHEMA, content_digest, render
from relpos_ref.golden.pipeline import naive_arrays
from relpos_ref.testing import assert_matches

SELECT = ["shaw/clip/*", "music/skew/*", "grid2d/non-square/*", "bias/decode-step/*"]
CASES = golden.default_cases().select(SELECT)


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite") / "golden"
    result = golden.generate(out, CASES)
    assert result.status == "written" and result.cases == len(CASES) == 16
    return out


@pytest.fixture
def suite_copy(suite_dir, tmp_path):
    dst = tmp_path / "golden"
    shutil.copytree(suite_dir, dst)
    return dst


def _sample_arrays():
    rng = np.random.default_rng(1)
    return {
        "a": rng.standard_normal((2, 3)).astype(np.float32),
        "b": rng.standard_normal(4).astype(numpy_dtype("bfloat16")),
        "c": rng.standard_normal((1, 2, 2)).astype(np.float16),
        "d": rng.standard_normal(3),
        "e": np.arange(6, dtype=np.int64).reshape(2, 3),
        "f": np.array([[True, False]]),
        "g": np.zeros((0, 3), dtype=np.float32),
        "h": np.float64(2.5).reshape(()),
    }


# -- file formats ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", golden.FORMATS)
def test_round_trip_is_bit_exact_and_deterministic(fmt, tmp_path):
    arrays = _sample_arrays()
    data = fileformat.dumps(arrays, fmt)
    assert data == fileformat.dumps(arrays, fmt)
    path = tmp_path / f"x{fileformat.EXTENSIONS[fmt]}"
    path.write_bytes(data)
    back = fileformat.load(path, dtypes={n: a.dtype.name for n, a in arrays.items()})
    assert back.keys() == arrays.keys()
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype and back[name].shape == a.shape
        assert fileformat.array_sha256(back[name]) == fileformat.array_sha256(a)


def test_safetensors_files_load_with_the_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="safetensors is not installed")
    arrays = {k: v for k, v in _sample_arrays().items() if k != "b"}  # numpy has no bfloat16
    path = tmp_path / "x.safetensors"
    path.write_bytes(fileformat.dumps(arrays, "safetensors"))
    loaded = st.load_file(str(path))
    for name, a in arrays.items():
        assert np.array_equal(loaded[name], a) and loaded[name].dtype == a.dtype


def test_bfloat16_loads_with_safetensors_torch(tmp_path):
    pytest.importorskip("safetensors", reason="safetensors is not installed")
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from safetensors.torch import load_file

    b = _sample_arrays()["b"]
    path = tmp_path / "x.safetensors"
    path.write_bytes(fileformat.dumps({"b": b}, "safetensors"))
    t = load_file(str(path))["b"]
    assert t.dtype == torch.bfloat16
    assert np.array_equal(t.float().numpy(), b.astype(np.float32))


@pytest.mark.parametrize("fmt", golden.FORMATS)
@pytest.mark.parametrize("keep", [0, 7, 30, -1])
def test_truncated_files_are_reported(fmt, keep, tmp_path):
    data = fileformat.dumps(_sample_arrays(), fmt)
    path = tmp_path / f"x{fileformat.EXTENSIONS[fmt]}"
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    with pytest.raises(fileformat.CorruptFileError, match=r"truncated|too short|not a valid"):
        fileformat.load(path)


# -- generate -------------------------------------------------------------------


def test_suite_holds_every_intermediate(suite_dir):
    manifest = json.loads((suite_dir / MANIFEST).read_text())
    assert manifest["format_version"] == golden.FORMAT_VERSION
    assert sorted(p.name for p in suite_dir.iterdir()) == sorted(
        [MANIFEST, SCHEMA, *(c["file"] for c in manifest["cases"])]
    )
    entry = next(c for c in manifest["cases"] if c["id"].startswith("shaw/clip/"))
    roles = {n: a["role"] for n, a in entry["arrays"].items()}
    assert roles == {
        "q": "input", "k": "input", "v": "input", "key_table": "input", "value_table": "input",
        "distance": "index", "index": "index", "valid": "index",
        "position": "golden", "logits": "golden", "weights": "golden", "output": "golden",
        "d_output": "cotangent", "dq": "golden", "dk": "golden", "dv": "golden",
        "d_key_table": "golden", "d_value_table": "golden",
    }
    assert entry["arrays"]["d_output"]["dtype"] == entry["dtype"]
    assert entry["arrays"]["d_output"]["shape"] == entry["arrays"]["output"]["shape"]
    tol = entry["arrays"]["output"]["tolerance"]
    assert tol["atol"] == max(tol["k"] * tol["e_max"], tol["ulp_floor"]) and tol["rule"]
    assert entry["scale"] == 0.25  # 1 / sqrt(16)


def test_manifest_matches_its_json_schema(suite_dir):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    manifest = json.loads((suite_dir / MANIFEST).read_text())
    schema = json.loads(golden.schema_path().read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(manifest, schema)
    broken = {**manifest, "format_version": golden.FORMAT_VERSION + 1}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


@pytest.mark.parametrize("fmt", golden.FORMATS)
def test_generating_twice_is_byte_identical(fmt, tmp_path):
    cases = golden.default_cases().select(["shaw/masked/*", "general/full/*"])
    a = golden.generate(tmp_path / "a", cases, fmt=fmt)
    b = golden.generate(tmp_path / "b", cases, fmt=fmt)
    assert a.bytes == b.bytes
    for p in sorted((tmp_path / "a").iterdir()):
        assert p.read_bytes() == (tmp_path / "b" / p.name).read_bytes(), p.name
    again = golden.generate(tmp_path / "a", cases, fmt=fmt)
    assert again.status == "unchanged"
    assert golden.verify(tmp_path / "a").ok


def test_a_different_suite_is_not_overwritten_without_force(suite_copy):
    before = {p.name: p.read_bytes() for p in suite_copy.iterdir()}
    other = golden.default_cases().select(["general/full/*/float32/*"])
    with pytest.raises(golden.SuiteError, match="already holds a different golden suite"):
        golden.generate(suite_copy, other)
    assert {p.name: p.read_bytes() for p in suite_copy.iterdir()} == before
    assert not [p for p in suite_copy.parent.iterdir() if p.name.startswith(".golden.")]
    result = golden.generate(suite_copy, other, force=True)
    assert result.status == "replaced" and len(list(suite_copy.iterdir())) == 3
    assert golden.verify(suite_copy).ok


def test_a_foreign_directory_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(golden.SuiteError, match="not empty and holds no golden suite"):
        golden.generate(tmp_path, CASES[:1])
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_unwritable_location_is_one_clear_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(golden.SuiteError, match=r"its parent .*file is not a directory"):
        golden.generate(tmp_path / "file" / "golden", CASES[:1])
    if not Path("/proc/self").exists():
        pytest.skip("needs /proc, a directory nobody can write to")
    with pytest.raises(golden.SuiteError, match="cannot write to /proc"):
        golden.generate("/proc/golden-suite", CASES[:1])


@pytest.mark.parametrize("existing", [False, True])
def test_interrupted_generation_leaves_nothing_behind(existing, suite_copy, monkeypatch):
    from relpos_ref.golden import build as suite_module

    target = suite_copy if existing else suite_copy.parent / "fresh"
    before = {p.name: p.read_bytes() for p in suite_copy.iterdir()}
    real = suite_module.build_case
    calls = []

    def interrupted(case, **kw):
        calls.append(case.id)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(case, **kw)

    monkeypatch.setattr(suite_module, "build_case", interrupted)
    with pytest.raises(KeyboardInterrupt):
        golden.generate(target, golden.default_cases().select(["music/*"]), force=True)
    assert {p.name: p.read_bytes() for p in suite_copy.iterdir()} == before
    assert not (suite_copy.parent / "fresh").exists()
    assert sorted(p.name for p in suite_copy.parent.iterdir()) == ["golden"]


def test_goldens_on_another_backend_agree(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    cases = golden.default_cases().select(["shaw/clip/*/float64/*", "music/skew/*/float32/*"])
    golden.generate(tmp_path / "np", cases)
    golden.generate(tmp_path / "pt", cases, backend="torch")
    report = golden.verify(tmp_path / "pt")  # recomputed on NumPy
    assert report.ok, report.problems


# -- verify ---------------------------------------------------------------------


def test_verify_passes_on_a_fresh_suite(suite_dir):
    report = golden.verify(suite_dir)
    assert report.ok, report.problems
    assert report.cases == 16 and report.arrays > 16 * 8


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["header", "padding", "data", "last"])
def test_verify_catches_a_flipped_byte_in_a_case_file(suite_copy, where):
    path = sorted(suite_copy.glob("*.safetensors"))[0]
    size = path.stat().st_size
    header = int.from_bytes(path.read_bytes()[:8], "little")
    offset = {"header": 20, "padding": 8 + header - 1, "data": 8 + header + 5, "last": size - 1}
    _flip(path, offset[where])
    report = golden.verify(suite_copy)
    assert not report.ok
    assert any(path.name in p and "SHA-256" in p for p in report.problems)


@pytest.mark.parametrize("offset", [0, 100, 5000, -2])
def test_verify_catches_a_flipped_byte_in_the_manifest(suite_copy, offset):
    path = suite_copy / MANIFEST
    _flip(path, offset % path.stat().st_size)
    with pytest.raises(golden.SuiteError, match=r"manifest\.json"):
        golden.verify(suite_copy)


def test_verify_catches_a_flipped_byte_in_the_schema(suite_copy):
    _flip(suite_copy / SCHEMA, 10)
    report = golden.verify(suite_copy)
    assert any("manifest.schema.json differs" in p for p in report.problems)


def test_verify_catches_missing_and_extra_files(suite_copy):
    victim = sorted(suite_copy.glob("*.safetensors"))[3]
    victim.unlink()
    (suite_copy / "stray.npz").write_bytes(b"x")
    report = golden.verify(suite_copy)
    assert f"missing file: {victim.name}" in report.problems
    assert "unexpected file: stray.npz" in report.problems


def test_verify_catches_a_manifest_edited_by_hand(suite_copy):
    path = suite_copy / MANIFEST
    manifest = json.loads(path.read_text())
    entry = manifest["cases"][0]
    entry["arrays"]["output"]["tolerance"]["atol"] *= 10
    # an edit that keeps the old digest
    path.write_text(json.dumps(manifest, sort_keys=True, indent=1) + "\n")
    with pytest.raises(golden.SuiteError, match="edited after generation"):
        golden.verify(suite_copy)
    # an editor who also updates the digest is caught by the tolerance rule
    manifest.pop("digest")
    path.write_bytes(render(manifest))
    report = golden.verify(suite_copy)
    assert any("tolerance does not follow the rule" in p for p in report.problems)
    # and one who changes a parameter is caught by the id and the recomputation
    entry["params"]["K"] = 5
    path.write_bytes(render(manifest))
    assert content_digest(json.loads(path.read_text())) == json.loads(path.read_text())["digest"]
    assert not golden.verify(suite_copy).ok


def test_verify_catches_a_truncated_file(suite_copy):
    path = sorted(suite_copy.glob("*.safetensors"))[1]
    path.write_bytes(path.read_bytes()[:-100])
    report = golden.verify(suite_copy)
    assert any("truncated" in p for p in report.problems)


def test_verify_catches_a_consistent_but_wrong_golden(suite_copy):
    """Rewrite a file and its hashes with a perturbed output: only recomputation sees it."""
    from relpos_ref.golden.fileformat import array_sha256, dumps, load

    path = suite_copy / MANIFEST
    manifest = json.loads(path.read_text())
    entry = manifest["cases"][0]
    arrays = load(suite_copy / entry["file"], dtypes={})
    arrays["output"] = arrays["output"] + 1e-9
    data = dumps(arrays, "safetensors")
    (suite_copy / entry["file"]).write_bytes(data)
    import hashlib

    entry["file_sha256"] = hashlib.sha256(data).hexdigest()
    entry["arrays"]["output"]["sha256"] = array_sha256(arrays["output"])
    manifest.pop("digest")
    path.write_bytes(render(manifest))
    report = golden.verify(suite_copy)
    assert any("`output` differs from its recomputation" in p for p in report.problems)
    assert all("`output`" in p for p in report.problems)


def test_verify_of_an_npz_suite(tmp_path):
    golden.generate(tmp_path / "g", CASES, fmt="npz")
    assert golden.verify(tmp_path / "g").ok
    case = golden.load_suite(tmp_path / "g").load(CASES[3].id)  # a bfloat16 case
    assert case.dtype == "bfloat16" and case.inputs["q"].dtype == numpy_dtype("bfloat16")


# -- check ----------------------------------------------------------------------


def _write_obtained(directory: Path, suite_dir: Path, make, fmt="safetensors"):
    directory.mkdir(exist_ok=True)
    suite = golden.load_suite(suite_dir)
    for cid in suite.cases:
        case = suite.load(cid)
        arrays = make(case)
        if arrays is not None:
            stem = case.entry["file"].rsplit(".", 1)[0]
            (directory / (stem + fileformat.EXTENSIONS[fmt])).write_bytes(
                fileformat.dumps(arrays, fmt)
            )
    return directory


def _naive_outputs(case):
    c = golden.Case.make(case.scheme, case.entry["variant"], dtype=case.dtype,
                         seed=case.entry["seed"], **case.params)
    naive = naive_arrays(c, c.inputs())
    dt = numpy_dtype(case.dtype)
    return {n: naive[n].astype(dt) for n in ("logits", "weights", "output")}


@pytest.mark.parametrize("fmt", golden.FORMATS)
def test_check_passes_the_naive_pipeline_in_every_dtype(suite_dir, tmp_path, fmt):
    obtained = _write_obtained(tmp_path / "mine", suite_dir, _naive_outputs, fmt)
    report = golden.check(suite_dir, obtained)
    assert report.ok and len(report.results) == 16 and not report.missing


def test_check_reports_the_worst_element(suite_dir, tmp_path):
    def perturbed(case):
        out = case.expected["output"].copy()
        if case.id.startswith("shaw/clip/") and case.dtype == "float32":
            out[1, 2, 3, 4] += 0.01
        return {"output": out, "index": case.expected["index"]} if "index" in case.expected \
            else {"output": out}

    obtained = _write_obtained(tmp_path / "mine", suite_dir, perturbed)
    report = golden.check(suite_dir, obtained)
    assert not report.ok
    bad = report.results["shaw/clip/b2-h4-q17-k33-d16-K4/float32/s0"]
    out = next(r for r in bad if r.name == "output")
    assert out.worst_index == (1, 2, 3, 4) and out.mismatches == 1
    assert out.max_error == pytest.approx(0.01, rel=1e-3) and out.ratio_to_naive > 100
    text = "\n".join(report.lines())
    assert "FAIL shaw/clip/b2-h4-q17-k33-d16-K4/float32/s0" in text and "[1, 2, 3, 4]" in text
    assert "15 of 16 case(s) match" in text
    assert json.loads(json.dumps(report.as_dict()))["ok"] is False


def test_check_rejects_wrong_shapes_dtypes_and_names(suite_dir, tmp_path):
    target = golden.load_suite(suite_dir).load(CASES[0].id)
    stem = target.entry["file"].rsplit(".", 1)[0]
    mine = tmp_path / "mine"
    mine.mkdir()
    bad = {
        "output": np.zeros((3, 3)),
        "weights": target.expected["weights"].astype(np.int64),
        "ouptut": np.zeros(1),
    }
    (mine / f"{stem}.npz").write_bytes(fileformat.dumps(bad, "npz"))
    with pytest.raises(golden.SuiteError) as err:
        golden.check(suite_dir, mine)
    msg = str(err.value)
    assert "`output` must have shape (2, 4, 17, 16), got (3, 3)" in msg
    assert "`weights` must be a floating array, got dtype int64" in msg
    assert "`ouptut` is not an array of case" in msg


def test_check_rejects_a_narrower_dtype(suite_dir, tmp_path):
    target = golden.load_suite(suite_dir).load(CASES[0].id)  # float64
    with pytest.raises(golden.ObtainedError, match="narrower than the case's float64"):
        target.compare({"output": target.expected["output"].astype(np.float32)})


def test_check_needs_at_least_one_matching_file(suite_dir, tmp_path):
    (tmp_path / "mine").mkdir()
    with pytest.raises(golden.SuiteError, match="holds no file named like a selected case"):
        golden.check(suite_dir, tmp_path / "mine")


def test_assert_matches_prints_a_readable_summary(suite_dir):
    case = golden.load_suite(suite_dir).load(CASES[1].id)  # float32
    good = {"output": case.expected["output"].astype(np.float32)}
    assert_matches(case, good)
    wrong = {"output": good["output"] * 1.01}
    with pytest.raises(AssertionError, match=r"output: MISMATCH \d+/\d+, max \|err\|"):
        assert_matches(case, wrong)


def test_assert_matches_accepts_torch_tensors(suite_dir):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    case = golden.load_suite(suite_dir).load(CASES[3].id)  # bfloat16
    out = torch.tensor(case.expected["output"]).to(torch.bfloat16)
    assert_matches(case, {"output": out})


# -- command line ---------------------------------------------------------------


def test_cli_list(capsys):
    assert main(["list", "--select", "grid2d/*", "--dtypes", "float16"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines == [c.id for c in golden.default_cases().select(["grid2d/*"],
                                                                 dtypes=["float16"])]


def test_cli_generate_verify_check(tmp_path, capsys):
    out = tmp_path / "golden"  # bias's five forward cases and its decode case
    assert main(["generate", "--out", str(out), "--select", "bias/*", "--dtypes", "float32"]) == 0
    captured = capsys.readouterr()
    assert "wrote 6 cases" in captured.out and captured.err == ""  # no bar off a terminal
    assert main(["verify", str(out)]) == 0
    assert "6 cases and" in capsys.readouterr().out
    mine = _write_obtained(tmp_path / "mine", out,
                           lambda c: {"output": c.expected["output"].astype(np.float32)})
    assert main(["check", str(out), str(mine)]) == 0
    assert "6 of 6 case(s) match" in capsys.readouterr().out
    assert main(["check", str(out), str(mine), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checked"] == 6
    _flip(sorted(out.glob("*.safetensors"))[0], 40)
    assert main(["verify", str(out)]) == 1
    assert "SHA-256 differs from the manifest" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "--out", "{tmp}/g", "--select", "t9/*"], "--select 't9/*' matches no case"),
        (["verify", "{tmp}/nothing"], "is not a directory"),
        (["check", "{tmp}", "{tmp}"], "has no manifest.json"),
    ],
)
def test_cli_errors_are_one_line(argv, message, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("relpos-ref: error: ") and message in err and "\n" not in err


def test_cli_check_exit_status_on_mismatch(suite_dir, tmp_path, capsys):
    mine = _write_obtained(tmp_path / "mine", suite_dir,
                           lambda c: {"output": c.expected["output"].astype(np.float64) + 1.0})
    assert main(["check", str(suite_dir), str(mine), "--select", "music/*"]) == 1
    out = capsys.readouterr().out
    assert out.count("FAIL") == 4 and "0 of 4 case(s) match" in out


# -- the pytest plugin, from a separate tiny project -------------------------------


def _run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project, capture_output=True, text=True, env=env, timeout=300, check=False,
    )


def test_pytest_plugin_in_a_separate_project(suite_dir, tmp_path):
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_kernel.py").write_text(textwrap.dedent("""
        import numpy as np
        from relpos_ref.testing import assert_matches

        def my_attention(case):
            # a user's implementation: here the goldens in float32, broken for music
            dtype = np.float64 if case.dtype == "float64" else np.float32
            out = case.expected["output"].astype(dtype)
            if case.scheme == "music":
                out = out + 0.5
            return out

        def test_against_golden(golden_case):
            assert_matches(golden_case, {"output": my_attention(golden_case)})
    """))
    ok = _run_pytest(project, f"--golden-dir={suite_dir}", "--golden-select=shaw/*")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "4 passed" in ok.stdout
    bad = _run_pytest(project, f"--golden-dir={suite_dir}")
    assert bad.returncode == 1
    assert "12 passed" in bad.stdout and "4 failed" in bad.stdout
    assert "golden case music/skew/" in bad.stdout and "output: MISMATCH" in bad.stdout
    none = _run_pytest(project)  # no suite: the test fails (issue 26, item 5)
    assert none.returncode == 1 and "no golden suite: pass --golden-dir DIR" in none.stdout
    allowed = _run_pytest(project, "-rs", "--golden-allow-missing")
    assert allowed.returncode == 0 and "allowed by --golden-allow-missing" in allowed.stdout
    wrong = _run_pytest(project, f"--golden-dir={tmp_path}")
    assert wrong.returncode == 4 and "has no manifest.json" in wrong.stderr


def test_pytest_plugin_imports_nothing_heavy():
    code = (
        "import sys, relpos_ref.pytest_plugin; "
        "print(sorted(m for m in ('numpy', 'torch', 'jax', 'relpos_ref.golden') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
