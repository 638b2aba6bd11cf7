"""What a suite on disk may hold: one flat directory of plain files.

Every read of a suite (`verify`, `check`, the pytest plugin, `generate`'s
comparison with an existing suite) and of a directory of results goes
through here: names are bare file names, and a name must be a regular file,
not a symbolic link, a directory or anything else, or it is refused before
anything is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["SuiteError", "entries", "plain_file"]


class SuiteError(ValueError):
    """A problem with a suite directory or a request on it, said in one line."""


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISDIR(mode):
        return "directory"
    return "special file"


def entries(directory: Path) -> dict[str, str]:
    """Each entry of `directory` (not its subdirectories) and its kind, links not followed.

    Kinds: ``"file"``, ``"symbolic link"``, ``"directory"``, ``"special file"``.
    """
    out = {}
    with os.scandir(directory) as listing:
        for entry in listing:
            out[entry.name] = _kind(entry.stat(follow_symlinks=False).st_mode)
    return dict(sorted(out.items()))


def plain_file(directory: Path, name: str) -> Path | None:
    """``directory / name`` when it is a regular file, ``None`` when absent.

    Raises
    ------
    SuiteError
        `name` is not a bare file name, or names a link, a directory or a
        special file (the message names the path and what it is).
    """
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        msg = f"{name!r} is not a bare file name; a suite is one flat directory of plain files"
        raise SuiteError(msg)
    path = directory / name
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        msg = f"{path}: cannot be read ({exc.strerror})"
        raise SuiteError(msg) from None
    kind = _kind(mode)
    if kind != "file":
        msg = f"{path} is a {kind}, not a plain file; a suite holds plain files only"
        raise SuiteError(msg)
    return path
