"""Putting a finished suite in place so that a crash at any instant loses nothing.

`generate` builds a suite in a sibling directory ``.NAME.tmp-*`` and then
swaps it in. The swap is two renames (the old suite aside to ``.NAME.old-*``,
the new one into place); a journal ``.NAME.swap`` written before the first
rename names both, so a run killed between them leaves enough behind for
`recover` (called by the next `generate`, `verify`, `check` or the plugin)
to finish the swap, or undo it. Every step is a rename or a removal of
something the journal already names:

=====================================  ====================================
killed ...                             the path holds, or `recover` gives
=====================================  ====================================
while building the new suite           the old suite; the half-built one is
                                       removed
after the journal, before any rename   the old suite; the new one removed
after moving the old suite aside       the new suite (complete, since the
                                       journal exists)
after the new suite is in place        the new suite; the old one removed
=====================================  ====================================

A lock file ``.NAME.lock`` (``flock``) keeps two runs from writing the same
path at once: the second is refused at once, and says why. New directories
are made with `os.mkdir`, so their permissions follow the umask.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from .paths import SuiteError

try:  # POSIX; elsewhere runs are not locked against each other
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "check_out",
    "install",
    "journaled",
    "locked",
    "new_directory",
    "recover",
    "recover_if_needed",
    "resolve",
]


def _sibling(out: Path, what: str) -> Path:
    return out.parent / f".{out.name}.{what}"


def _journal(out: Path) -> Path:
    return _sibling(out, "swap")


def resolve(path: str | os.PathLike[str]) -> Path:
    """`path` made absolute the way the system reads it: the parent's symbolic links
    followed (``link/../x`` is beside what ``link`` points to), the last name kept as
    given, so that a symbolic link there can still be seen.

    Examples
    --------
    >>> resolve("/").name, resolve("/tmp/x/..") == resolve("/tmp")
    ('', True)
    """
    text = os.fspath(path)
    if not text:
        msg = "the path is empty"
        raise SuiteError(msg)
    name = os.path.basename(text.rstrip("/" + os.sep)) if text.strip("/" + os.sep) else ""
    if name in {"", ".", ".."}:
        return Path(os.path.realpath(text))
    parent = os.path.dirname(text.rstrip("/" + os.sep)) or os.curdir
    return Path(os.path.realpath(parent)) / name


def check_out(out: str | os.PathLike[str]) -> Path:
    """The absolute path a suite may be written to, or a `SuiteError` saying why not.

    Refused: a symbolic link (replacing it would replace the link, not what
    it points to), the current directory or one of its parents (a suite is
    replaced by renaming its directory), a path whose parent is missing, and
    an existing path that is not a directory.
    """
    given = str(out)
    path = resolve(out)
    if path.is_symlink():
        msg = (f"--out {given!r} is a symbolic link (to {os.readlink(path)}); give the "
               f"directory itself, {path.resolve()}")
        raise SuiteError(msg)
    real, here = Path(os.path.realpath(path)), Path(os.path.realpath(Path.cwd()))
    if real == here or real in here.parents:
        msg = (f"--out {given!r} is the current directory or one of its parents; a suite is "
               "replaced by renaming its directory, so write it from outside")
        if path.name:
            msg += f": cd {path.parent} && relpos-ref generate --out {path.name}"
        raise SuiteError(msg)
    if path.exists() and not path.is_dir():
        msg = f"{given!r} exists and is not a directory; choose another --out"
        raise SuiteError(msg)
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        msg = f"cannot write {given!r}: its parent {path.parent} {what}"
        raise SuiteError(msg)
    return path


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold ``.NAME.lock`` next to `out`; a second holder is refused at once.

    Raises
    ------
    SuiteError
        Another process holds the lock, or the lock file cannot be made.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    lock = _sibling(out, "lock")
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            msg = f"cannot write to {out.parent} ({exc.strerror})"
            raise SuiteError(msg) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            msg = (f"another relpos-ref generate is writing {out} (it holds {lock}); "
                   "wait for it to finish, then run again")
            raise SuiteError(msg) from None
        # The holder before us may have removed the file after we opened it: retry.
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def new_directory(out: Path, what: str) -> Path:
    """Make the empty sibling directory ``.NAME.<what>-<random>`` (umask permissions)."""
    while True:
        path = _sibling(out, f"{what}-{secrets.token_hex(4)}")
        try:
            os.mkdir(path, 0o777)
        except FileExistsError:
            continue
        except OSError as exc:
            msg = f"cannot write to {out.parent} ({exc.strerror}); choose another --out"
            raise SuiteError(msg) from None
        return path


def _leftovers(out: Path, what: str) -> list[Path]:
    """Directories ``.NAME.<what>-<8 hex digits>`` beside `out`: names only `new_directory`
    and `install` make (a user's ``.NAME.old-backup`` is not one), holding plain files only."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.{what}-[0-9a-f]{{8}}")
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        path = out.parent / name
        if pattern.fullmatch(name) and _flat_directory(path):
            found.append(path)
    return found


def _flat_directory(path: Path) -> bool:
    """A real directory of plain files only (what a suite, finished or not, is)."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        with os.scandir(path) as entries:
            return all(e.is_file(follow_symlinks=False) for e in entries)
    except OSError:
        return False


def _empty_directory(path: Path) -> bool:
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def install(new: Path, out: Path) -> None:
    """Swap the complete suite `new` into `out` (existing or not) under the journal.

    Call while holding `locked`. `out`, when it exists, is a directory.
    """
    journal = _journal(out)
    old = None
    if out.exists():
        old = _sibling(out, f"old-{secrets.token_hex(4)}")
    record = {"new": new.name, "old": old.name if old else None}
    staged = _sibling(out, "swap-tmp")
    staged.write_text(json.dumps(record))
    os.replace(staged, journal)
    try:
        if old is not None:
            os.rename(out, old)
        os.rename(new, out)
    except BaseException:
        # Ctrl-C or a failed rename: the new suite is complete, so finish (or undo) now,
        # as the next run would; never leave the path empty.
        recover(out)
        raise
    journal.unlink()
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def journaled(out: Path) -> bool:
    """Whether a swap at `out` is recorded (its directories then belong to `recover`)."""
    return _journal(out).exists()


def recover(out: Path) -> str | None:
    """Finish or undo an interrupted swap at `out`, and remove half-built suites.

    Call while holding `locked`. Returns what was done, or ``None`` when
    nothing was left behind. The previous suite is removed only once the new
    one is in place; a directory that appeared at `out` after the crash is
    never removed unless it is empty (a `SuiteError` says what to move).
    """
    done = None
    journal = _journal(out)
    staged = _sibling(out, "swap-tmp")
    if staged.exists():
        staged.unlink()  # killed while writing the journal: nothing was renamed yet
    if journal.exists():
        try:
            record = json.loads(journal.read_text())
            new = out.parent / _bare(record["new"])
            old = out.parent / _bare(record["old"]) if record["old"] else None
        except (ValueError, KeyError, TypeError):
            msg = (f"{journal} records an interrupted replacement of {out} but cannot be "
                   f"read; look at the .{out.name}.* directories beside it and remove "
                   "the journal by hand")
            raise SuiteError(msg) from None
        done = _finish_swap(out, new, old)
        journal.unlink()
    stray = _leftovers(out, "tmp") + _leftovers(out, "old")
    for path in stray:
        _remove(path)
    if stray and done is None:
        done = f"removed {len(stray)} unfinished suite(s) left beside {out}"
    return done


def _bare(name: object) -> str:
    """A journal entry: a bare directory name beside the suite, nothing else."""
    if not isinstance(name, str) or not name or name in {".", ".."} or "/" in name \
            or os.sep in name:
        raise TypeError(name)
    return name


def _finish_swap(out: Path, new: Path, old: Path | None) -> str:
    """Put the journal's new suite (or, if it is gone, the old one) at `out`."""
    if _empty_directory(out) and (new.exists() or (old is not None and old.exists())):
        out.rmdir()  # made after the crash (``mkdir -p``, say): nothing in it to keep
    old_there = old is not None and old.exists()
    if new.exists():
        if out.exists():
            if old is not None and not old_there:
                # killed before the first rename: `out` is still the previous suite
                _remove(new)
                return f"removed an unfinished replacement of {out}; the previous suite stays"
            aside = f", the previous one in {old.name}" if old_there else ""
            msg = (f"writing {out} was interrupted: the new suite is in {new.name}{aside}, "
                   f"and a directory made at {out} since is in the way; move it elsewhere "
                   "and run again")
            raise SuiteError(msg)
        os.rename(new, out)
        if old_there:
            _remove(old)
            return f"finished replacing {out}, interrupted last time"
        return f"finished writing {out}, interrupted last time"
    if old_there:
        if out.exists():
            # the second rename happened: `out` is the new suite, complete
            _remove(old)
            return f"finished replacing {out}, interrupted last time"
        os.rename(old, out)  # the new suite is gone (removed by hand): put the old back
        return f"restored the previous suite at {out}; the replacement was lost"
    return f"finished replacing {out}, interrupted last time"


def recover_if_needed(path: str | os.PathLike[str]) -> str | None:
    """`recover` when a `generate` at `path` was killed; cheap when none was.

    Used when a suite is opened, so that `verify`, `check` and the plugin
    find the suite a killed `generate` was writing. An interrupted swap
    needs the lock (a `SuiteError` if a `generate` holds it now); half-built
    suites are removed only when no `generate` is running.
    """
    out = resolve(path)
    if not out.name or out.is_symlink():
        return None
    if _journal(out).exists() or _sibling(out, "swap-tmp").exists():
        with locked(out):
            return recover(out)
    if not (_leftovers(out, "tmp") or _leftovers(out, "old")):
        return None
    try:
        with locked(out):
            return recover(out)
    except (SuiteError, OSError):
        # a generate is running (its directory is not a leftover), or the directory is
        # read-only: the suite itself is intact, so reading it goes on
        return None
