"""The wheel: `backends/` installs as `relpos_ref.backends`, never as a top-level module."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _copy_sources(dest: Path) -> Path:
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for folder in ("relpos_ref", "backends"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return src


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_sources(tmp)
    out = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        text=True,
    )
    (found,) = out.glob("relpos_ref-*.whl")
    return found


def test_wheel_maps_backends_under_the_package(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    assert "relpos_ref/backends/__init__.py" in names
    assert not any(n.startswith("backends/") for n in names)
    packages = {p.parent.as_posix() for p in map(Path, names) if p.name == "__init__.py"}
    on_disk = {
        p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "relpos_ref").rglob("__init__.py")
    }
    assert on_disk <= packages, f"subpackages missing from the wheel: {on_disk - packages}"


def test_wheel_carries_the_license_and_the_typing_marker(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    assert "relpos_ref/py.typed" in names  # PEP 561: the type hints are part of the API
    licenses = [n for n in names if n.endswith("/LICENSE") and ".dist-info/" in n]
    assert licenses, names
    text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
    assert text.startswith("MIT License")


def test_wheel_imports_in_a_clean_environment(wheel: Path, tmp_path: Path):
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    code = (
        "import importlib.util, relpos_ref, relpos_ref.backends as b;"
        "assert importlib.util.find_spec('backends') is None, 'top-level backends installed';"
        "assert b.get('numpy').is_available();"
        "import array_api_compat.numpy as xp;"
        "print(relpos_ref.relative_positions(2, 2, xp=xp).tolist())"
    )
    out = subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "[[0, 1], [-1, 0]]"
    script = env_dir / "bin" / "relpos-ref"
    shown = subprocess.run(
        [str(script), "show", "positions", "--tq", "2"], check=True, capture_output=True, text=True
    )
    assert "i\\j" in shown.stdout
