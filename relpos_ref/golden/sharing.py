"""Readers of a suite and the `generate` that replaces it: one whole suite, always.

`generate --force` moves the old suite aside and the new one into place
(`relpos_ref.golden.replace.install`), then removes the old one. A reader
(`verify`, `check`, `diagnose`, the pytest plugin) opens the suite's
directory once (`Reading`) and reads every file relative to that open
directory, each read under a shared ``flock`` on it; `install` holds the
exclusive ``flock`` on the directory it moves aside. So a reader never reads
half of one suite and half of another: it reads the suite it opened, or
learns that the suite was replaced (`SuiteReplacedError`) and reads the new one
from the start; while a swap is under way, it waits for it and says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from .paths import SuiteError

try:  # POSIX; elsewhere reads are not coordinated with a replacement
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["RETRIES", "Reading", "SuiteReplacedError", "exclusive"]

#: How often `verify` and `check` start again on a replaced suite before they hold it
#: throughout (a replacement then waits for them).
RETRIES = 2

_DIRECTORY = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


class SuiteReplacedError(SuiteError):
    """The suite was replaced by a `generate` after it was opened."""


def _flock(fd: int, how: int, note: str) -> None:
    """``flock(fd, how)``, saying `note` on stderr first when it has to wait."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        print(f"relpos-ref: note: {note}", file=sys.stderr, flush=True)
        fcntl.flock(fd, how)


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Hold the exclusive lock on the directory `out` (when it exists) while it is moved.

    Readers in the middle of a read are waited for (their reads are short).
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    try:
        fd = os.open(out, _DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        yield
        return
    try:
        _flock(fd, fcntl.LOCK_EX, f"waiting for a reader of {out} to finish its read")
        yield
    finally:
        os.close(fd)


class Reading:
    """An open suite directory: every read of it goes through `hold`.

    Parameters
    ----------
    path : Path
        The suite directory (a symbolic link to one is followed: the user named it).
    hold : bool
        Keep the shared lock from the start until `close`: a replacement
        waits for this reader (for a reader overtaken by replacements
        already, so that it finishes).
    """

    def __init__(self, path: Path, *, hold: bool = False) -> None:
        self.path = path
        self._fd: int | None = None
        self._pinned = False
        for _ in range(8):  # each round means a replacement finished meanwhile
            fd = self._open()
            if fcntl is None:  # pragma: no cover - Windows
                self._fd, self._id = fd, None
                return
            _flock(fd, fcntl.LOCK_SH, f"waiting for the relpos-ref generate replacing "
                                      f"{path} to finish")
            here = self._identity()
            if here == _identity(os.fstat(fd)):
                self._fd, self._id, self._pinned = fd, here, hold
                if not hold:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                return
            os.close(fd)
        msg = f"{path} is being replaced again and again; run again when it is not"
        raise SuiteError(msg)

    def _open(self) -> int:
        from .replace import recover_if_needed

        for attempt in range(2):
            try:
                return os.open(self.path, _DIRECTORY)
            except FileNotFoundError:
                if attempt:
                    break
                # between the two renames of a replacement: wait for it, then look again
                recover_if_needed(self.path)
            except NotADirectoryError:
                break
            except OSError as exc:
                msg = f"{self.path}: cannot be read ({exc.strerror})"
                raise SuiteError(msg) from None
        msg = (f"{self.path} is not a directory; generate one with "
               f"`relpos-ref generate --out {self.path}`")
        raise SuiteError(msg)

    def _identity(self) -> tuple[int, int] | None:
        try:
            return _identity(os.stat(self.path))
        except OSError:
            return None

    @contextlib.contextmanager
    def hold(self) -> Iterator[int]:
        """The open directory's descriptor, under the shared lock, while it is still
        the suite at `path`.

        Raises
        ------
        SuiteReplacedError
            A `generate` replaced the suite since it was opened.
        """
        if self._fd is None:
            msg = f"{self.path} was closed"
            raise SuiteError(msg)
        if fcntl is None or self._pinned:  # Windows, or held since it was opened
            yield self._fd
            return
        _flock(self._fd, fcntl.LOCK_SH, f"waiting for the relpos-ref generate replacing "
                                        f"{self.path} to finish")
        try:
            self._check()
            yield self._fd
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _check(self) -> None:
        if self._identity() != self._id:
            msg = (f"{self.path} was replaced (by relpos-ref generate) after it was "
                   "opened; open it again")
            raise SuiteReplacedError(msg)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino
