"""Helpers shared by the golden-suite tests: a small suite, results, forgeries.

A forgery here is what a careful adversary would do: change a manifest or a
case file *and* recompute every hash and the digest, so only a check that
re-derives the case can see it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from relpos_ref import golden
from relpos_ref.golden import fileformat
from relpos_ref.golden.dtypes import numpy_dtype
from relpos_ref.golden.manifest import MANIFEST, render

#: Four small cases: float32 and bfloat16, a table scheme and a bias scheme.
SMALL = golden.default_cases().select(
    ["shaw/clip/*", "bias/decode-step/*"], dtypes=["float32", "bfloat16"]
)


def make_suite(out: Path, fmt: str = "safetensors") -> Path:
    """Generate `SMALL` at `out` and return `out`."""
    result = golden.generate(out, SMALL, fmt=fmt)
    assert result.status == "written" and result.cases == len(SMALL)
    return out


def read_manifest(suite: Path) -> dict[str, Any]:
    return json.loads((suite / MANIFEST).read_text())


def write_manifest(suite: Path, manifest: dict[str, Any]) -> None:
    """Write `manifest` in canonical form with a correct digest (a consistent forgery)."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    (suite / MANIFEST).write_bytes(render(body))


def forge_manifest(suite: Path, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply `edit` to the manifest and write it back with a recomputed digest."""
    manifest = read_manifest(suite)
    edit(manifest)
    write_manifest(suite, manifest)
    return manifest


def forge_arrays(
    suite: Path, index: int, edit: Callable[[dict[str, np.ndarray]], None]
) -> None:
    """Edit case `index`'s arrays and recompute its file hash, array hashes and digest."""
    manifest = read_manifest(suite)
    entry = manifest["cases"][index]
    path = suite / entry["file"]
    dtypes = {n: a["dtype"] for n, a in entry["arrays"].items()}
    arrays = fileformat.load(path, dtypes=dtypes)
    edit(arrays)
    data = fileformat.dumps(arrays, manifest["format"])
    path.write_bytes(data)
    entry["file_sha256"] = hashlib.sha256(data).hexdigest()
    for name, a in arrays.items():
        if name in entry["arrays"]:
            entry["arrays"][name]["sha256"] = fileformat.array_sha256(a)
            entry["arrays"][name]["shape"] = list(a.shape)
    write_manifest(suite, manifest)


def write_results(
    directory: Path,
    suite: Path,
    make: Callable[[golden.GoldenCase], dict[str, np.ndarray] | None],
    fmt: str = "safetensors",
) -> Path:
    """One result file per case of `suite`, holding `make(case)` (skipped when None)."""
    directory.mkdir(exist_ok=True)
    opened = golden.load_suite(suite)
    for cid in opened.cases:
        case = opened.load(cid)
        arrays = make(case)
        if arrays is not None:
            stem = case.entry["file"].rsplit(".", 1)[0]
            (directory / (stem + fileformat.EXTENSIONS[fmt])).write_bytes(
                fileformat.dumps(arrays, fmt)
            )
    return directory


def right_output(case: golden.GoldenCase) -> dict[str, np.ndarray]:
    """The golden output in the case's dtype: a correct result."""
    return {"output": case.expected["output"].astype(numpy_dtype(case.dtype))}


def result_name(suite: Path, index: int = 0, ext: str = ".safetensors") -> str:
    """The result file name of case `index` of `suite`."""
    return read_manifest(suite)["cases"][index]["file"].rsplit(".", 1)[0] + ext


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    """Run pytest in a consumer project `project` (its own tests, this package's plugin)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project, capture_output=True, text=True, env=env, timeout=300, check=False,
    )


class PluginConfig:
    """The parts of a pytest ``Config`` the relpos-ref plugin reads, for calling its hooks
    in this process (faster than a pytest run; `run_pytest` covers the real thing)."""

    def __init__(self, golden_dir: str | None = None, select: list[str] | None = None,
                 ini: dict[str, Any] | None = None, **options: Any) -> None:
        self.options = {"--golden-dir": golden_dir, "--golden-select": select,
                        **{f"--{k.replace('_', '-')}": v for k, v in options.items()}}
        self.ini = ini or {}
        self.inipath = None
        self.rootpath = Path.cwd()

    def getoption(self, name: str) -> Any:
        return self.options.get(name)

    def getini(self, name: str) -> Any:
        return self.ini.get(name)
