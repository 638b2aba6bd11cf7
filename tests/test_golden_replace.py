"""Crash-safe replace (issue 15, category 5).

A `generate` is killed (``os._exit``, no cleanup) before and after every
file-system step it takes (in children forked by ``_crash_driver.py``, a
fresh interpreter, so this process never forks); each time the path must hold
the old suite or the new one, byte for byte, either at once or after the
next `load_suite` (what `verify`, `check` and the plugin call) or
`generate` finds the leftovers, and nothing may be left beside it. Also:
permissions follow the umask; ``--out .``, ``--out ..`` and a symbolic link
are refused clearly; two runs at once leave one valid suite and the loser
says why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import _crash_driver as driver
import pytest

from relpos_ref import golden
from relpos_ref.cli import main
from relpos_ref.golden import replace

OLD = driver.cases(driver.OLD)
NEW = driver.cases(driver.NEW)
DRIVER = Path(driver.__file__)


def _tree(path: Path) -> dict[str, bytes] | None:
    if not path.is_dir():
        return None
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def _beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    base = tmp_path_factory.mktemp("trees")
    golden.generate(base / "old", OLD)
    golden.generate(base / "new", NEW)
    return _tree(base / "old"), _tree(base / "new")


@pytest.fixture(scope="module", params=["replacing", "fresh"])
def killed(request, tmp_path_factory):
    """Directories where a generate was killed before and after each of its steps."""
    root = tmp_path_factory.mktemp(f"killed-{request.param}")
    run = subprocess.run([sys.executable, str(DRIVER), str(root), request.param],
                         capture_output=True, text=True, timeout=600, check=True)
    report = json.loads(run.stdout)
    assert report["total"] >= 10 and len(report["runs"]) == 2 * report["total"]
    assert all(code == 9 for _, _, code in report["runs"]), report["runs"]
    return request.param, root, report


def _check_killed_runs(killed, trees, tmp_path, recover):
    scenario, root, report = killed
    old, new = trees
    before = old if scenario == "replacing" else None
    outcomes = set()
    for n, when, _ in report["runs"]:
        # each recovery on a copy, so the other recovery sees the same leftovers
        parent = Path(shutil.copytree(root / f"{n}-{when}", tmp_path / f"{n}-{when}",
                                      symlinks=True))
        out = parent / "golden"
        now = _tree(out)
        if now not in (before, new):  # only between the two renames, and journaled
            assert (parent / ".golden.swap").is_file(), (n, when, _beside(out))
        recover(out)
        after = _tree(out)
        assert after in (before, new), (n, when)
        assert [b for b in _beside(out) if b != ".golden.lock"] == [], (n, when, _beside(out))
        if after is not None:
            assert golden.verify(out).ok
        outcomes.add("old" if after == before else "new")
    assert outcomes == {"old", "new"}  # the kills straddle the swap


def test_a_killed_generate_is_recovered_by_the_next_generate(killed, trees, tmp_path):
    _, root, report = killed
    for n, when, _ in report["runs"]:
        parent = Path(shutil.copytree(root / f"{n}-{when}", tmp_path / f"{n}-{when}",
                                      symlinks=True))
        out = parent / "golden"
        result = golden.generate(out, NEW, force=True)
        assert _tree(out) == trees[1], (n, when)
        assert result.status in ("written", "replaced", "unchanged")
        assert _beside(out) == [], (n, when, _beside(out))


def test_a_killed_generate_leaves_old_or_new_after_the_next_open(killed, trees, tmp_path):
    def recover(out):
        if out.exists() or (out.parent / ".golden.swap").exists():
            suite = golden.load_suite(out)
            assert suite.recovered is None or "interrupted" in suite.recovered \
                or "unfinished" in suite.recovered
        else:  # a fresh run killed before its swap: nothing to open, leftovers removed
            with pytest.raises(golden.SuiteError, match="is not a directory"):
                golden.load_suite(out)

    _check_killed_runs(killed, trees, tmp_path, recover)


@pytest.mark.parametrize("killed", ["replacing"], indirect=True)
def test_the_cli_says_what_it_recovered(killed, trees, tmp_path, capsys):
    _, root, report = killed
    # a kill that left the old suite aside and the new one not yet in place
    gaps = [f"{n}-{when}" for n, when, _ in report["runs"]
            if not (root / f"{n}-{when}" / "golden").exists()]
    assert gaps
    out = Path(shutil.copytree(root / gaps[0], tmp_path / "gap", symlinks=True)) / "golden"
    assert main(["verify", str(out)]) == 0
    err = capsys.readouterr().err
    assert err == f"relpos-ref: note: finished replacing {out}, interrupted last time\n"
    assert _tree(out) == trees[1]


@pytest.mark.parametrize("killed", ["replacing"], indirect=True)
def test_a_directory_made_after_the_crash_never_costs_a_suite(killed, trees, tmp_path):
    # Killed between the two renames, then `mkdir -p golden` (a script's set-up):
    # an empty directory gives way to the new suite; a non-empty one is refused and
    # nothing beside it is removed.
    _, root, report = killed
    gaps = [f"{n}-{when}" for n, when, _ in report["runs"]
            if not (root / f"{n}-{when}" / "golden").exists()]
    assert gaps
    for i, gap in enumerate(gaps):
        out = Path(shutil.copytree(root / gap, tmp_path / f"empty-{i}", symlinks=True)) / "golden"
        out.mkdir()
        assert main(["verify", str(out)]) == 0, gap
        assert _tree(out) == trees[1] and _beside(out) == [], gap
        out = Path(shutil.copytree(root / gap, tmp_path / f"full-{i}", symlinks=True)) / "golden"
        out.mkdir()
        (out / "mine.txt").write_text("keep")
        before = _beside(out)
        with pytest.raises(golden.SuiteError, match=r"the new suite is in \.golden\.tmp-"
                                                      r"[0-9a-f]{8}, the previous one in "
                                                      r"\.golden\.old-[0-9a-f]{8}.*in the way"):
            golden.load_suite(out)
        assert [b for b in _beside(out) if b != ".golden.lock"] == \
            [b for b in before if b != ".golden.lock"]
        assert (out / "mine.txt").read_text() == "keep"
        for name in before:
            if name.startswith((".golden.tmp-", ".golden.old-")):
                assert (out.parent / name / "manifest.json").is_file(), (gap, name)


def test_only_directories_generate_makes_count_as_leftovers(tmp_path, trees):
    out = tmp_path / "golden"
    golden.generate(out, NEW)
    backup = tmp_path / ".golden.old-backup"  # a user's own copy, named alike
    backup.mkdir()
    (backup / "data").write_text("precious")
    nested = tmp_path / ".golden.tmp-0123abcd"  # the right name, but not a flat suite
    (nested / "sub").mkdir(parents=True)
    other = tmp_path / ".golden.old-2024.tmp-89abcdef"  # another suite's run, golden.old-2024
    other.mkdir()
    (tmp_path / ".golden.old-2024.lock").write_text("")
    stray = tmp_path / ".golden.old-0123abcd"  # what a killed run leaves
    stray.mkdir()
    (stray / "manifest.json").write_text("{}")
    suite = golden.load_suite(out)
    assert suite.recovered == f"removed 1 unfinished suite(s) left beside {out}"
    assert not stray.exists()
    assert (backup / "data").read_text() == "precious"
    assert (nested / "sub").is_dir() and other.is_dir()
    assert (tmp_path / ".golden.old-2024.lock").exists()
    assert _tree(out) == trees[1]


@pytest.mark.parametrize("fail_at", [1, 2])
@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_an_interrupted_swap_leaves_a_whole_suite(tmp_path, trees, monkeypatch, fail_at, error):
    # Ctrl-C (or a failing rename, EBUSY on a mount point, say) at the first or the
    # second rename: the path holds the old suite or the new one, nothing beside it.
    out = tmp_path / "golden"
    golden.generate(out, OLD)
    real_rename = replace.os.rename
    calls = []

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == fail_at:
            if error is OSError:
                raise OSError(16, "Device or resource busy")
            real_rename(src, dst)
            raise KeyboardInterrupt
        return real_rename(src, dst)

    monkeypatch.setattr(replace.os, "rename", rename)
    with pytest.raises(error):
        golden.generate(out, NEW, force=True)
    monkeypatch.setattr(replace.os, "rename", real_rename)
    assert _tree(out) in trees
    if error is KeyboardInterrupt:
        assert _tree(out) == trees[1]  # the new suite was complete: the swap is finished
    assert _beside(out) == []
    assert golden.verify(out).ok


def test_out_is_read_the_way_the_system_reads_it(tmp_path, trees, monkeypatch):
    (tmp_path / "elsewhere" / "sub").mkdir(parents=True)
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "link").symlink_to(tmp_path / "elsewhere" / "sub")
    monkeypatch.chdir(tmp_path / "here")
    golden.generate("link/../golden", NEW)  # link/.. is `elsewhere`, not `here`
    assert _tree(tmp_path / "elsewhere" / "golden") == trees[1]
    assert not (tmp_path / "here" / "golden").exists()
    assert golden.verify("link/../golden").ok
    assert replace.resolve("link/../golden/") == tmp_path.resolve() / "elsewhere" / "golden"


def test_leftovers_that_cannot_be_removed_do_not_block_reading(tmp_path, trees, monkeypatch):
    out = tmp_path / "golden"
    golden.generate(out, NEW)
    (tmp_path / ".golden.tmp-0123abcd").mkdir()

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(replace, "_remove", refuse)
    suite = golden.load_suite(out)  # a read-only directory: the suite itself is intact
    assert suite.recovered is None and golden.verify(out).ok


def test_an_empty_out_is_refused_in_one_line(capsys):
    assert main(["generate", "--out", "", "--select", "bias/decode-step/*"]) == 2
    assert capsys.readouterr().err == "relpos-ref: error: the path is empty\n"


def _generate_in_a_new_process(out: Path, umask: int | None = None) -> subprocess.CompletedProcess:
    code = (
        "import os, sys\n"
        f"{f'os.umask({umask})' if umask is not None else ''}\n"
        "from relpos_ref.cli import main\n"
        "sys.exit(main(['generate', '--out', sys.argv[1], '--force', "
        "'--select', 'shaw/clip/*', '--dtypes', 'float32']))\n"
    )
    return subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True,
                          text=True, timeout=300, check=False)


# -- permissions ---------------------------------------------------------------------------


@pytest.mark.parametrize(("umask", "directory", "file"),
                         [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664)])
def test_permissions_follow_the_umask(tmp_path, umask, directory, file):
    out = tmp_path / "golden"
    run = _generate_in_a_new_process(out, umask)
    assert run.returncode == 0, run.stderr
    assert out.stat().st_mode & 0o777 == directory
    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {file}


# -- where a suite may go ------------------------------------------------------------------


def test_out_dot_is_refused_clearly(tmp_path, monkeypatch):
    out = tmp_path / "golden"
    golden.generate(out, OLD)
    monkeypatch.chdir(out)
    for given in (".", "./", str(out)):
        with pytest.raises(golden.SuiteError, match="is the current directory or one of its"):
            golden.generate(given, NEW, force=True)
    assert golden.verify(out).ok and _beside(out) == []


def test_out_dotdot_is_refused_clearly(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    with pytest.raises(golden.SuiteError, match=r"cd .* && relpos-ref generate --out a"):
        golden.generate("..", NEW, force=True)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]


def test_the_cli_refuses_out_dot_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "--out", ".", "--force", "--select", "bias/decode-step/*"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out '.' is the current directory" in err


def test_a_symbolic_link_as_out_is_refused(tmp_path):
    golden.generate(tmp_path / "real", OLD)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(golden.SuiteError, match=r"is a symbolic link \(to .*real\); give the"):
        golden.generate(tmp_path / "link", NEW, force=True)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(golden.SuiteError, match="is a symbolic link"):
        golden.generate(tmp_path / "dangling", NEW)
    assert (tmp_path / "link").is_symlink() and golden.verify(tmp_path / "real").ok


def test_a_link_in_the_parent_path_is_followed(tmp_path, trees):
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    golden.generate(tmp_path / "via" / "golden", NEW)
    assert _tree(tmp_path / "real" / "golden") == trees[1]


def test_a_file_as_out_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(golden.SuiteError, match="exists and is not a directory"):
        golden.generate(tmp_path / "file", NEW, force=True)
    assert (tmp_path / "file").read_text() == "x"


# -- two runs at once ------------------------------------------------------------------------


def test_a_second_run_on_the_same_path_is_refused_while_the_first_writes(tmp_path, trees):
    out = tmp_path / "golden"
    golden.generate(out, OLD)
    with replace.locked(replace.check_out(out)):
        with pytest.raises(golden.SuiteError,
                           match=r"another relpos-ref generate is writing .*golden \(it holds"):
            golden.generate(out, NEW, force=True)
        run = _generate_in_a_new_process(out)  # another process: refused too, in one line
        assert run.returncode == 2
        assert run.stderr.count("\n") == 1
        assert "another relpos-ref generate is writing" in run.stderr
    assert _tree(out) == trees[0]
    golden.generate(out, NEW, force=True)  # the lock is free again
    assert _tree(out) == trees[1] and _beside(out) == []


def test_two_cli_runs_at_once_leave_one_valid_suite(tmp_path):
    out = tmp_path / "golden"
    argv = [sys.executable, "-m", "relpos_ref", "generate", "--out", str(out), "--force",
            "--select", "music/*"]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(r.wait(timeout=300), *r.communicate()) for r in runs]
    codes = sorted(code for code, _, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for code, _, err in results:
        if code == 2:
            assert "another relpos-ref generate is writing" in err and err.count("\n") == 1
    assert golden.verify(out).ok and _beside(out) == []


def test_a_lock_left_by_a_killed_run_does_not_block(tmp_path, trees):
    out = tmp_path / "golden"
    (tmp_path / ".golden.lock").write_text("")
    golden.generate(out, NEW)
    assert _tree(out) == trees[1] and _beside(out) == []
