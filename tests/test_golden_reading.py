"""Bounded reading (issue 15, category 4).

Header lengths, shapes, byte ranges and JSON depth are checked against the
file's size and sane limits before anything is allocated or parsed; the
error is a `CorruptFileError` or `ManifestError` (a `SuiteError` once
through a suite) naming the file, never a RecursionError, MemoryError,
KeyError or StopIteration.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from _golden import SMALL, make_suite, read_manifest, write_manifest

from relpos_ref import golden
from relpos_ref.cli import main
from relpos_ref.golden import fileformat, manifest
from relpos_ref.golden.manifest import MANIFEST, ManifestError

# -- safetensors -----------------------------------------------------------------------


def _safetensors(header: object, body: bytes = b"", *, raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


ST_BAD = {
    "empty": (b"", "too short for a header"),
    "seven-bytes": (b"\x01" * 7, "too short for a header"),
    "header-2**63": (struct.pack("<Q", 2**63) + b"{}", "runs past the end or a sane size"),
    "header-2**64-1": (struct.pack("<Q", 2**64 - 1) + b"{}", "runs past the end"),
    "header-past-end": (struct.pack("<Q", 100) + b"{}", "runs past the end"),
    "header-too-big": (
        struct.pack("<Q", fileformat.MAX_HEADER_BYTES + 8)
        + b" " * (fileformat.MAX_HEADER_BYTES + 8),
        "runs past the end or a sane size",
    ),
    "deep-json": (_safetensors(None, raw=b"[" * 100_000 + b"]" * 100_000), "nests deeper"),
    "deep-objects": (_safetensors(None, raw=b'{"a":' * 5000 + b"1" + b"}" * 5000),
                     "nests deeper"),
    "not-json": (_safetensors(None, raw=b"{nope"), "header is not JSON"),
    "not-utf8": (_safetensors(None, raw=b'{"\xff": 1}'), "header is not JSON"),
    "a-list": (_safetensors([1, 2]), "header is not a JSON object"),
    "a-number": (_safetensors(3), "header is not a JSON object"),
    "entry-not-object": (_safetensors({"x": 5}), "bad header entry for 'x'"),
    "unknown-dtype": (_safetensors({"x": _entry(dtype="F8")}, b"\0" * 8), "bad header entry"),
    "int32-dtype": (_safetensors({"x": _entry(dtype="I32")}, b"\0" * 8), "bad header entry"),
    "no-shape": (_safetensors({"x": {"dtype": "F32", "data_offsets": [0, 8]}}, b"\0" * 8),
                 "bad header entry"),
    "negative-dim": (_safetensors({"x": _entry(shape=(-2,))}, b"\0" * 8), "bad header entry"),
    "float-dim": (_safetensors({"x": _entry(shape=(2.0,))}, b"\0" * 8), "bad header entry"),
    "bool-dim": (_safetensors({"x": _entry(shape=(True, 2))}, b"\0" * 8), "bad header entry"),
    "string-dim": (_safetensors({"x": _entry(shape=("2",))}, b"\0" * 8), "bad header entry"),
    "huge-shape": (_safetensors({"x": _entry(shape=(2**40, 2**40))}, b"\0" * 8),
                   "does not match its shape"),
    "huge-shape-and-offsets": (
        _safetensors({"x": _entry(shape=(2**31, 2**31), offsets=(0, 2**64))}, b"\0" * 8),
        r"bad header entry for 'x': 18446744073709551616 is larger than any length here",
    ),
    "offsets-past-end": (_safetensors({"x": _entry(shape=(4,), offsets=(0, 16))}, b"\0" * 8),
                         "runs past the end; the file is truncated"),
    "offsets-reversed": (_safetensors({"x": _entry(offsets=(8, 0))}, b"\0" * 8),
                         "does not match its shape"),
    "negative-offset": (_safetensors({"x": _entry(offsets=(-8, 0))}, b"\0" * 8),
                        "bad header entry"),
    "one-offset": (_safetensors({"x": _entry(offsets=(8,))}, b"\0" * 8), "bad header entry"),
    "gap": (_safetensors({"x": _entry(offsets=(8, 16))}, b"\0" * 16), "cover the data exactly"),
    "overlap": (_safetensors({"x": _entry(), "y": _entry()}, b"\0" * 8),
                "cover the data exactly"),
    "trailing": (_safetensors({"x": _entry()}, b"\0" * 9), "cover the data exactly"),
}


@pytest.mark.parametrize("name", list(ST_BAD))
def test_a_bad_safetensors_file_is_refused_by_name(name, tmp_path):
    data, text = ST_BAD[name]
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(data)
    with pytest.raises(fileformat.CorruptFileError, match=text) as info:
        fileformat.load(path)
    assert str(info.value).startswith(f"{path}: not a valid safetensors file")


def test_a_well_formed_header_with_metadata_still_reads(tmp_path):
    data = _safetensors({"__metadata__": {"a": "b"}, "x": _entry()}, b"\0" * 8)
    (tmp_path / "ok.safetensors").write_bytes(data)
    got = fileformat.load(tmp_path / "ok.safetensors")
    assert list(got) == ["x"] and got["x"].dtype == np.float32 and got["x"].tolist() == [0, 0]


# -- npz ------------------------------------------------------------------------------------


def _npy(shape, dtype="<f4", body=None, *, fortran=False, version=(1, 0)):
    header = {"descr": dtype, "fortran_order": fortran, "shape": tuple(shape)}
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header) if version == (1, 0) else \
        np.lib.format.write_array_header_2_0(buf, header)
    return buf.getvalue() + (body if body is not None else b"")


def _npz(members, compression=zipfile.ZIP_STORED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


NPZ_BAD = {
    "empty": (b"", "not a valid npz file"),
    "not-a-zip": (b"PK\x03\x04garbage", "the file may be truncated"),
    "member-not-npy": (_npz({"output.txt": b"1"}), "is not a flat .npy array"),
    "member-in-a-folder": (_npz({"a/output.npy": _npy((1,), body=b"\0" * 4)}),
                           "is not a flat .npy array"),
    "member-parent": (_npz({"../output.npy": _npy((1,), body=b"\0" * 4)}),
                      "is not a flat .npy array"),
    "bad-magic": (_npz({"x.npy": b"\x93NUMPX" + b"\0" * 20}), "not a valid npz file"),
    "unknown-version": (_npz({"x.npy": b"\x93NUMPY\x09\x00" + b"\0" * 20}),
                        "not a valid npz file"),
    "huge-shape": (_npz({"x.npy": _npy((2**40, 2**20), body=b"\0" * 16)}),
                   "needs 4611686018427387904 bytes, the member holds 16"),
    "short-body": (_npz({"x.npy": _npy((4,), body=b"\0" * 15)}), "needs 16 bytes"),
    "long-body": (_npz({"x.npy": _npy((4,), body=b"\0" * 17)}), "needs 16 bytes"),
    "object-dtype": (_npz({"x.npy": _npy((1,), dtype="|O", body=b"\0" * 8)}),
                     "not a valid npz file"),
    "string-dtype": (_npz({"x.npy": _npy((1,), dtype="<U4", body=b"\0" * 16)}),
                     "is not a number or bool"),
    "complex-dtype": (_npz({"x.npy": _npy((1,), dtype="<c8", body=b"\0" * 8)}),
                      "is not a number or bool"),
    "header-not-a-dict": (_npz({"x.npy": b"\x93NUMPY\x01\x00\x06\x00[1]  \n"}),
                          "not a valid npz file"),
    "truncated-zip": (_npz({"x.npy": _npy((4,), body=b"\0" * 16)})[:-30],
                      "not a valid npz file"),
}


@pytest.mark.parametrize("name", list(NPZ_BAD))
def test_a_bad_npz_file_is_refused_by_name(name, tmp_path):
    data, text = NPZ_BAD[name]
    path = tmp_path / f"{name}.npz"
    path.write_bytes(data)
    with pytest.raises(fileformat.CorruptFileError, match=text.replace(".", r"\.")) as info:
        fileformat.load(path)
    assert str(info.value).startswith(f"{path}: not a valid npz file")


def test_a_member_that_expands_beyond_the_limit_is_refused_before_it_is_read(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(fileformat, "_MAX_EXPANSION", 2)
    data = _npz({"x.npy": _npy((2**19,), body=b"\0" * 2**21)}, zipfile.ZIP_DEFLATED)
    assert len(data) < 2**16  # zeros compress well
    path = tmp_path / "bomb.npz"
    path.write_bytes(data)
    with pytest.raises(fileformat.CorruptFileError, match=r"would expand to \d+ bytes"):
        fileformat.load(path)


def test_a_version_2_and_a_fortran_order_npy_still_read(tmp_path):
    a = np.arange(6, dtype="<f8").reshape(2, 3)
    members = {
        "c.npy": _npy((2, 3), "<f8", a.tobytes(), version=(2, 0)),
        "f.npy": _npy((2, 3), "<f8", a.tobytes(order="F"), fortran=True),
    }
    (tmp_path / "ok.npz").write_bytes(_npz(members))
    got = fileformat.load(tmp_path / "ok.npz")
    np.testing.assert_array_equal(got["c"], a)
    np.testing.assert_array_equal(got["f"], a)


def test_an_unknown_suffix_is_refused(tmp_path):
    (tmp_path / "x.pt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"unknown file type '\.pt'"):
        fileformat.load(tmp_path / "x.pt")


# -- manifests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_suite(tmp_path_factory.mktemp("reading") / "golden")


@pytest.fixture
def suite(pristine, tmp_path):
    return Path(shutil.copytree(pristine, tmp_path / "golden"))


def _set(path, value):
    def edit(m):
        target = m
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return edit


MANIFEST_BAD = {
    "unknown-dtype": (_set(["cases", 0, "arrays", "output", "dtype"], "int8"),
                      "unknown dtype 'int8'"),
    "unknown-role": (_set(["cases", 0, "arrays", "q", "role"], "secret"), "unknown role"),
    "no-cases": (_set(["cases"], []), "the suite has no case"),
    "cases-not-a-list": (_set(["cases"], {}), "field 'cases' has the wrong type"),
    "case-not-an-object": (_set(["cases", 0], 7), "missing field 'id'"),
    "missing-id": (_set(["cases", 0, "id"], KeyError), "missing field 'id'"),
    "missing-arrays": (_set(["cases", 0, "arrays"], KeyError), "missing field 'arrays'"),
    "seed-as-text": (_set(["cases", 0, "seed"], "0"), "field 'seed' has the wrong type"),
    "seed-as-bool": (_set(["cases", 0, "seed"], False), "field 'seed' has the wrong type"),
    "duplicate-id": (lambda m: m["cases"].append(m["cases"][0]), "appears more than once"),
    "negative-shape": (_set(["cases", 0, "arrays", "q", "shape"], [-1, 2]),
                       "is not a list of non-negative integers"),
    "float-shape": (_set(["cases", 0, "arrays", "q", "shape"], [2.0]),
                    "is not a list of non-negative integers"),
    "bool-shape": (_set(["cases", 0, "arrays", "q", "shape"], [True]),
                   "is not a list of non-negative integers"),
    "shape-not-a-list": (_set(["cases", 0, "arrays", "q", "shape"], 3),
                         "field 'shape' has the wrong type"),
    "no-tolerance": (_set(["cases", 0, "arrays", "output", "tolerance"], KeyError),
                     "missing field 'tolerance'"),
    "tolerance-field-missing": (_set(["cases", 0, "arrays", "output", "tolerance", "atol"],
                                     KeyError), "missing field 'atol'"),
    "tolerance-as-text": (_set(["cases", 0, "arrays", "output", "tolerance", "atol"], "1"),
                          "field 'atol' has the wrong type"),
    "format-hdf5": (_set(["format"], "hdf5"), "format 'hdf5' is not one of"),
    "version-1": (_set(["format_version"], 1), "format_version 1 is not supported"),
    "version-3": (_set(["format_version"], 3), "format_version 3 is not supported"),
    "version-as-text": (_set(["format_version"], "1"), "has the wrong type"),
    "no-version": (_set(["format_version"], KeyError), "missing field 'format_version'"),
    "no-generator": (_set(["generator"], KeyError), "missing field 'generator'"),
}


@pytest.mark.parametrize("name", list(MANIFEST_BAD))
def test_a_malformed_manifest_is_refused_by_name(suite, name):
    edit, text = MANIFEST_BAD[name]
    m = read_manifest(suite)
    edit(m)
    write_manifest(suite, m)
    with pytest.raises(golden.SuiteError, match=text) as info:
        golden.load_suite(suite)
    assert str(suite / MANIFEST) in str(info.value)


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"[" * 200_000, "nests JSON deeper than 32 levels"),
        (b'{"a":' * 100 + b"1" + b"}" * 100, "nests JSON deeper"),
        (b"\xff\xfe", "is not valid JSON"),
        (b"", "is not valid JSON"),
        (b"{", "is not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'"text"', "expected a JSON object"),
        (b"NaN", r"is not valid JSON \(NaN is not a number JSON allows\)"),
    ],
    ids=["deep-list", "deep-object", "not-utf8", "empty", "unclosed", "list", "string", "nan"],
)
def test_manifest_bytes_that_are_not_a_manifest_are_refused(suite, data, text):
    (suite / MANIFEST).write_bytes(data)
    with pytest.raises(golden.SuiteError, match=text):
        golden.load_suite(suite)


def test_a_manifest_beyond_the_size_limit_is_not_parsed(suite, monkeypatch):
    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(ManifestError, match=r"bytes, more than a manifest can \(1000\)"):
        manifest.parse((suite / MANIFEST).read_bytes())


@pytest.mark.parametrize("name", ["unknown-dtype", "no-cases", "case-not-an-object"])
@pytest.mark.parametrize("command", ["verify", "check"])
def test_the_cli_says_one_line_and_exits_2_on_a_malformed_manifest(
    suite, name, command, tmp_path, capsys
):
    m = read_manifest(suite)
    MANIFEST_BAD[name][0](m)
    write_manifest(suite, m)
    (tmp_path / "mine").mkdir()
    argv = [command, str(suite)] + ([str(tmp_path / "mine")] if command == "check" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("relpos-ref: error: ") and err.count("\n") == 1
    assert MANIFEST_BAD[name][1] in err


@pytest.mark.parametrize(
    ("text", "depth"),
    [(b"1", 0), (b"[]", 1), (b'{"a": [1, {"b": "[["}]}', 3), (b'["\\"[[[["]', 1),
     (b'"[[[["', 0), (b"[[[]]]", 3)],
)
def test_json_depth_counts_only_structure(text, depth):
    assert fileformat.json_depth(text) == depth


def test_a_case_file_that_declares_more_than_it_holds_is_reported_by_verify(suite):
    entry = read_manifest(suite)["cases"][1]
    path = suite / entry["file"]
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["output"]["shape"] = [2**40, 2**40]
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])
    problems = golden.verify(suite).problems
    assert any(entry["file"] in p and "does not match its shape and dtype" in p for p in problems)
    assert len(SMALL) == 4
