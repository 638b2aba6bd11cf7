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

Only what `generate` itself makes is acted on. The journal must be a plain
file holding exactly ``{"new": ".NAME.tmp-<8 hex>", "old": ".NAME.old-<8 hex>"
or null}``, naming real directories that hold what a suite holds; anything
else (a name of the user's, ``../x``, a link) is refused with a message
naming the journal, and nothing is moved or removed. The lock, the journal
and its draft ``.NAME.swap-tmp`` are never opened or created through a
symbolic link; a link, directory or device under those names is refused.
Leftovers are only directories named ``.NAME.tmp-`` or ``.NAME.old-`` and
eight hex digits holding a suite's plain files, nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from . import paths, sharing
from .manifest import MANIFEST, SCHEMA
from .paths import SuiteError, check_out, entries, kind_of, resolve

try:  # POSIX; elsewhere runs are not locked against each other
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: A journal is two short names in JSON; anything larger is not one.
_JOURNAL_BYTES = 4096

__all__ = [
    "check_out",
    "install",
    "journaled",
    "locked",
    "new_directory",
    "read_journal",
    "recover",
    "recover_if_needed",
    "resolve",
]


def _sibling(out: Path, what: str) -> Path:
    return out.parent / f".{out.name}.{what}"


def _journal(out: Path) -> Path:
    return _sibling(out, "swap")


@contextlib.contextmanager
def locked(out: Path, *, wait: bool = False) -> Iterator[None]:
    """Hold ``.NAME.lock`` next to `out`; a second holder is refused at once, or with
    `wait` waits (saying so on stderr).

    The lock is opened without following a symbolic link (a link there is
    refused, never followed to create or open what it points to), and must
    be a regular file with no other name.

    Raises
    ------
    SuiteError
        Another process holds the lock (and not `wait`), or the lock file
        cannot be made, or something other than a lock file has its name.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    lock = _sibling(out, "lock")
    while True:
        fd = _open_lock(lock, out)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or not wait:
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                msg = (f"another relpos-ref generate is writing {out} (it holds {lock}); "
                       "wait for it to finish, then run again")
                raise SuiteError(msg) from None
            print(f"relpos-ref: note: waiting for the relpos-ref generate writing {out} to "
                  f"finish (it holds {lock})", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        # The holder before us may have removed the file after we opened it: retry.
        try:
            same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                os.unlink(lock)
        os.close(fd)


def _open_lock(lock: Path, out: Path) -> int:
    """Open (or make) the lock file, refusing a link, a directory, a device or a pipe."""
    flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC
    try:
        fd = os.open(lock, flags, 0o666)
    except OSError as exc:
        kind = kind_of(lock)
        if kind not in (None, "file"):
            raise SuiteError(_not_ours(lock, kind)) from None
        msg = f"cannot write to {out.parent} ({exc.strerror})"
        raise SuiteError(msg) from None
    info = os.fstat(fd)
    # (no name at all is fine: the holder before us removed it, and `locked` opens again)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        kind = "file with another name (a hard link)" if stat.S_ISREG(info.st_mode) \
            else kind_of(lock) or "special file"
        raise SuiteError(_not_ours(lock, kind))
    return fd


def _not_ours(path: Path, kind: str) -> str:
    link = f" to {os.readlink(path)}" if kind == "symbolic link" else ""
    return (f"{path} is a {kind}{link}, not what relpos-ref makes there; it is not "
            "followed or touched: look at it, remove it, and run again")


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


def _made_here(out: Path, what: str) -> re.Pattern[str]:
    """The names `new_directory` and `install` give: ``.NAME.<what>-<8 hex digits>``."""
    return re.compile(rf"\.{re.escape(out.name)}\.{what}-[0-9a-f]{{8}}")


def _leftovers(out: Path, what: str) -> list[Path]:
    """Directories ``.NAME.<what>-<8 hex digits>`` beside `out`: names only `new_directory`
    and `install` make (a user's ``.NAME.old-backup`` is not one), holding what a suite
    holds (`_suite_like`)."""
    pattern = _made_here(out, what)
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    return [out.parent / name for name in sorted(names)
            if pattern.fullmatch(name) and _suite_like(out.parent / name)]


def _suite_like(path: Path) -> bool:
    """A real directory (not a link) of plain files named as a suite's files are
    (``manifest.json``, ``manifest.schema.json``, ``*.safetensors``, ``*.npz``), nothing
    else: what a suite, finished or not, is."""
    if kind_of(path) != "directory":
        return False
    try:
        found = entries(path)
    except OSError:
        return False
    return all(kind == "file" and (name in (MANIFEST, SCHEMA) or
                                   name.endswith((".safetensors", ".npz")))
               for name, kind in found.items())


def _empty_directory(path: Path) -> bool:
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        with os.scandir(path) as entries_:
            return next(entries_, None) is None
    except OSError:
        return False


def _remove(path: Path) -> None:
    # `shutil.rmtree` follows no link inside (it checks, with file descriptors, on POSIX)
    if kind_of(path) == "directory":
        shutil.rmtree(path)
    elif kind_of(path) is not None:
        path.unlink()


def install(new: Path, out: Path) -> None:
    """Swap the complete suite `new` into `out` (existing or not) under the journal.

    Call while holding `locked`. `out`, when it exists, is a directory; a
    reader in the middle of a read of it (`relpos_ref.golden.sharing`) is
    waited for before it moves, and learns afterwards that it was replaced.
    """
    journal = _journal(out)
    old = None
    if out.exists():
        old = _sibling(out, f"old-{secrets.token_hex(4)}")
    record = {"new": new.name, "old": old.name if old else None}
    staged = _sibling(out, "swap-tmp")
    with sharing.exclusive(out):  # a read in progress finishes first
        paths.write_new(staged, json.dumps(record).encode())
        os.replace(staged, journal)
        try:
            if old is not None:
                os.rename(out, old)
            os.rename(new, out)
        except BaseException:
            # Ctrl-C or a failed rename: the new suite is complete, so finish (or undo)
            # now, as the next run would; never leave the path empty.
            recover(out)
            raise
        journal.unlink()
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def journaled(out: Path) -> bool:
    """Whether a swap at `out` is recorded (its directories then belong to `recover`)."""
    return kind_of(_journal(out)) is not None


def recover(out: Path) -> str | None:
    """Finish or undo an interrupted swap at `out`, and remove half-built suites.

    Call while holding `locked`. Returns what was done, or ``None`` when
    nothing was left behind. The previous suite is removed only once the new
    one is in place; a directory that appeared at `out` after the crash is
    never removed unless it is empty (a `SuiteError` says what to move). A
    journal that names anything but what `install` writes (`read_journal`)
    is refused, and nothing is moved or removed.
    """
    done = None
    staged = _sibling(out, "swap-tmp")
    kind = kind_of(staged)
    if kind not in (None, "file"):
        raise SuiteError(_not_ours(staged, kind))
    if kind == "file":
        staged.unlink()  # killed while writing the journal: nothing was renamed yet
    record = read_journal(out)
    if record is not None:
        new, old = record
        done = _finish_swap(out, new, old)
        _journal(out).unlink()
    stray = _leftovers(out, "tmp") + _leftovers(out, "old")
    for path in stray:
        _remove(path)
    if stray and done is None:
        done = f"removed {len(stray)} unfinished suite(s) left beside {out}"
    return done


def read_journal(out: Path, *, directories: bool = True) -> tuple[Path, Path | None] | None:
    """The new and previous suites a journal beside `out` names, or ``None`` without one.

    Accepted only as `install` writes it: a plain file (a link is not
    followed) of JSON ``{"new": ".NAME.tmp-<8 hex>", "old": ".NAME.old-<8 hex>" or
    null}``, naming real directories (not links) that hold what a suite holds,
    the new one with its manifest (it is written last, before the journal).
    The directories are looked at only with `directories` (under the lock:
    a `generate` in the middle of its swap moves and removes them).

    Raises
    ------
    SuiteError
        Naming the journal and what is wrong with it; nothing is touched.
    """
    journal = _journal(out)
    kind = kind_of(journal)
    if kind not in (None, "file"):
        raise SuiteError(_not_ours(journal, kind))
    try:
        data = paths.read_plain(journal, limit=_JOURNAL_BYTES, what="a journal")
    except SuiteError as exc:
        msg = f"{exc}; relpos-ref writes {journal.name} as a small plain file, so it did " \
              "not write this one: nothing was moved. Look at it and remove it by hand"
        raise SuiteError(msg) from None
    if data is None:
        return None
    try:
        record = json.loads(data.decode())
    except (ValueError, UnicodeDecodeError):
        record = None
    if not isinstance(record, dict) or set(record) != {"new", "old"}:
        msg = (f"{journal} records an interrupted replacement of {out} but is not the "
               f'journal relpos-ref writes ({{"new": ..., "old": ...}}); nothing was moved. '
               f"Look at the .{out.name}.* directories beside it and remove the journal by hand")
        raise SuiteError(msg)
    found = []
    for role, what in (("new", "tmp"), ("old", "old")):
        name = record[role]
        if name is None and role == "old":
            found.append(None)
            continue
        pattern = _made_here(out, what)
        if not isinstance(name, str) or not pattern.fullmatch(name):
            msg = (f"{journal} names {name!r} as the {role} suite, which is not a name "
                   f"relpos-ref generate makes (.{out.name}.{what}-<8 hex digits>); it was "
                   "not written by relpos-ref: nothing was moved or removed. Look at it and "
                   "remove it by hand")
            raise SuiteError(msg)
        path = out.parent / name
        kind = kind_of(path) if directories else None
        if kind is not None and not (_suite_like(path) and (
                role == "old" or kind_of(path / MANIFEST) == "file")):
            what_it_is = f"a {kind}" if kind != "directory" else \
                "a directory that is not a whole suite (a plain file per case and a manifest)"
            msg = (f"{journal} names {name}, which is {what_it_is}: not what relpos-ref "
                   "generate leaves there; nothing was moved or removed. Look at it and "
                   "remove the journal by hand")
            raise SuiteError(msg)
        found.append(path)
    return found[0], found[1]


def _finish_swap(out: Path, new: Path, old: Path | None) -> str:
    """Put the journal's new suite (or, if it is gone, the old one) at `out`."""
    if kind_of(out) not in (None, "directory"):
        raise SuiteError(_not_ours(out, kind_of(out) or "special file"))
    if _empty_directory(out) and (new.exists() or (old is not None and old.exists())):
        out.rmdir()  # made after the crash (``mkdir -p``, say): nothing in it to keep
    old_there = old is not None and old.exists()
    if new.exists():
        if out.exists():
            if old is not None and not old_there:
                # killed before the first rename: `out` is still the previous suite
                _remove(new)
                return f"removed an unfinished replacement of {out}; the previous suite stays"
            aside = f", the previous one in {old.name}" if old_there and old else ""
            msg = (f"writing {out} was interrupted: the new suite is in {new.name}{aside}, "
                   f"and a directory made at {out} since is in the way; move it elsewhere "
                   "and run again")
            raise SuiteError(msg)
        os.rename(new, out)
        if old_there and old is not None:
            _remove(old)
            return f"finished replacing {out}, interrupted last time"
        return f"finished writing {out}, interrupted last time"
    if old_there and old is not None:
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
    needs the lock: while a `generate` holds it (it is swapping the suite in
    now), this waits for it, saying so on stderr. Half-built suites are
    removed only when no `generate` is running.
    """
    out = resolve(path)
    if not out.name or out.is_symlink():
        return None
    if kind_of(_journal(out)) is not None or kind_of(_sibling(out, "swap-tmp")) is not None:
        # a journal relpos-ref did not write is refused before the lock; its directories
        # are looked at under it (a generate swapping now moves them)
        read_journal(out, directories=False)
        with locked(out, wait=True):
            return recover(out)
    if not (_leftovers(out, "tmp") or _leftovers(out, "old")):
        return None
    try:
        with locked(out):
            return recover(out)
    except (SuiteError, OSError):
        # a generate is running (its directory is not a leftover), the directory is
        # read-only, or the lock's name holds something else: the suite itself is
        # intact, so reading it goes on, and nothing is removed
        return None
