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
    "CorruptFileError",
    "array_sha256",
    "canonical_bytes",
    "dumps",
    "load",
]

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
    path = Path(path)
    data = path.read_bytes()
    if path.suffix == ".safetensors":
        return _loads_safetensors(data, path)
    if path.suffix == ".npz":
        return _loads_npz(data, path, dtypes or {})
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
    if 8 + n > len(data):
        raise corrupt(f"header of {n} bytes runs past the end; the file is truncated")
    try:
        header = json.loads(data[8 : 8 + n].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
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
            shape = tuple(int(s) for s in entry["shape"])
            start, stop = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise corrupt(f"bad header entry for {name!r}") from None
        if stop - start != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize or start < 0:
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


def _loads_npz(data: bytes, path: Path, dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            out = {name: z[name] for name in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        msg = f"{path}: not a valid npz file ({exc}); the file may be truncated"
        raise CorruptFileError(msg) from None
    for name, a in out.items():
        if dtypes.get(name) == "bfloat16" and a.dtype == np.uint16:
            out[name] = a.view(numpy_dtype("bfloat16"))
    return out
