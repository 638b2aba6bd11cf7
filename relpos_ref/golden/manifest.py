"""The suite's ``manifest.json``: what each case holds, its hashes and tolerances.

The manifest is written as canonical JSON (sorted keys, one-space indent) and
carries a ``digest``: the SHA-256 of the compact canonical JSON of every
other field, so an edit by hand is detected by `relpos_ref.golden.verify`.
Its JSON Schema ships with the package (`schema_path`) and is copied into
every suite as ``manifest.schema.json``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "SCHEMA",
    "ManifestError",
    "check_structure",
    "content_digest",
    "parse",
    "render",
    "schema_path",
]

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
SCHEMA = "manifest.schema.json"
ROLES = ("input", "cotangent", "index", "golden")
#: The kinds of case (`relpos_ref.golden.decode.KINDS`); absent is "forward".
KINDS = ("forward", "decode")
#: A manifest larger than this is refused before it is read.
MAX_MANIFEST_BYTES = 2**28
_EXTENSIONS = {"safetensors": ".safetensors", "npz": ".npz"}
_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "bool")


class ManifestError(ValueError):
    """A manifest that is missing, malformed, or edited after generation."""


def schema_path() -> Path:
    """Path of the published JSON Schema of ``manifest.json``."""
    return Path(__file__).with_name(SCHEMA)


def content_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of the compact canonical JSON of `manifest` without its ``digest``."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def render(manifest: Mapping[str, Any]) -> bytes:
    """The bytes of ``manifest.json``: canonical JSON with the digest filled in."""
    full = {**manifest, "digest": content_digest(manifest)}
    return (json.dumps(full, sort_keys=True, indent=1, allow_nan=False) + "\n").encode()


def parse(data: bytes, *, where: str = MANIFEST) -> dict[str, Any]:
    """Parse and check a manifest: JSON, structure, digest and canonical bytes.

    Raises
    ------
    ManifestError
        With the first problem found.
    """
    from .fileformat import MAX_JSON_DEPTH, json_depth, strict_json

    if len(data) > MAX_MANIFEST_BYTES:
        msg = f"{where} has {len(data)} bytes, more than a manifest can ({MAX_MANIFEST_BYTES})"
        raise ManifestError(msg)
    if json_depth(data) > MAX_JSON_DEPTH:
        msg = f"{where} nests JSON deeper than {MAX_JSON_DEPTH} levels; it is not a manifest"
        raise ManifestError(msg)
    try:
        manifest = strict_json(data)
    except ValueError as exc:
        msg = f"{where} is not valid JSON ({exc}); regenerate the suite"
        raise ManifestError(msg) from None
    check_structure(manifest, where=where)
    if manifest["digest"] != content_digest(manifest):
        msg = f"{where} was edited after generation (its digest does not match its content)"
        raise ManifestError(msg)
    if render(manifest) != data:
        msg = f"{where} was edited after generation (it is not in canonical form)"
        raise ManifestError(msg)
    return manifest


def _need(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        msg = f"{where}: missing field {key!r}"
        raise ManifestError(msg)
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        msg = f"{where}: field {key!r} has the wrong type ({type(value).__name__})"
        raise ManifestError(msg)
    return value


def check_structure(manifest: Any, *, where: str = MANIFEST) -> None:
    """Check the fields `relpos_ref` relies on (the JSON Schema says the same, in full)."""
    from .fileformat import MAX_AXES, MAX_DIMENSION

    if not isinstance(manifest, dict):
        msg = f"{where}: expected a JSON object"
        raise ManifestError(msg)
    version = _need(manifest, "format_version", int, where)
    if version != FORMAT_VERSION:
        msg = (
            f"{where}: format_version {version} is not supported by this relpos-ref "
            f"(it reads version {FORMAT_VERSION})"
        )
        raise ManifestError(msg)
    for key, kind in (("digest", str), ("format", str), ("generator", dict), ("cases", list)):
        _need(manifest, key, kind, where)
    if manifest["format"] not in _EXTENSIONS:
        msg = f"{where}: format {manifest['format']!r} is not one of {', '.join(_EXTENSIONS)}"
        raise ManifestError(msg)
    if not manifest["cases"]:
        msg = f"{where}: the suite has no case"
        raise ManifestError(msg)
    ids = [c.get("id") if isinstance(c, dict) else None for c in manifest["cases"]]
    for n, case in enumerate(manifest["cases"]):
        at = f"{where}: cases[{n}]"
        for key, kind in (
            ("id", str),
            ("scheme", str),
            ("variant", str),
            ("params", dict),
            ("dtype", str),
            ("seed", int),
            ("file", str),
            ("file_sha256", str),
            ("arrays", dict),
        ):
            _need(case, key, kind, at)
        if case.get("kind", "forward") not in KINDS:
            msg = f"{at}: unknown kind {case['kind']!r} (known: {', '.join(KINDS)})"
            raise ManifestError(msg)
        if ids.count(case["id"]) > 1:
            msg = f"{at}: case id {case['id']!r} appears more than once"
            raise ManifestError(msg)
        expected = case["id"].replace("/", "__") + _EXTENSIONS[manifest["format"]]
        if case["file"] != expected or "/" in expected or "\\" in expected or \
                expected.startswith("."):
            msg = (f"{at}: file {case['file']!r} is not the bare file name of case "
                   f"{case['id']!r} ({expected!r}); a suite is one flat directory")
            raise ManifestError(msg)
        for name, entry in case["arrays"].items():
            a_at = f"{at} array {name!r}"
            for key, kind in (("role", str), ("dtype", str), ("shape", list), ("sha256", str)):
                _need(entry, key, kind, a_at)
            if entry["role"] not in ROLES:
                msg = f"{a_at}: unknown role {entry['role']!r}"
                raise ManifestError(msg)
            if entry["dtype"] not in _DTYPES:
                msg = f"{a_at}: unknown dtype {entry['dtype']!r} (known: {', '.join(_DTYPES)})"
                raise ManifestError(msg)
            shape = entry["shape"]
            if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
                msg = f"{a_at}: shape {shape!r} is not a list of non-negative integers"
                raise ManifestError(msg)
            if len(shape) > MAX_AXES or any(s > MAX_DIMENSION for s in shape):
                msg = (f"{a_at}: shape {shape!r} has more than {MAX_AXES} axes or an axis "
                       f"longer than {MAX_DIMENSION}; no case has")
                raise ManifestError(msg)
            if entry["role"] == "golden":
                tol = _need(entry, "tolerance", dict, a_at)
                for key in ("atol", "rtol", "k", "e_max", "e_mean", "max_abs_golden", "ulp_floor"):
                    _need(tol, key, (int, float), f"{a_at} tolerance")
