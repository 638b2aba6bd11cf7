"""What a suite on disk may hold, and the only way relpos-ref reads or writes a file there.

Every read of a suite (`verify`, `check`, the pytest plugin, `generate`'s
comparison with an existing suite), of a directory of results, of a journal
or of a ``--cases`` file goes through `read_plain`: a name must be a regular
file, not a symbolic link (never followed), a directory or anything else,
and no larger than what may be there, or it is refused before a byte is
read. Every file `generate` writes is made by `write_new`, which never
follows or replaces a name that already exists.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = [
    "SuiteError",
    "check_out",
    "entries",
    "kind_of",
    "plain_file",
    "read_plain",
    "resolve",
    "write_new",
]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class SuiteError(ValueError):
    """A problem with a suite directory or a request on it, said in one line."""


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def kind_of(path: Path) -> str | None:
    """What `path` is, its last name not followed: ``"file"``, ``"symbolic link"``,
    ``"directory"``, ``"device"``, ``"special file"``, or ``None`` when absent.

    Examples
    --------
    >>> kind_of(Path("/")), kind_of(Path("/no/such/path"))
    ('directory', None)
    """
    try:
        return _kind(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None
    except OSError as exc:
        msg = f"{path}: cannot be read ({exc.strerror})"
        raise SuiteError(msg) from None


def entries(directory: Path | int) -> dict[str, str]:
    """Each entry of `directory` (a path or an open directory descriptor, not its
    subdirectories) and its kind, links not followed.

    Kinds: ``"file"``, ``"symbolic link"``, ``"directory"``, ``"device"``,
    ``"special file"``.
    """
    out = {}
    with os.scandir(directory) as listing:
        for entry in listing:
            out[entry.name] = _kind(entry.stat(follow_symlinks=False).st_mode)
    return dict(sorted(out.items()))


def _bare(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        msg = f"{name!r} is not a bare file name; a suite is one flat directory of plain files"
        raise SuiteError(msg)


def plain_file(directory: Path, name: str) -> Path | None:
    """``directory / name`` when it is a regular file, ``None`` when absent.

    Raises
    ------
    SuiteError
        `name` is not a bare file name, or names a link, a directory or a
        special file (the message names the path and what it is).
    """
    _bare(name)
    path = directory / name
    kind = kind_of(path)
    if kind not in (None, "file"):
        msg = f"{path} is a {kind}, not a plain file; a suite holds plain files only"
        raise SuiteError(msg)
    return None if kind is None else path


def _size(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} bytes"


def read_plain(path: Path, *, limit: int, what: str, dir_fd: int | None = None,
               follow: bool = False) -> bytes | None:
    """The bytes of the regular file `path`, or ``None`` when it is absent.

    Checked on the open file before anything is read: it is a regular file
    (a symbolic link is refused, not followed, unless `follow`; a directory,
    a device such as ``/dev/zero`` or a named pipe is refused without
    blocking) and holds at most `limit` bytes. With `dir_fd`, ``path.name``
    is opened in that directory (`path` only names it in messages).

    Parameters
    ----------
    path : Path
    limit : int
        The most bytes the file may hold.
    what : str
        What `limit` is, for the message (``"a manifest"``, ``"case X's arrays
        with their headers"``).

    Raises
    ------
    SuiteError
        Naming `path`, what it is, and its size against `limit`.

    Examples
    --------
    >>> read_plain(Path("/dev/zero"), limit=10, what="a test", follow=True)
    Traceback (most recent call last):
    ...
    relpos_ref.golden.paths.SuiteError: /dev/zero is a device, not a plain file; not read
    """
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (0 if follow else _NOFOLLOW)
    try:
        if dir_fd is None:
            fd = os.open(path, flags)
        else:
            _bare(path.name)
            fd = os.open(path.name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            msg = f"{path} is a symbolic link, not a plain file; links are not followed"
        else:
            msg = f"{path}: cannot be read ({exc.strerror})"
        raise SuiteError(msg) from None
    try:
        info = os.fstat(fd)
        kind = _kind(info.st_mode)
        if kind != "file":
            msg = f"{path} is a {kind}, not a plain file; not read"
            raise SuiteError(msg)
        if info.st_size > limit:
            msg = (f"{path} has {info.st_size} bytes ({_size(info.st_size)}), more than "
                   f"{what} can take ({limit} bytes); not read")
            raise SuiteError(msg)
        chunks, left = [], info.st_size + 1  # one byte more: a file that grew is seen
        while left > 0:
            chunk = os.read(fd, min(left, 2**24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        msg = f"{path}: cannot be read ({exc.strerror})"
        raise SuiteError(msg) from None
    finally:
        os.close(fd)
    if len(data) != info.st_size:
        msg = f"{path} changed size while it was read; is something writing it?"
        raise SuiteError(msg)
    return data


def write_new(path: Path, data: bytes) -> None:
    """Write `data` to the new file `path`; a name already there (a link too) is refused.

    Permissions follow the umask.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o666)
    except OSError as exc:
        what = "something is already there" if exc.errno == errno.EEXIST else exc.strerror
        msg = f"cannot write {path} ({what})"
        raise SuiteError(msg) from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        msg = f"cannot write {path} ({exc.strerror})"
        raise SuiteError(msg) from None
    finally:
        os.close(fd)


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
