"""Nothing planted beside a suite is obeyed (issue 26, item 1).

Beside an intact suite ``golden/`` and a user's directory ``victim/``, an
adversary plants a swap journal, a lock, a journal draft or a leftover
look-alike. Each planting meets every entry point that acts beside a suite:
``relpos-ref verify``, ``check`` and ``generate`` (the command line, in this
process) and the pytest plugin (its configure hook; one real pytest run per
attack of the issue). Each test asserts the exact message (naming what was
planted) or the exact correct result, and that nothing was moved, removed,
followed or created: the whole parent directory is the same afterwards,
links and all.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from _golden import PluginConfig, right_output, run_pytest, write_results

from relpos_ref import golden, pytest_plugin
from relpos_ref.cli import main

#: One small case: every entry point runs in well under a second.
ONE = golden.default_cases().select(["bias/decode-step/*"], dtypes=["float32"])
SELECT = ["--select", "bias/decode-step/*", "--dtypes", "float32"]
ENTRY_POINTS = ["verify", "check", "generate", "plugin"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("plantings")
    golden.generate(root / "golden", ONE)
    write_results(root / "mine", root / "golden", right_output)
    return root


@pytest.fixture
def place(pristine, tmp_path):
    """A fresh parent directory: ``golden/`` (the suite), ``mine/`` (right results) and
    ``victim/`` (a user's directory with a file)."""
    root = tmp_path / "place"
    shutil.copytree(pristine, root, symlinks=True)
    (root / "victim").mkdir()
    (root / "victim" / "precious.txt").write_text("keep me")
    return root


def _snapshot(root: Path) -> dict[str, object]:
    """Every entry under `root`, links not followed: files by bytes, links by target."""
    seen: dict[str, object] = {}
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(top) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                seen[key] = ("link", os.readlink(path))
            elif path.is_dir():
                seen[key] = ("dir",)
            elif path.is_file():
                with open(path, "rb") as f:  # the head is enough: sparse giants stay unread
                    seen[key] = ("file", f.read(4096), path.stat().st_size)
            else:
                seen[key] = ("special",)
    return seen


def _run(entry: str, root: Path, capsys) -> tuple[int, str]:
    """Run `entry` on ``root/golden``: (exit status, stderr); the plugin's usage error is 4."""
    out = root / "golden"
    if entry == "plugin":
        try:
            pytest_plugin.pytest_configure(PluginConfig(golden_dir=str(out)))
        except pytest.UsageError as exc:
            return 4, f"{exc}\n"
        return 0, ""
    argv = {
        "verify": ["verify", str(out)],
        "check": ["check", str(out), str(root / "mine")],
        "generate": ["generate", "--out", str(out), *SELECT],
    }[entry]
    status = main(argv)
    return status, capsys.readouterr().err


def _refused(entry: str, message: str) -> str:
    """What `entry` prints for a refusal with `message`."""
    if entry == "plugin":
        return f"--golden-dir: {message}\n"
    return f"relpos-ref: error: {message}\n"


# -- journals ----------------------------------------------------------------------------

NOT_MADE = ("{journal} names {name!r} as the {role} suite, which is not a name relpos-ref "
            "generate makes (.golden.{what}-<8 hex digits>); it was not written by "
            "relpos-ref: nothing was moved or removed. Look at it and remove it by hand")
NOT_A_SUITE = ("{journal} names {name}, which is {what}: not what relpos-ref generate "
               "leaves there; nothing was moved or removed. Look at it and remove the "
               "journal by hand")
NOT_A_JOURNAL = ("{journal} records an interrupted replacement of {out} but is not the "
                 'journal relpos-ref writes ({{"new": ..., "old": ...}}); nothing was moved. '
                 "Look at the .golden.* directories beside it and remove the journal by hand")
NOT_OURS = ("{path} is a {kind}, not what relpos-ref makes there; it is not followed or "
            "touched: look at it, remove it, and run again")
A_LINK = "symbolic link to {target}"
INCOMPLETE = "a directory that is not a whole suite (a plain file per case and a manifest)"


def _journal(record: object) -> callable:
    def plant(root: Path) -> None:
        text = record if isinstance(record, str) else json.dumps(record)
        (root / ".golden.swap").write_text(text)
    return plant


def _bad_name(name: object, role: str = "new", *, other: str | None = None) -> tuple:
    record = {"new": name, "old": other} if role == "new" else {"new": other, "old": name}
    what = "tmp" if role == "new" else "old"
    return _journal(record), NOT_MADE, {"name": name, "role": role, "what": what}


def _with_dir(name: str, fill: callable, record: dict, what: str) -> tuple:
    def plant(root: Path) -> None:
        fill(root, root / name)
        _journal(record)(root)
    return plant, NOT_A_SUITE, {"name": name, "what": what}


def _link_to_victim(root: Path, path: Path) -> None:
    path.symlink_to(root / "victim")


def _nested(root: Path, path: Path) -> None:
    (path / "sub").mkdir(parents=True)
    (path / "manifest.json").write_text("{}")


def _user_files(root: Path, path: Path) -> None:
    path.mkdir()
    (path / "notes.txt").write_text("mine")


def _no_manifest(root: Path, path: Path) -> None:
    path.mkdir()
    (path / "a.safetensors").write_bytes(b"")


def _special_journal(kind: str) -> tuple:
    def plant(root: Path) -> None:
        journal = root / ".golden.swap"
        if kind == "link":
            (root / "elsewhere.json").write_text(json.dumps({"new": "victim", "old": None}))
            journal.symlink_to(root / "elsewhere.json")
        elif kind == "directory":
            journal.mkdir()
        else:
            os.mkfifo(journal)
    kinds = {"link": A_LINK, "directory": "directory", "fifo": "special file"}
    return plant, NOT_OURS, {"path_name": ".golden.swap", "kind": kinds[kind],
                             "target_name": "elsewhere.json"}


def _huge_journal(root: Path) -> None:
    with open(root / ".golden.swap", "wb") as f:
        f.truncate(2**30)


def _staged(kind: str) -> tuple:
    def plant(root: Path) -> None:
        staged = root / ".golden.swap-tmp"
        if kind == "link":
            staged.symlink_to(root / "elsewhere" / "x")  # dangling: `elsewhere/` is empty
            (root / "elsewhere").mkdir()
        else:
            staged.mkdir()
    kinds = {"link": A_LINK, "directory": "directory"}
    return plant, NOT_OURS, {"path_name": ".golden.swap-tmp", "kind": kinds[kind],
                             "target_name": "elsewhere/x"}


JOURNALS = {
    # the two attacks
    "deletes-victim": (_journal({"new": "no-such-dir", "old": "victim"}), NOT_MADE,
                       {"name": "no-such-dir", "role": "new", "what": "tmp"}),
    "renames-victim": _bad_name("victim"),
    # names that are not the ones generate makes
    "parent": _bad_name("../victim"),
    "absolute": _bad_name("ABSOLUTE"),
    "upper-hex": _bad_name(".golden.tmp-DEADBEEF"),
    "seven-hex": _bad_name(".golden.tmp-deadbee"),
    "traversal": _bad_name(".golden.tmp-deadbeef/../../victim"),
    "another-suite": _bad_name(".other.tmp-deadbeef"),
    "roles-swapped": _bad_name(".golden.old-deadbeef"),
    "old-as-tmp": _bad_name(".golden.tmp-deadbeef", "old", other=".golden.tmp-01234567"),
    "the-suite": _bad_name("golden"),
    "dot": _bad_name("."),
    "not-a-string": _bad_name(7),
    # not the journal's shape
    "extra-key": (_journal({"new": ".golden.tmp-deadbeef", "old": None, "also": "victim"}),
                  NOT_A_JOURNAL, {}),
    "not-json": (_journal("victim"), NOT_A_JOURNAL, {}),
    "a-list": (_journal(["victim"]), NOT_A_JOURNAL, {}),
    # the right names, but not what generate leaves under them
    "new-is-a-link": _with_dir(".golden.tmp-deadbeef", _link_to_victim,
                               {"new": ".golden.tmp-deadbeef", "old": None},
                               "a symbolic link"),
    "old-is-a-link": _with_dir(".golden.old-deadbeef", _link_to_victim,
                               {"new": ".golden.tmp-deadbeef", "old": ".golden.old-deadbeef"},
                               "a symbolic link"),
    "new-nested": _with_dir(".golden.tmp-deadbeef", _nested,
                            {"new": ".golden.tmp-deadbeef", "old": None}, INCOMPLETE),
    "new-user-files": _with_dir(".golden.tmp-deadbeef", _user_files,
                                {"new": ".golden.tmp-deadbeef", "old": None}, INCOMPLETE),
    "new-without-manifest": _with_dir(".golden.tmp-deadbeef", _no_manifest,
                                      {"new": ".golden.tmp-deadbeef", "old": None}, INCOMPLETE),
    # the journal itself, or its draft, is not a plain file
    "journal-link": _special_journal("link"),
    "journal-directory": _special_journal("directory"),
    "journal-fifo": _special_journal("fifo"),
    "journal-huge": (_huge_journal, "{journal} has 1073741824 bytes (1024.0 MiB), more than a "
                     "journal can take (4096 bytes); not read; relpos-ref writes .golden.swap "
                     "as a small plain file, so it did not write this one: nothing was moved. "
                     "Look at it and remove it by hand", {}),
    "draft-link": _staged("link"),
    "draft-directory": _staged("directory"),
}


def _journal_message(template: str, fields: dict, root: Path) -> str:
    fields = dict(fields)
    if fields.get("name") == "ABSOLUTE":
        fields["name"] = str(root / "victim")
    if "path_name" in fields:
        fields["path"] = root / fields.pop("path_name")
        if fields["kind"] == A_LINK:
            fields["kind"] = A_LINK.format(target=root / fields.pop("target_name"))
    return template.format(journal=root / ".golden.swap", out=root / "golden", **fields)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("planting", list(JOURNALS))
def test_a_planted_journal_is_refused_and_nothing_moves(place, planting, entry, capsys):
    plant, template, fields = JOURNALS[planting]
    if fields.get("name") == "ABSOLUTE":
        plant = _journal({"new": str(place / "victim"), "old": None})
    if planting == "renames-victim":  # the second attack: no suite at the path
        shutil.rmtree(place / "golden")
    plant(place)
    before = _snapshot(place)
    status, err = _run(entry, place, capsys)
    assert (status, err) == (2 if entry != "plugin" else 4,
                             _refused(entry, _journal_message(template, fields, place)))
    assert _snapshot(place) == before
    assert not (place / "elsewhere" / "x").exists()


# -- locks ---------------------------------------------------------------------------------


def _lock(kind: str) -> callable:
    def plant(root: Path) -> None:
        lock = root / ".golden.lock"
        if kind == "dangling-link":
            (root / "elsewhere").mkdir()
            lock.symlink_to(root / "elsewhere" / "x")
        elif kind == "link-to-file":
            lock.symlink_to(root / "victim" / "precious.txt")
        elif kind == "directory":
            lock.mkdir()
        elif kind == "fifo":
            os.mkfifo(lock)
        else:
            os.link(root / "victim" / "precious.txt", lock)
    return plant


LOCK_KINDS = {
    "dangling-link": lambda root: A_LINK.format(target=root / "elsewhere" / "x"),
    "link-to-file": lambda root: A_LINK.format(target=root / "victim" / "precious.txt"),
    "directory": lambda root: "directory",
    "fifo": lambda root: "special file",
    "hard-link": lambda root: "file with another name (a hard link)",
}


def _interrupted_swap(root: Path) -> None:
    """What a generate killed between its two renames leaves: the old suite aside, the new
    one complete, the journal naming both, nothing at the path."""
    (root / "golden").rename(root / ".golden.old-0123abcd")
    shutil.copytree(root / ".golden.old-0123abcd", root / ".golden.tmp-89abcdef")
    (root / ".golden.swap").write_text(json.dumps({"new": ".golden.tmp-89abcdef",
                                                    "old": ".golden.old-0123abcd"}))


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("kind", list(LOCK_KINDS))
def test_a_planted_lock_is_refused_and_never_followed(place, kind, entry, capsys):
    if entry != "generate":
        _interrupted_swap(place)  # only then do readers need the lock
    _lock(kind)(place)
    before = _snapshot(place)
    status, err = _run(entry, place, capsys)
    message = NOT_OURS.format(path=place / ".golden.lock", kind=LOCK_KINDS[kind](place))
    assert (status, err) == (2 if entry != "plugin" else 4, _refused(entry, message))
    assert _snapshot(place) == before
    assert not (place / "elsewhere" / "x").exists()
    assert (place / "victim" / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("entry", ["verify", "check", "plugin"])
@pytest.mark.parametrize("kind", list(LOCK_KINDS))
def test_with_a_planted_lock_a_leftover_stays_and_reading_goes_on(place, kind, entry, capsys):
    # a leftover is only cleaned up under the lock: with a planted one, it stays
    leftover = place / ".golden.tmp-0123abcd"
    shutil.copytree(place / "golden", leftover)
    _lock(kind)(place)
    before = _snapshot(place)
    status, err = _run(entry, place, capsys)
    assert (status, err) == (0, "")
    assert _snapshot(place) == before
    assert not (place / "elsewhere" / "x").exists()


# -- leftover look-alikes ------------------------------------------------------------------


def _look_alike(name: str, fill: str) -> callable:
    def plant(root: Path) -> None:
        path = root / name
        if fill == "link":
            path.symlink_to(root / "victim")
            return
        if fill == "file":
            path.write_text("a user's file")
            return
        path.mkdir()
        (path / "manifest.json").write_text("{}")
        if fill == "subdirectory":
            (path / "sub").mkdir()
        elif fill == "inner-link":
            (path / "x.safetensors").symlink_to(root / "victim" / "precious.txt")
        elif fill == "user-file":
            (path / "notes.txt").write_text("mine")
        elif fill == "fifo":
            os.mkfifo(path / "x.npz")
    return plant


LOOK_ALIKES = {
    "tmp-link-to-victim": (".golden.tmp-deadbeef", "link"),
    "old-link-to-victim": (".golden.old-deadbeef", "link"),
    "with-subdirectory": (".golden.tmp-deadbeef", "subdirectory"),
    "with-inner-link": (".golden.old-deadbeef", "inner-link"),
    "with-user-file": (".golden.tmp-deadbeef", "user-file"),
    "with-fifo": (".golden.tmp-deadbeef", "fifo"),
    "a-plain-file": (".golden.tmp-deadbeef", "file"),
    "seven-hex": (".golden.tmp-deadbee", "suite"),
    "nine-hex": (".golden.tmp-deadbeef0", "suite"),
    "upper-hex": (".golden.tmp-DEADBEEF", "suite"),
    "backup": (".golden.old-backup", "suite"),
    "another-suite": (".golden2.tmp-deadbeef", "suite"),
    "no-leading-dot": ("golden.tmp-deadbeef", "suite"),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("look_alike", list(LOOK_ALIKES))
def test_a_leftover_look_alike_is_left_alone(place, look_alike, entry, capsys):
    _look_alike(*LOOK_ALIKES[look_alike])(place)
    before = _snapshot(place)
    status, err = _run(entry, place, capsys)
    assert (status, err) == (0, "")
    assert _snapshot(place) == before


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_real_leftover_is_removed_and_said(place, entry, capsys):
    # the control: what a killed generate leaves is cleaned up, and said once
    shutil.copytree(place / "golden", place / ".golden.tmp-0123abcd")
    before = _snapshot(place)
    status, err = _run(entry, place, capsys)
    assert status == 0
    if entry != "plugin":
        assert err == (f"relpos-ref: note: removed 1 unfinished suite(s) left beside "
                       f"{place / 'golden'}\n")
    expected = {k: v for k, v in before.items() if not k.startswith(".golden.tmp-")}
    assert _snapshot(place) == expected


# -- the attacks through a real pytest run ------------------------------------------


@pytest.mark.parametrize("attack", ["deletes-victim", "renames-victim", "lock-link"])
def test_a_real_pytest_run_obeys_no_planting(place, attack, tmp_path):
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text("def test_x(golden_case):\n    pass\n")
    if attack == "deletes-victim":
        JOURNALS[attack][0](place)
        message = _journal_message(*JOURNALS[attack][1:], place)
    elif attack == "renames-victim":
        shutil.rmtree(place / "golden")
        JOURNALS[attack][0](place)
        message = _journal_message(*JOURNALS[attack][1:], place)
    else:
        _interrupted_swap(place)
        _lock("dangling-link")(place)
        message = NOT_OURS.format(path=place / ".golden.lock",
                                  kind=LOCK_KINDS["dangling-link"](place))
    before = _snapshot(place)
    run = run_pytest(project, f"--golden-dir={place / 'golden'}")
    assert run.returncode == 4 and "INTERNALERROR" not in run.stderr + run.stdout
    assert f"ERROR: --golden-dir: {message}" in run.stderr
    assert _snapshot(place) == before
