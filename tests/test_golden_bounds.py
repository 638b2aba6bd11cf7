"""Every read is bounded before it starts; every message names the file (issue 26, item 6).

Sparse giants (``truncate``, nothing written) stand in for the issue's 512 MiB
manifest, case file and result; a forged zip header for an npz that would
inflate; ``/dev/zero``, a named pipe and a directory for ``--cases``. Each is
refused before it is read, with the exact message. Forged numbers (NaN,
``1e999``, a 5000-digit integer, an axis of ``2**70``) in a manifest, a case
file or a result are refused naming the file, by the command line and by the
pytest plugin, never as Python's own words or an INTERNALERROR.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _golden import PluginConfig, read_manifest, right_output, run_pytest, write_results

from relpos_ref import golden, pytest_plugin
from relpos_ref.cli import main
from relpos_ref.golden import fileformat
from relpos_ref.golden.fileformat import file_limit
from relpos_ref.golden.manifest import MANIFEST, MAX_MANIFEST_BYTES

ONE = golden.default_cases().select(["bias/decode-step/*"], dtypes=["float32"])
HALF_GIB = 2**29


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounds")
    golden.generate(root / "golden", ONE)
    write_results(root / "mine", root / "golden", right_output)
    return root


@pytest.fixture
def place(pristine, tmp_path):
    root = tmp_path / "place"
    shutil.copytree(pristine, root)
    return root


def _sparse(path: Path, size: int = HALF_GIB) -> None:
    path.unlink(missing_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def _entry(root: Path) -> dict:
    return read_manifest(root / "golden")["cases"][0]


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    status = main(argv)
    return status, capsys.readouterr().err


def _plugin(root: Path) -> str:
    with pytest.raises(pytest.UsageError) as info:
        pytest_plugin.pytest_configure(PluginConfig(golden_dir=str(root / "golden")))
    return str(info.value)


def _human(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def _too_big(path: Path, size: int, what: str, limit: int) -> str:
    return (f"{path} has {size} bytes ({_human(size)}), more than {what} can take "
            f"({limit} bytes); not read")


# -- sizes checked before reading ------------------------------------------------------------


@pytest.mark.parametrize("entry", ["verify", "check", "diagnose", "plugin"])
def test_a_giant_manifest_is_refused_before_it_is_read(place, entry, capsys):
    manifest = place / "golden" / MANIFEST
    _sparse(manifest)
    message = _too_big(manifest, HALF_GIB, "a manifest", MAX_MANIFEST_BYTES)
    if entry == "plugin":
        assert _plugin(place) == f"--golden-dir: {message}"
        return
    argv = [entry, str(place / "golden")] + ([str(place / "mine")] if entry != "verify" else [])
    assert _cli(argv, capsys) == (2, f"relpos-ref: error: {message}\n")


def _case_limit(entry: dict) -> int:
    return file_limit({n: (a["dtype"], a["shape"]) for n, a in entry["arrays"].items()})


@pytest.mark.parametrize("entry", ["verify", "check", "diagnose"])
def test_a_giant_case_file_is_refused_before_it_is_hashed(place, entry, capsys):
    case = _entry(place)
    path = place / "golden" / case["file"]
    _sparse(path)
    message = _too_big(path, HALF_GIB, f"the arrays of case {case['id']} with their headers",
                       _case_limit(case))
    argv = [entry, str(place / "golden")] + ([str(place / "mine")] if entry != "verify" else [])
    status, err = _cli(argv, capsys)
    if entry == "verify":
        assert status == 1 and err == ""
    else:
        assert (status, err) == (2, f"relpos-ref: error: {message}\n")


def test_verify_names_the_giant_case_file(place, capsys):
    case = _entry(place)
    path = place / "golden" / case["file"]
    _sparse(path)
    report = golden.verify(place / "golden")
    assert report.problems == [_too_big(path, HALF_GIB, f"the arrays of case {case['id']} "
                                        "with their headers", _case_limit(case))]


def test_the_plugin_fails_a_giant_case_file_in_one_line(place, tmp_path):
    _sparse(place / "golden" / _entry(place)["file"])
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text("def test_x(golden_case):\n    pass\n")
    run = run_pytest(project, f"--golden-dir={place / 'golden'}")
    assert run.returncode == 1 and "INTERNALERROR" not in run.stdout + run.stderr
    assert "more than the arrays of case" in run.stdout and "not read" in run.stdout


def _result_limit(entry: dict) -> int:
    return file_limit({n: (a["dtype"], a["shape"]) for n, a in entry["arrays"].items()},
                      widest=True)


@pytest.mark.parametrize("command", ["check", "diagnose"])
@pytest.mark.parametrize("ext", [".safetensors", ".npz"])
def test_a_giant_result_is_refused_before_it_is_read(place, command, ext, capsys):
    case = _entry(place)
    for old in (place / "mine").iterdir():
        old.unlink()
    path = place / "mine" / (case["file"].rsplit(".", 1)[0] + ext)
    _sparse(path)
    message = _too_big(path, HALF_GIB, f"a result of case {case['id']}", _result_limit(case))
    assert _result_limit(case) < 2**20  # the case needs little: the giant is refused outright
    assert _cli([command, str(place / "golden"), str(place / "mine")], capsys) == \
        (2, f"relpos-ref: error: {message}\n")


def _bomb(member: str, claimed: int, payload: bytes) -> bytes:
    """An npz whose member `member` claims to expand to `claimed` bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, payload)
    data = bytearray(buf.getvalue())
    # the uncompressed size, in the local header (offset 22) and the central directory
    struct.pack_into("<I", data, 22, claimed)
    central = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, claimed)
    return bytes(data)


@pytest.fixture(scope="module")
def inflating(tmp_path_factory):
    """A real npz of 0.4 MiB whose ``output`` inflates to 400 MiB (zeros)."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.npz"
    chunk = b"\0" * 2**20
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf, \
            zf.open("output.npy", "w", force_zip64=True) as member:
        member.write(np.lib.format.magic(1, 0))
        for _ in range(400):
            member.write(chunk)
    return path


def test_an_inflating_npz_result_is_refused_by_its_size(place, inflating, capsys):
    case = _entry(place)
    for old in (place / "mine").iterdir():
        old.unlink()
    path = place / "mine" / (case["file"].rsplit(".", 1)[0] + ".npz")
    shutil.copyfile(inflating, path)
    size = path.stat().st_size
    assert 0.3 * 2**20 < size < 0.5 * 2**20
    message = _too_big(path, size, f"a result of case {case['id']}", _result_limit(case))
    assert _cli(["check", str(place / "golden"), str(place / "mine")], capsys) == \
        (2, f"relpos-ref: error: {message}\n")


@pytest.mark.parametrize("claimed", [400 * 2**20, 2**31])
def test_an_npz_member_is_refused_before_it_is_decompressed(place, claimed, capsys):
    # small enough to be read, but its member claims far more than `output` can take
    case = _entry(place)
    for old in (place / "mine").iterdir():
        old.unlink()
    path = place / "mine" / (case["file"].rsplit(".", 1)[0] + ".npz")
    path.write_bytes(_bomb("output.npy", claimed, b"\0" * 64))
    output = case["arrays"]["output"]
    most = file_limit({"output": (output["dtype"], output["shape"])}, widest=True) + 2**16
    assert _cli(["check", str(place / "golden"), str(place / "mine")], capsys) == (
        2, f"relpos-ref: error: {path}: not a valid npz file (member 'output.npy' would "
           f"expand to {claimed} bytes, more than its array can take ({most}); not "
           "decompressed)\n")


def test_loads_file_bounds_members_by_the_limits_given(inflating):
    data = inflating.read_bytes()
    with pytest.raises(fileformat.CorruptFileError,
                       match=r"member 'output\.npy' would expand to 419430408 bytes, more "
                             r"than its array can take \(66560\); not decompressed"):
        fileformat.loads_file(data, inflating, limits={"output": 1024})


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "directory", "giant"])
@pytest.mark.parametrize("command", ["list", "generate"])
def test_a_cases_file_that_is_not_a_file_is_refused_unread(tmp_path, kind, command, capsys):
    path = {"dev-zero": Path("/dev/zero"), "fifo": tmp_path / "cases.toml",
            "directory": tmp_path, "giant": tmp_path / "cases.toml"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "giant":
        _sparse(path, 2**30)
    argv = [command, "--cases", str(path)] + (["--out", str(tmp_path / "g")]
                                               if command == "generate" else [])
    why = {"dev-zero": "is a device, not a plain file; not read",
           "fifo": "is a special file, not a plain file; not read",
           "directory": "is a directory, not a plain file; not read",
           "giant": ("has 1073741824 bytes (1024.0 MiB), more than a cases file can take "
                     "(16777216 bytes); not read")}[kind]
    assert _cli(argv, capsys) == (2, f"relpos-ref: error: --cases {path} {why}\n")


def test_a_cases_file_with_an_endless_integer_is_named(tmp_path, capsys):
    path = tmp_path / "cases.toml"
    path.write_text(f'[[case]]\nscheme = "bias"\nvariant = "x"\nseeds = [{"9" * 5000}]\n')
    assert _cli(["list", "--cases", str(path)], capsys) == (
        2, f"relpos-ref: error: --cases {path}: not a TOML file of cases (it holds an integer "
           "of more digits than Python converts (4300))\n")


# -- forged numbers in a manifest --------------------------------------------------------------


def _forge_text(root: Path, field: str, text: str) -> Path:
    """Replace the first `"field": <number>` of the manifest by `text`, as bytes."""
    path = root / "golden" / MANIFEST
    data = path.read_text()
    key = f'"{field}": '
    start = data.index(key) + len(key)
    end = start
    while data[end] not in ",\n}]":
        end += 1
    path.write_text(data[:start] + text + data[end:])
    return path


NUMBERS = {
    "atol-nan": ("atol", "NaN", "NaN is not a number JSON allows"),
    "atol-infinity": ("atol", "Infinity", "Infinity is not a number JSON allows"),
    "atol-minus-infinity": ("atol", "-Infinity", "-Infinity is not a number JSON allows"),
    "atol-1e999": ("atol", "1e999", "the number 1e999 is beyond float64's range"),
    "e_max-minus-1e999": ("e_max", "-1e999", "the number -1e999 is beyond float64's range"),
    "seed-5000-digits": ("seed", "9" * 5000, "the integer 999999999999... has 5000 digits, "
                         "more than any count or size here (20)"),
    "format-version-21-digits": ("format_version", "1" * 21, "the integer 111111111111... has "
                                 "21 digits, more than any count or size here (20)"),
}


@pytest.mark.parametrize("entry", ["verify", "check", "diagnose", "plugin"])
@pytest.mark.parametrize("number", list(NUMBERS))
def test_a_forged_number_in_the_manifest_names_the_manifest(place, number, entry, capsys):
    field, text, why = NUMBERS[number]
    path = _forge_text(place, field, text)
    message = f"{path} is not valid JSON ({why}); regenerate the suite"
    if entry == "plugin":
        assert _plugin(place) == f"--golden-dir: {message}"
        return
    argv = [entry, str(place / "golden")] + ([str(place / "mine")] if entry != "verify" else [])
    assert _cli(argv, capsys) == (2, f"relpos-ref: error: {message}\n")


def test_a_forged_number_does_not_crash_a_real_pytest_run(place, tmp_path):
    path = _forge_text(place, "atol", "NaN")
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_it.py").write_text("def test_x(golden_case):\n    pass\n")
    run = run_pytest(project, f"--golden-dir={place / 'golden'}")
    assert run.returncode == 4 and "INTERNALERROR" not in run.stdout + run.stderr
    assert (f"ERROR: --golden-dir: {path} is not valid JSON (NaN is not a number JSON "
            "allows); regenerate the suite") in run.stderr


@pytest.mark.parametrize("shape", [[0, 2**62], [2**41], [1] * 17])
def test_a_forged_shape_in_the_manifest_names_the_field(place, shape, capsys):
    manifest = read_manifest(place / "golden")
    manifest["cases"][0]["arrays"]["output"]["shape"] = shape
    from _golden import write_manifest

    write_manifest(place / "golden", manifest)
    path = place / "golden" / MANIFEST
    message = (f"{path}: cases[0] array 'output': shape {shape!r} has more than 16 axes or "
               "an axis longer than 1099511627776; no case has")
    assert _cli(["verify", str(place / "golden")], capsys) == \
        (2, f"relpos-ref: error: {message}\n")


# -- forged headers in results -------------------------------------------------------------------


def _safetensors(header: dict, body: bytes = b"") -> bytes:
    text = json.dumps(header).encode() if isinstance(header, dict) else header
    return struct.pack("<Q", len(text)) + text + body


def _npy_member(shape_text: str) -> bytes:
    header = ("{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_text + ", }")
    header = header.ljust(118) + "\n"
    raw = np.lib.format.magic(1, 0) + struct.pack("<H", len(header)) + header.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("output.npy", raw)
    return buf.getvalue()


HEADERS = {
    "axis-2**70": (".safetensors", _safetensors(
        {"output": {"dtype": "F32", "shape": [0, 2**70], "data_offsets": [0, 0]}}),
        "not a valid safetensors file (header is not JSON: the integer 118059162071... has "
        "22 digits, more than any count or size here (20))"),
    "axis-2**62": (".safetensors", _safetensors(
        {"output": {"dtype": "F32", "shape": [0, 2**62], "data_offsets": [0, 0]}}),
        "not a valid safetensors file (bad header entry for 'output': 4611686018427387904 "
        "is larger than any length here (1099511627776))"),
    "seventeen-axes": (".safetensors", _safetensors(
        {"output": {"dtype": "F32", "shape": [1] * 17, "data_offsets": [0, 4]}}, b"\0" * 4),
        "not a valid safetensors file (bad header entry for 'output': a shape is a list of "
        "at most 16 lengths)"),
    "offset-5000-digits": (".safetensors", _safetensors(
        b'{"output": {"dtype": "F32", "shape": [0], "data_offsets": [0, ' + b"9" * 5000
        + b"]}}"),
        "not a valid safetensors file (header is not JSON: the integer 999999999999... has "
        "5000 digits, more than any count or size here (20))"),
    "nan-shape": (".safetensors", _safetensors(
        b'{"output": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 0]}}'),
        "not a valid safetensors file (header is not JSON: NaN is not a number JSON allows)"),
    "npy-axis-2**70": (".npz", _npy_member(f"(0, {2**70})"),
                       f"not a valid npz file (shape (0, {2**70}): {2**70} is larger than any "
                       "length here (1099511627776))"),
}


@pytest.mark.parametrize("command", ["check", "diagnose"])
@pytest.mark.parametrize("forgery", list(HEADERS))
def test_a_forged_result_header_is_refused_naming_the_file(place, forgery, command, capsys):
    ext, data, why = HEADERS[forgery]
    case = _entry(place)
    for old in (place / "mine").iterdir():
        old.unlink()
    path = place / "mine" / (case["file"].rsplit(".", 1)[0] + ext)
    path.write_bytes(data)
    assert _cli([command, str(place / "golden"), str(place / "mine")], capsys) == \
        (2, f"relpos-ref: error: {path}: {why}\n")
