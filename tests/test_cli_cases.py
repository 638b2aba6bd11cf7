"""``relpos-ref list --json`` and ``--cases FILE``: custom shapes, parameters and seeds (TOML)."""

from __future__ import annotations

import json

import pytest

from relpos_ref import golden
from relpos_ref.cli import main

MINE = """
[[case]]
scheme = "shaw"
variant = "long"
dtypes = ["float32", "bfloat16"]
seeds = [0, 3]
params = { h = 2, t_q = 40, t_k = 64, K = 16, causal = true, q_offset = 24 }

[[case]]
scheme = "t5"
variant = "decoder"
params = { t_q = 8, t_k = 8, bidirectional = false }
"""


@pytest.fixture
def mine(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(MINE)
    return path


def test_a_cases_file_makes_one_case_per_dtype_and_seed(mine):
    cases = list(golden.cases_from_toml(mine))
    assert [c.id for c in cases[:4]] == [
        "shaw/long/b1-h2-q40-k64-d8-K16/float32/s0", "shaw/long/b1-h2-q40-k64-d8-K16/float32/s3",
        "shaw/long/b1-h2-q40-k64-d8-K16/bfloat16/s0", "shaw/long/b1-h2-q40-k64-d8-K16/bfloat16/s3",
    ]
    assert [c.dtype for c in cases[4:]] == ["float64", "float32", "float16", "bfloat16"]
    assert cases[0].parameters["causal"] is True and cases[0].parameters["q_offset"] == 24
    assert cases[4].parameters["bidirectional"] is False


def test_generate_and_verify_a_suite_of_your_own(mine, tmp_path, capsys):
    out = tmp_path / "suite"
    assert main(["generate", "--out", str(out), "--cases", str(mine), "--dtypes", "float32"]) == 0
    assert "wrote 3 cases" in capsys.readouterr().out
    assert main(["verify", str(out)]) == 0
    assert "3 cases" in capsys.readouterr().out
    assert sorted(golden.load_suite(out).cases) == sorted(
        c.id for c in golden.cases_from_toml(mine).select(dtypes=["float32"]))


def test_list_json_gives_every_case_with_its_parameters(mine, capsys):
    assert main(["list", "--json", "--select", "shaw/clip/*"]) == 0
    listed = json.loads(capsys.readouterr().out)
    want = golden.default_cases().select(["shaw/clip/*"])
    assert [c["id"] for c in listed] == [c.id for c in want]
    assert listed[0]["params"] == want[0].parameters and listed[0]["scheme"] == "shaw"
    assert {"id", "kind", "scheme", "variant", "dtype", "seed", "params"} == set(listed[0])
    assert main(["list", "--json", "--cases", str(mine), "--select", "t5/*"]) == 0
    assert [c["variant"] for c in json.loads(capsys.readouterr().out)] == ["decoder"] * 4


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[[case]]\nscheme = "shaw"\nvariant = "x"\nparams = { K = -1 }\n',
         "case 1: `K` must be an integer >= 1, got -1"),
        ('[[case]]\nscheme = "shaw"\nvarient = "x"\n',
         "case 1: missing variant; unknown key(s) varient (known: dtypes, params, scheme, "
         "seeds, variant)"),
        ('[[case]]\nscheme = "nope"\nvariant = "x"\n', "case 1: unknown scheme 'nope'"),
        ('[[case]]\nscheme = "bias"\nvariant = "x"\nparams = { tq = 3 }\n',
         "case 1: unknown parameter(s) tq for scheme 'bias'"),
        ('[[case]]\nscheme = "bias"\nvariant = "x"\ndtypes = ["float8"]\n',
         "case 1: `dtype` must be one of"),
        ('[[case]]\nscheme = "bias"\nvariant = "x"\nseeds = []\n',
         "case 1: `seeds` must be a non-empty list, got []"),
        ('[[case]]\nscheme = "bias"\nvariant = "x"\n[[case]]\nscheme = "bias"\nvariant = "x"\n',
         "case 2: duplicate case id 'bias/x/"),
        ("nope = [\n", "not a TOML file"),
        ("title = 'mine'\n", "expected one or more [[case]] tables and nothing else; unknown "
         "top-level key(s) title"),
    ],
    ids=["bad-value", "misspelt-key", "unknown-scheme", "unknown-parameter", "bad-dtype",
         "no-seeds", "duplicate", "not-toml", "no-cases"],
)
def test_a_bad_cases_file_is_refused_naming_file_case_and_key(tmp_path, capsys, text, error):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    out = tmp_path / "suite"
    assert main(["generate", "--out", str(out), "--cases", str(path)]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"relpos-ref: error: --cases {path}: ") and error in said, said
    assert not out.exists()  # nothing written


def test_a_missing_cases_file_is_named(tmp_path, capsys):
    assert main(["list", "--cases", str(tmp_path / "absent.toml")]) == 2
    assert "absent.toml: cannot read it (No such file or directory)" in capsys.readouterr().err


@pytest.mark.parametrize("force", [False, True])
def test_a_cases_file_inside_the_suite_directory_is_refused_and_kept(tmp_path, capsys, force):
    """generate replaces --out whole: with --force it would delete its own --cases file."""
    out = tmp_path / "suite"
    out.mkdir()
    cases = out / "cases.toml"
    cases.write_text(MINE)
    argv = ["generate", "--out", str(out), "--cases", str(cases), "--dtypes", "float32"]
    assert main(argv + (["--force"] if force else [])) == 2
    err = capsys.readouterr().err
    assert "lies inside --out" in err and "keep it outside" in err
    assert cases.read_text() == MINE and sorted(p.name for p in out.iterdir()) == ["cases.toml"]


def test_a_suite_with_entries_of_its_own_is_named_as_this_suite(mine, tmp_path, capsys):
    out = tmp_path / "suite"
    argv = ["generate", "--out", str(out), "--cases", str(mine), "--dtypes", "float32"]
    assert main(argv) == 0
    (out / "my-results").mkdir()
    (out / "my-results" / "obtained.npz").write_bytes(b"mine")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds this suite and entries of its own (my-results)" in err
    assert "deleting them" in err and "different" not in err
    assert (out / "my-results" / "obtained.npz").read_bytes() == b"mine"
    (out / "my-results" / "obtained.npz").unlink()
    (out / "my-results").rmdir()
    other = ["generate", "--out", str(out), "--cases", str(mine), "--dtypes", "float64"]
    assert main(other) == 2
    assert "already holds a different golden suite" in capsys.readouterr().err
