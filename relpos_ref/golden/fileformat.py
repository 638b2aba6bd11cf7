"""Reading and writing one case's arrays: safetensors (default) or npz.

safetensors is written here directly, without the ``safetensors`` package:
an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (padded with
spaces to a multiple of 8) mapping each name to its dtype, shape and byte
range, then the arrays' little-endian C-order bytes back to back. Files load
with ``safetensors.numpy.load_file`` / ``safetensors.torch.load_file`` and
from C++ or Rust.

npz is the zero-dependency alternative. It has no bfloat16, so bfloat16
arrays are stored as their ``uint16`` bit patterns; the manifest records the
real dtype. Zip entries carry a fixed timestamp, so both formats give
byte-identical files for identical arrays.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .dtypes import dtype_name, numpy_dtype

__all__ = [
    "EXTENSIONS",
    "FORMATS",
    "MAX_AXES",
    "MAX_DIMENSION",
    "MAX_HEADER_BYTES",
    "MAX_JSON_DEPTH",
    "CorruptFileError",
    "array_sha256",
    "canonical_bytes",
    "dumps",
    "file_limit",
    "json_depth",
    "load",
    "loads_file",
    "strict_json",
]

#: A safetensors header longer than this is refused before it is decoded.
MAX_HEADER_BYTES = 2**24
#: JSON (headers, manifests) nested deeper than this is refused before it is parsed.
MAX_JSON_DEPTH = 32
#: The largest length of an axis, and the most axes, an array read from a file may have.
MAX_DIMENSION = 2**40
MAX_AXES = 16
#: The most digits an integer in a header or manifest may have (int64 has 19).
_MAX_DIGITS = 20
#: Bytes a file may hold besides its arrays' data: a header per file and per array.
_HEADER_ALLOWANCE = 8192
_ARRAY_ALLOWANCE = 1024

FORMATS = ("safetensors", "npz")
EXTENSIONS = {"safetensors": ".safetensors", "npz": ".npz"}

_ST_CODES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "bool": "BOOL",
}
_ST_NAMES = {code: name for name, code in _ST_CODES.items()}
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class CorruptFileError(ValueError):
    """A case file that cannot be read: truncated, malformed or inconsistent."""


def canonical_bytes(a: np.ndarray) -> bytes:
    """The array's bytes in C order, little-endian: what is hashed and stored."""
    a = np.asarray(a, order="C")
    order = a.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        a = a.byteswap()
    return a.tobytes(order="C")


def array_sha256(a: np.ndarray) -> str:
    """Hex SHA-256 of `canonical_bytes` of `a`.

    Examples
    --------
    >>> import numpy as np
    >>> array_sha256(np.zeros(0, dtype=np.float32))[:16]
    'e3b0c44298fc1c14'
    """
    return hashlib.sha256(canonical_bytes(a)).hexdigest()


def dumps(arrays: Mapping[str, np.ndarray], fmt: str) -> bytes:
    """Serialize named arrays (sorted by name) to the bytes of one file."""
    names = sorted(arrays)
    if fmt == "safetensors":
        return _dumps_safetensors({n: arrays[n] for n in names})
    if fmt == "npz":
        return _dumps_npz({n: arrays[n] for n in names})
    msg = f"`format` must be one of {', '.join(FORMATS)}, got {fmt!r}"
    raise ValueError(msg)


def json_depth(text: bytes) -> int:
    """How deeply `text`'s JSON nests arrays and objects, by a scan that parses nothing.

    Examples
    --------
    >>> json_depth(b'{"a": [1, {"b": "[["}]}')
    3
    """
    depth = top = 0
    in_string = escaped = False
    for byte in text:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            top = max(top, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return top


def strict_json(data: bytes) -> Any:
    """Parse JSON refusing what a manifest or header never holds: ``NaN``,
    ``Infinity``, a number out of float64's range (``1e999``) and an integer of more
    than 20 digits, each with a `ValueError` saying which.

    Examples
    --------
    >>> strict_json(b'{"a": [1, 2.5]}')
    {'a': [1, 2.5]}
    >>> strict_json(b'{"atol": 1e999}')
    Traceback (most recent call last):
    ...
    ValueError: the number 1e999 is beyond float64's range
    """
    def constant(name: str) -> float:
        msg = f"{name} is not a number JSON allows"
        raise ValueError(msg)

    def real(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            msg = f"the number {text[:40]} is beyond float64's range"
            raise ValueError(msg)
        return value

    def integer(text: str) -> int:
        if len(text.lstrip("-")) > _MAX_DIGITS:
            msg = (f"the integer {text[:12]}... has {len(text.lstrip('-'))} digits, more "
                   f"than any count or size here ({_MAX_DIGITS})")
            raise ValueError(msg)
        return int(text)

    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        msg = f"not UTF-8: {exc.reason} at byte {exc.start}"
        raise ValueError(msg) from None
    try:
        return json.loads(text, parse_constant=constant, parse_float=real, parse_int=integer)
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None


def file_limit(arrays: Mapping[str, tuple[str, Any]], *, widest: bool = False) -> int:
    """The most bytes a file of these arrays may take: their data and headers.

    Parameters
    ----------
    arrays : mapping
        ``name -> (dtype name, shape)``, as a manifest records them.
    widest : bool
        Allow every array in 8-byte elements (results may be wider than the
        case's dtype), and npz compression's small overhead.

    Examples
    --------
    >>> file_limit({"output": ("float32", [2, 3])})
    9240
    """
    data = 0
    for dtype, shape in arrays.values():
        size = 8 if widest else numpy_dtype(dtype).itemsize
        data += math.prod(shape) * size
    if widest:
        data += data // 64
    return data + _HEADER_ALLOWANCE + _ARRAY_ALLOWANCE * len(arrays)


def load(path: Path, *, dtypes: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
    """Read the arrays of one case file (format from the suffix).

    Parameters
    ----------
    path : Path
        A ``.safetensors`` or ``.npz`` file.
    dtypes : mapping, optional
        Stored dtype names by array; lets npz ``uint16`` bit patterns be read
        back as bfloat16.

    Raises
    ------
    CorruptFileError
        Truncated or malformed files, with the reason.
    """
    from .paths import SuiteError, read_plain

    path = Path(path)
    try:
        data = read_plain(path, limit=2**40, what="an array file", follow=True)
    except SuiteError as exc:
        raise CorruptFileError(str(exc)) from None
    if data is None:
        msg = f"{path} does not exist"
        raise CorruptFileError(msg)
    return loads_file(data, path, dtypes=dtypes)


def loads_file(
    data: bytes, path: Path, *, dtypes: Mapping[str, str] | None = None,
    limits: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """`load` of bytes already read from `path` (the suffix says the format).

    `limits` bounds, by name, the bytes an npz member may expand to (its
    ``.npy`` header aside), checked before it is decompressed; a name not in
    it gets the largest.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        return _loads_safetensors(data, path)
    if path.suffix == ".npz":
        return _loads_npz(data, path, dtypes or {}, limits)
    msg = f"{path}: unknown file type {path.suffix!r}; expected .safetensors or .npz"
    raise ValueError(msg)


def _dumps_safetensors(arrays: Mapping[str, np.ndarray]) -> bytes:
    header: dict[str, Any] = {}
    chunks = []
    offset = 0
    for name, a in arrays.items():
        raw = canonical_bytes(a)
        header[name] = {
            "dtype": _ST_CODES[dtype_name(a.dtype)],
            "shape": [int(s) for s in a.shape],
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def _loads_safetensors(data: bytes, path: Path) -> dict[str, np.ndarray]:
    def corrupt(why: str) -> CorruptFileError:
        return CorruptFileError(f"{path}: not a valid safetensors file ({why})")

    if len(data) < 8:
        raise corrupt(f"{len(data)} bytes, too short for a header")
    (n,) = struct.unpack("<Q", data[:8])
    if n > min(len(data) - 8, MAX_HEADER_BYTES):
        raise corrupt(f"header of {n} bytes runs past the end or a sane size "
                      f"({len(data) - 8} bytes follow); the file is truncated or forged")
    text = data[8 : 8 + n]
    if json_depth(text) > MAX_JSON_DEPTH:
        raise corrupt(f"header nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        header = strict_json(text)
    except (ValueError, RecursionError) as exc:
        raise corrupt(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise corrupt("header is not a JSON object")
    header.pop("__metadata__", None)
    body = data[8 + n :]
    out = {}
    spans = []
    for name, entry in header.items():
        try:
            dtype = numpy_dtype(_ST_NAMES[entry["dtype"]])
            shape = _shape(entry["shape"])
            start, stop = (_dimension(o, 2**63 - 1) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            why = f": {exc}" if isinstance(exc, ValueError) else ""
            raise corrupt(f"bad header entry for {name!r}{why}") from None
        if stop - start != math.prod(shape) * dtype.itemsize:
            raise corrupt(f"byte range of {name!r} does not match its shape and dtype")
        if stop > len(body):
            raise corrupt(f"{name!r} runs past the end; the file is truncated")
        spans.append((start, stop))
        a = np.frombuffer(body[start:stop], dtype=dtype).copy()
        out[name] = (a.byteswap() if sys.byteorder == "big" else a).reshape(shape)
    spans.sort()
    if [s for s, _ in spans] != [0, *(e for _, e in spans[:-1])] or (
        spans and spans[-1][1] != len(body)
    ):
        raise corrupt("arrays do not cover the data exactly (gaps, overlaps or trailing bytes)")
    return out


def _dumps_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, a in arrays.items():
            if dtype_name(a.dtype) == "bfloat16":
                a = a.view(np.uint16)
            entry = io.BytesIO()
            np.lib.format.write_array(entry, np.asarray(a, order="C"), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME)
            info.external_attr = 0o644 << 16
            zf.writestr(info, entry.getvalue())
    return buf.getvalue()


def _dimension(value: Any, top: int = MAX_DIMENSION) -> int:
    # A shape entry or byte offset of a header: a non-negative integer, nothing else.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"not a non-negative integer: {value!r}"
        raise ValueError(msg)
    if value > top:
        msg = f"{value} is larger than any length here ({top})"
        raise ValueError(msg)
    return value


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_AXES:
        msg = f"a shape is a list of at most {MAX_AXES} lengths"
        raise ValueError(msg)
    return tuple(_dimension(s) for s in value)


#: An npz member may expand to at most this many times the file's size (zip bombs)
#: when no limits are given.
_MAX_EXPANSION = 1024


def _loads_npz(data: bytes, path: Path, dtypes: Mapping[str, str],
               limits: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    # Each member's .npy header (shape, dtype) is checked against the member's size, and
    # the sizes against the file's, before any array is allocated or decompressed.
    def corrupt(why: str) -> CorruptFileError:
        return CorruptFileError(f"{path}: not a valid npz file ({why})")

    out = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy") or "/" in info.filename:
                    raise corrupt(f"member {info.filename!r} is not a flat .npy array")
                name = info.filename[:-4]
                if limits:
                    most = limits.get(name, max(limits.values())) + 2**16  # + .npy header
                else:
                    most = _MAX_EXPANSION * max(len(data), 2**20)
                if info.file_size > most:
                    raise corrupt(f"member {info.filename!r} would expand to "
                                  f"{info.file_size} bytes, more than its array can take "
                                  f"({most}); not decompressed")
                with zf.open(info) as member:
                    out[info.filename[:-4]] = _read_npy(member, info.file_size, corrupt)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, struct.error) as exc:
        if isinstance(exc, CorruptFileError):
            raise
        raise corrupt(f"{exc}; the file may be truncated") from None
    for name, a in out.items():
        if dtypes.get(name) == "bfloat16" and a.dtype == np.uint16:
            out[name] = a.view(numpy_dtype("bfloat16"))
    return out


def _read_npy(member: Any, size: int, corrupt: Any) -> np.ndarray:
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member, max_header_size=2**16)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member, max_header_size=2**16)
    else:
        raise corrupt(f"unknown .npy version {version}")
    if dtype.hasobject or dtype.kind not in "biuf":
        raise corrupt(f"dtype {dtype} is not a number or bool")
    try:
        shape = _shape(shape)
    except ValueError as exc:
        raise corrupt(f"shape {shape}: {exc}") from None
    expected = math.prod(shape) * dtype.itemsize
    remaining = size - member.tell()
    if expected != remaining:
        raise corrupt(f"an array of shape {shape} and dtype {dtype} needs {expected} bytes, "
                      f"the member holds {remaining}")
    raw = member.read(expected)
    if len(raw) != expected:
        raise corrupt("the member ends early")
    a = np.frombuffer(raw, dtype=dtype).copy()
    return a.reshape(shape, order="F" if fortran else "C")
