"""A suite is one flat directory of plain files (issue 15, category 2).

Names in the manifest are the bare file names their case ids imply; a
``../``, an absolute path, a subdirectory or another case's file is refused
when the manifest is opened, before any case file is read. A symbolic link,
directory or special file in place of a suite file is refused by `verify`,
`Suite.load` (so `check` and the plugin) and `generate`'s comparison with an
existing suite. Each test forges the manifest with a correct digest, as an
adversary would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _golden import SMALL, forge_manifest, make_suite, read_manifest, right_output, write_results

from relpos_ref import golden
from relpos_ref.cli import main
from relpos_ref.golden import fileformat
from relpos_ref.golden import suite as suite_module
from relpos_ref.golden.manifest import MANIFEST, SCHEMA


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_suite(tmp_path_factory.mktemp("containment") / "golden")


@pytest.fixture
def suite(pristine, tmp_path):
    return Path(shutil.copytree(pristine, tmp_path / "golden"))


@pytest.fixture
def no_reads(monkeypatch):
    """Fail the test if any case file is read."""
    def refuse(*args, **kwargs):
        raise AssertionError("a case file was read")

    monkeypatch.setattr(suite_module, "loads_file", refuse)


def _names(suite: Path) -> dict[str, str]:
    outside = suite.parent / "outside.safetensors"
    shutil.copyfile(suite / read_manifest(suite)["cases"][0]["file"], outside)
    other = read_manifest(suite)["cases"][1]["file"]
    return {
        "parent": "../outside.safetensors",
        "absolute": str(outside),
        "etc-passwd": "/etc/passwd",
        "nested": f"sub/{other}",
        "backslash": "sub\\x.safetensors",
        "dot": ".",
        "dotdot": "..",
        "empty": "",
        "hidden": "." + other,
        "another-case": other,
        "manifest": MANIFEST,
        "wrong-extension": read_manifest(suite)["cases"][0]["file"].replace(".safetensors",
                                                                             ".npz"),
    }


NAMES = ["parent", "absolute", "etc-passwd", "nested", "backslash", "dot", "dotdot", "empty",
         "hidden", "another-case", "manifest", "wrong-extension"]


def _point_case_0_at(suite: Path, key: str) -> str:
    name = _names(suite)[key]
    forge_manifest(suite, lambda m: m["cases"][0].__setitem__("file", name))
    return name


@pytest.mark.parametrize("key", NAMES)
def test_verify_refuses_a_file_name_that_is_not_the_cases_own(suite, key, no_reads):
    _point_case_0_at(suite, key)
    with pytest.raises(golden.SuiteError, match="is not the bare file name of case"):
        golden.verify(suite)


@pytest.mark.parametrize("key", NAMES)
def test_check_refuses_a_file_name_that_is_not_the_cases_own(suite, key, tmp_path, no_reads):
    mine = tmp_path / "mine"
    mine.mkdir()
    _point_case_0_at(suite, key)
    with pytest.raises(golden.SuiteError, match="is not the bare file name of case"):
        golden.check(suite, mine)


@pytest.mark.parametrize("key", ["absolute", "parent", "etc-passwd"])
def test_the_plugin_refuses_a_file_name_outside_the_suite(suite, key, tmp_path):
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text("def test_x(golden_case):\n    pass\n")
    name = _point_case_0_at(suite, key)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--golden-dir={suite}"],
        cwd=project, capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert run.returncode == 4  # a usage error: no test ran on the suite
    assert "is not the bare file name of case" in run.stderr and repr(name) in run.stderr


def test_the_cli_names_the_manifest_and_exits_2(suite, capsys):
    _point_case_0_at(suite, "absolute")
    assert main(["verify", str(suite)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json: cases[0]: file" in err


# -- links, directories and special files inside a suite ------------------------------


def _replace_with_link(suite: Path, name: str) -> Path:
    target = suite.parent / f"elsewhere-{name}"
    shutil.move(suite / name, target)
    (suite / name).symlink_to(target)
    return target


def test_a_linked_case_file_is_reported_by_verify_and_refused_by_load(suite):
    name = read_manifest(suite)["cases"][0]["file"]
    _replace_with_link(suite, name)
    report = golden.verify(suite)
    assert f"{name} is a symbolic link, not a plain file" in report.problems
    with pytest.raises(golden.SuiteError, match="is a symbolic link, not a plain file"):
        golden.load_suite(suite).load(SMALL[0].id)


def test_a_linked_case_file_is_refused_by_check(suite, tmp_path):
    mine = write_results(tmp_path / "mine", suite, right_output)
    _replace_with_link(suite, read_manifest(suite)["cases"][0]["file"])
    with pytest.raises(golden.SuiteError, match="is a symbolic link, not a plain file"):
        golden.check(suite, mine)


def test_a_linked_manifest_is_refused(suite):
    _replace_with_link(suite, MANIFEST)
    with pytest.raises(golden.SuiteError, match=r"manifest\.json is a symbolic link"):
        golden.load_suite(suite)


def test_a_linked_schema_is_reported(suite):
    _replace_with_link(suite, SCHEMA)
    assert f"{SCHEMA} is a symbolic link, not a plain file" in golden.verify(suite).problems


def test_a_directory_in_place_of_a_case_file_is_reported(suite):
    name = read_manifest(suite)["cases"][2]["file"]
    (suite / name).unlink()
    (suite / name).mkdir()
    assert f"{name} is a directory, not a plain file" in golden.verify(suite).problems
    with pytest.raises(golden.SuiteError, match="is a directory, not a plain file"):
        golden.load_suite(suite).load(SMALL[2].id)


def test_a_subdirectory_is_unexpected(suite):
    (suite / "extra").mkdir()
    (suite / "extra" / "x.safetensors").write_bytes(b"")
    assert "unexpected directory: extra" in golden.verify(suite).problems


def test_a_stray_link_is_unexpected(suite):
    (suite / "link.safetensors").symlink_to("/etc/passwd")
    assert "unexpected symbolic link: link.safetensors" in golden.verify(suite).problems


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_named_pipe_is_reported_without_blocking(suite):
    name = read_manifest(suite)["cases"][3]["file"]
    (suite / name).unlink()
    os.mkfifo(suite / name)
    assert f"{name} is a special file, not a plain file" in golden.verify(suite).problems
    os.mkfifo(suite / "pipe")
    assert "unexpected special file: pipe" in golden.verify(suite).problems


def test_a_dangling_link_for_a_case_file_is_reported(suite):
    name = read_manifest(suite)["cases"][1]["file"]
    (suite / name).unlink()
    (suite / name).symlink_to(suite.parent / "nowhere")
    assert f"{name} is a symbolic link, not a plain file" in golden.verify(suite).problems


def test_generate_does_not_take_a_suite_with_a_link_for_the_same_suite(suite):
    # the same bytes behind a link are not the same suite: the link is replaced, not kept
    _replace_with_link(suite, read_manifest(suite)["cases"][0]["file"])
    with pytest.raises(golden.SuiteError, match="already holds a different golden suite"):
        golden.generate(suite, SMALL)
    result = golden.generate(suite, SMALL, force=True)
    assert result.status == "replaced" and golden.verify(suite).ok
    assert not any(p.is_symlink() for p in suite.iterdir())


def test_npz_members_outside_the_archive_root_are_refused(tmp_path):
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("../output.npy", b"")
    (tmp_path / "x.npz").write_bytes(buf.getvalue())
    with pytest.raises(fileformat.CorruptFileError, match=r"is not a flat \.npy array"):
        fileformat.load(tmp_path / "x.npz")
