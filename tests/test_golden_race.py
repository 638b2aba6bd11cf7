"""A reader racing ``generate --force`` sees one whole suite, or waits and says so.

Issue 26, item 6.

Before, a `verify` that ran while `generate --force` replaced the suite
sometimes failed with a raw ``[Errno 2] No such file or directory``, or
reported "missing file" for an intact suite. Each window of the replacement
is opened on purpose here: the generate is paused between its two renames
(the path is absent), or runs to completion while a reader is in the middle
of its work, or while a reader holds a read; and the reader must verify (or
check) one whole suite, the old or the new, saying on stderr when it waited
or started again.
"""

from __future__ import annotations

import shutil
import threading
import types
from pathlib import Path

import pytest
from _golden import right_output, write_results

from relpos_ref import golden
from relpos_ref.golden import replace, sharing, verification
from relpos_ref.golden import suite as suite_module

OLD = golden.default_cases().select(["bias/decode-step/*"], dtypes=["float32", "float64"])
NEW = golden.default_cases().select(["bias/decode-step/*"],
                                    dtypes=["float32", "float64", "float16"])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("race")
    golden.generate(root / "golden", OLD)
    return root / "golden"


@pytest.fixture
def out(pristine, tmp_path):
    return Path(shutil.copytree(pristine, tmp_path / "golden"))


def _ids(path: Path) -> list[str]:
    with golden.load_suite(path) as opened:
        return sorted(opened.cases)


def _paused_rename(monkeypatch, after: int) -> tuple[threading.Event, threading.Event]:
    """Make `replace`'s renames pause after the `after`-th until released."""
    paused, release = threading.Event(), threading.Event()
    calls = []
    real = replace.os

    def rename(src, dst):
        real.rename(src, dst)
        calls.append((src, dst))
        if len(calls) == after:
            paused.set()
            release.wait(30)

    proxy = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real)
                                     if not n.startswith("__")})
    proxy.rename = rename
    monkeypatch.setattr(replace, "os", proxy)
    return paused, release


def _in_thread(function, *args, **kwargs) -> tuple[threading.Thread, list]:
    result: list = []

    def run():
        try:
            result.append(function(*args, **kwargs))
        except BaseException as exc:  # handed back to the test
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


@pytest.mark.parametrize("reader", ["verify", "check", "load"])
def test_a_reader_between_the_two_renames_waits_and_reads_the_new_suite(
        out, reader, monkeypatch, capsys, tmp_path):
    mine = write_results(tmp_path / "mine", out, right_output) if reader == "check" else None
    paused, release = _paused_rename(monkeypatch, after=1)  # the old suite moved aside
    # check: the same case in npz, so that the results fit the old suite and the new one
    new, fmt = (OLD, "npz") if reader == "check" else (NEW, "safetensors")
    writer, written = _in_thread(golden.generate, out, new, fmt=fmt, force=True)
    assert paused.wait(30) and not out.exists()
    timer = threading.Timer(0.3, release.set)
    timer.start()
    if reader == "verify":
        report = golden.verify(out)
        assert report.ok and report.cases == len(NEW)
    elif reader == "check":
        report = golden.check(out, mine)
        assert report.ok and sorted(report.results) == sorted(c.id for c in OLD)
        assert golden.load_suite(out).manifest["format"] == "npz"
    else:
        assert _ids(out) == sorted(c.id for c in NEW)
    writer.join(30)
    assert written[0].status == "replaced"
    lock = out.parent / ".golden.lock"
    assert capsys.readouterr().err == (f"relpos-ref: note: waiting for the relpos-ref generate "
                                       f"writing {out} to finish (it holds {lock})\n")


@pytest.mark.parametrize("reader", ["verify", "check"])
def test_a_suite_replaced_while_it_is_read_is_read_again_whole(out, reader, monkeypatch,
                                                               capsys, tmp_path):
    mine = write_results(tmp_path / "mine", out, right_output)
    real = {"verify": verification.case_problems, "check": suite_module.rederive_case}[reader]
    replaced = []
    new, fmt = (OLD, "npz") if reader == "check" else (NEW, "safetensors")

    def meanwhile(*args, **kwargs):
        if not replaced:  # the first case is re-derived: now generate --force runs through
            replaced.append(golden.generate(out, new, fmt=fmt, force=True))
        return real(*args, **kwargs)

    if reader == "verify":
        monkeypatch.setattr(verification, "case_problems", meanwhile)
    else:  # check's Suite.load
        monkeypatch.setattr(suite_module, "rederive_case", meanwhile)
    if reader == "verify":
        report = golden.verify(out)
        assert report.ok and report.cases == len(NEW)
        said = "it was being verified; verifying the new suite"
    else:
        report = golden.check(out, mine)
        assert report.ok and sorted(report.results) == sorted(c.id for c in OLD)
        assert golden.load_suite(out).manifest["format"] == "npz"
        said = "the results were being checked; checking them against the new suite"
    assert replaced[0].status == "replaced"
    assert capsys.readouterr().err == (f"relpos-ref: note: {out} was replaced by relpos-ref "
                                       f"generate while {said}\n")


def test_a_replacement_waits_for_a_read_in_progress(out, capsys):
    opened = golden.load_suite(out)
    with opened._reading.hold():
        writer, written = _in_thread(golden.generate, out, NEW, force=True)
        writer.join(0.5)
        assert writer.is_alive()  # waiting for this read
        assert _ids_on_disk(out) == sorted(c.file_stem for c in OLD)
    writer.join(30)
    assert written[0].status == "replaced"
    assert capsys.readouterr().err == (f"relpos-ref: note: waiting for a reader of {out} to "
                                       "finish its read\n")
    with pytest.raises(sharing.SuiteReplacedError,
                       match=rf"^{out} was replaced \(by relpos-ref generate\) after it was "
                             r"opened; open it again$"):
        opened.load(OLD[0].id)
    opened.close()


def _ids_on_disk(path: Path) -> list[str]:
    return sorted(p.name.rsplit(".", 1)[0] for p in path.iterdir()
                  if p.suffix in (".safetensors", ".npz"))


def test_a_suite_replaced_before_its_first_read_is_opened_again(out, monkeypatch, capsys):
    # replaced between opening the directory and locking it: the new one is read, silently
    real = sharing._flock
    replaced = []

    def meanwhile(fd, how, note):
        if not replaced and how == sharing.fcntl.LOCK_SH:
            replaced.append(golden.generate(out, NEW, force=True))
        return real(fd, how, note)

    monkeypatch.setattr(sharing, "_flock", meanwhile)
    report = golden.verify(out)
    assert report.ok and report.cases == len(NEW) and replaced[0].status == "replaced"
    assert capsys.readouterr().err == ""


def test_no_reader_ever_says_missing_while_generate_force_runs_over_and_over(out):
    # the symptom, run for a while: every verify sees one whole suite
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer():
        which = 0
        while not stop.is_set():
            try:
                golden.generate(out, (NEW, OLD)[which % 2], force=True)
            except golden.SuiteError as exc:
                # a reader finishing an interrupted swap holds the lock for a moment: a
                # generate starting then is refused, as a second generate is; try again
                if "another relpos-ref generate is writing" not in str(exc):
                    errors.append(exc)
                    return
                stop.wait(0.01)
                continue
            except BaseException as exc:
                errors.append(exc)
                return
            which += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(12):
            report = golden.verify(out)
            assert report.ok, report.problems
            assert report.cases in (len(OLD), len(NEW))
    finally:
        stop.set()
        thread.join(30)
    assert errors == []
