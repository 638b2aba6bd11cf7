"""No tracebacks from the CLI (issue 15, category 7).

Every failure is one line on stderr naming the flag (``--height``, not
``h``) or the file, with the documented exit status (`EXIT_CODES`): 2 for a
usage error or unusable input, 1 for problems found, 70 for an internal
error, 141 when stdout is closed early, 130 for Ctrl-C.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _golden import make_suite, read_manifest, write_manifest

from relpos_ref import cli, cli_golden
from relpos_ref.cli import EXIT_CODES, main


def _fails(capsys, argv, code=2):
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


SHOW_BAD = [
    # argparse: the flag and the value
    (["show", "positions", "--tq", "100000"], "argument --tq: 100000 is too large to print"),
    (["show", "positions", "--tk", "1001"], "argument --tk: 1001 is too large to print"),
    (["show", "positions", "--tq", "-2"], "argument --tq: must be >= 0, got -2"),
    (["show", "positions", "--tq", "abc"], "argument --tq: expected an integer, got 'abc'"),
    (["show", "positions", "--tq", "2.5"], "argument --tq: expected an integer, got '2.5'"),
    (["show", "positions", "--q-offset", "99999999999999999999"],
     "argument --q-offset: 99999999999999999999 does not fit"),
    (["show", "positions", "--q-offset", "-99999999999999999999"],
     "argument --q-offset: -99999999999999999999 does not fit"),
    (["show", "index", "-K", "99999999999999999999"], "argument --max-distance/-K:"),
    (["show", "causal-index", "-M", "1e3"], "argument --length/-M: expected an integer"),
    (["show", "grid", "--height", "-1"], "argument --height: must be >= 0, got -1"),
    (["show", "grid", "--width", "5000"], "argument --width: 5000 is too large to print"),
    (["show", "t5", "--num-buckets", "x"], "argument --num-buckets: expected an integer"),
    (["show", "nope"], "argument VIEW: invalid choice: 'nope'"),
    (["show", "positions", "--end-aligned", "--q-offset", "1"],
     "argument --q-offset: not allowed with argument --end-aligned"),
    (["show", "index", "--beyond", "wrap"], "argument --beyond: invalid choice: 'wrap'"),
    (["show", "positions", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["show"], "the following arguments are required: VIEW"),
    ([], "the following arguments are required: COMMAND"),
    # the library's checks, said with the flags
    (["show", "grid", "--height", "100", "--width", "100"],
     "--height 100 x --width 100 gives 10000 tokens, too large to print (at most 1000)"),
    (["show", "swin", "--window-height", "50", "--window-width", "50"],
     "--window-height 50 x --window-width 50 gives 2500 tokens"),
    (["show", "swin", "--window-height", "0"], "--window-height must be >= 1, got 0"),
    (["show", "grid2d", "--height", "0"], "--height must be >= 1, got 0"),
    (["show", "index", "-K", "-1"], "--max-distance must be >= 0, got -1"),
    (["show", "shaw", "-K", "-1"], "--max-distance must be >= 0, got -1"),
    (["show", "causal-index", "-M", "0"], "--length must be >= 1, got 0"),
    (["show", "music", "-M", "0"], "--length must be >= 1, got 0"),
    (["show", "t5", "--num-buckets", "0"], "--num-buckets must be >= 1, got 0"),
    (["show", "t5", "--max-distance", "0"], "--max-distance must be >= 1, got 0"),
    (["show", "deberta", "--span", "0"], "--span must be >= 1, got 0"),
    (["show", "general", "--t-max", "1"], "--tq = 5 exceeds the table's maximum length"),
    (["show", "index", "--tq", "4", "-K", "1", "--beyond", "error"],
     "distance -3 is beyond the table"),
    # a flag the view does not read is refused, not ignored
    (["show", "swin", "--height", "3"], "--height does not apply to `show swin` (its flags: "
                                        "--window-height, --window-width)"),
    (["show", "positions", "--beyond", "zero"], "--beyond does not apply to `show positions`"),
    (["show", "grid", "--tq", "3"], "--tq does not apply to `show grid`"),
    (["show", "grid2d", "--end-aligned"], "--end-aligned does not apply to `show grid2d`"),
    (["show", "shaw", "--length", "3"], "--length does not apply to `show shaw`"),
    (["show", "alibi", "--max-distance", "3"], "--max-distance does not apply to `show alibi`"),
    # RoPE's scaling: JSON, checked field by field
    (["show", "rope", "--scaling", "yarn"], "argument --scaling: `scaling` must be a JSON "
                                            "object, got 'yarn'"),
    (["show", "rope", "--scaling", '{"rope_type": "linear"}'],
     "argument --scaling: `scaling` of rope_type 'linear' needs `scaling[\"factor\"]`"),
    (["show", "rope", "--angles", "float16"], "argument --angles: invalid choice: 'float16'"),
    (["show", "rope", "--base", "ten"], "argument --base: expected a finite number, got 'ten'"),
    (["show", "rope", "--base", "inf"], "argument --base: expected a finite number, got 'inf'"),
    (["show", "rope", "--rotary-dim", "3"], "--rotary-dim must be even and >= 0, got 3"),
    (["show", "rope", "--base", "0"], "--base must be > 0, got 0.0"),
    (["show", "rope", "--rotary-dim", "4", "--scaling",
      '{"rope_type": "longrope", "short_factor": [1], "long_factor": [1], '
      '"original_max_position_embeddings": 8, "factor": 2}'],
     '`scaling["short_factor"]` must have rotary_dim / 2 = 2 entries, got 1'),
]


@pytest.mark.parametrize(("argv", "text"), SHOW_BAD, ids=[" ".join(a) or "none"
                                                          for a, _ in SHOW_BAD])
def test_show_says_one_line_naming_the_flag(capsys, argv, text):
    err = _fails(capsys, argv)
    assert err.startswith(("relpos-ref: error: ", "relpos-ref show: error: ")), err
    assert text in err, err
    assert "`t_q`" not in err and "`h`" not in err and "`K`" not in err


def test_the_largest_table_still_prints(capsys):
    assert main(["show", "positions", "--tq", "1000", "--tk", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1002


# -- golden commands --------------------------------------------------------------------


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return make_suite(tmp_path_factory.mktemp("cli") / "golden")


def test_golden_commands_say_one_line(capsys, tmp_path, suite):
    (tmp_path / "file").write_text("x")
    (tmp_path / "mine").mkdir()
    cases = [
        (["generate", "--out", str(tmp_path / "file" / "g")], "its parent"),
        (["generate", "--out", str(tmp_path / "g"), "--backend", "nope"],
         "argument --backend: invalid choice: 'nope'"),
        (["generate", "--out", str(tmp_path / "g"), "--dtypes", "float8"],
         "argument --dtypes: invalid choice: 'float8'"),
        (["generate", "--out", str(tmp_path / "g"), "--select", "zz/*"],
         "--select 'zz/*' matches no case"),
        (["generate"], "the following arguments are required: --out"),
        (["generate", "--out", str(tmp_path / "file")], "exists and is not a directory"),
        (["verify"], "the following arguments are required: DIR"),
        (["verify", str(tmp_path / "absent")], "is not a directory"),
        (["verify", str(tmp_path)], "has no manifest.json"),
        (["check", str(suite), str(tmp_path / "absent")], "is not a directory of results"),
        (["check", str(suite), str(tmp_path / "mine"), "--select", "zz/*"],
         "--select 'zz/*' matches no case"),
        (["check", str(suite), str(suite)], "is the suite itself"),
        (["list", "--select", "zz"], "--select 'zz' matches no case"),
    ]
    for argv, text in cases:
        err = _fails(capsys, argv)
        assert text in err, (argv, err)


@pytest.mark.parametrize(
    ("edit", "text"),
    [
        (lambda m: m["cases"][0]["arrays"]["output"].__setitem__("dtype", "int8"),
         "unknown dtype 'int8'"),
        (lambda m: m.__setitem__("cases", []), "the suite has no case"),
        (lambda m: m["cases"][0].__setitem__("file", "/etc/passwd"),
         "is not the bare file name of case"),
    ],
    ids=["unknown-dtype", "no-cases", "absolute-file"],
)
@pytest.mark.parametrize("command", ["verify", "check"])
def test_a_malformed_manifest_is_one_line_for_each_command(capsys, tmp_path, suite, edit, text,
                                                           command):
    import shutil

    copy = Path(shutil.copytree(suite, tmp_path / "golden"))
    manifest = read_manifest(copy)
    edit(manifest)
    write_manifest(copy, manifest)
    (tmp_path / "mine").mkdir()
    argv = [command, str(copy)] + ([str(tmp_path / "mine")] if command == "check" else [])
    assert text in _fails(capsys, argv)


def test_deeply_nested_json_is_one_line(capsys, tmp_path, suite):
    import shutil

    copy = Path(shutil.copytree(suite, tmp_path / "golden"))
    (copy / "manifest.json").write_bytes(b"[" * 500_000)
    assert "nests JSON deeper than 32 levels" in _fails(capsys, ["verify", str(copy)])


# -- how the process ends ------------------------------------------------------------------


def test_a_closed_stdout_is_exit_141_without_a_traceback():
    read, write = os.pipe()
    os.close(read)  # like `| head -1` after its line: nobody reads any more
    try:
        run = subprocess.run([sys.executable, "-m", "relpos_ref", "list"], stdout=write,
                             stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write)
    assert run.returncode == 141 and run.stderr == ""


def test_list_into_head_prints_the_first_line_only():
    run = subprocess.run(f"{sys.executable} -m relpos_ref list | head -1", shell=True,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0 and len(run.stdout.splitlines()) == 1
    assert run.stderr == ""


def test_an_internal_error_is_one_line_with_exit_70(capsys, monkeypatch):
    def broken(args):
        raise KeyError("surprise")

    monkeypatch.setattr(cli_golden, "run", broken)
    err = _fails(capsys, ["list"], code=70)
    assert err.startswith("relpos-ref: internal error (KeyError: 'surprise'); rerun with "
                          "RELPOS_REF_DEBUG=1")
    monkeypatch.setenv("RELPOS_REF_DEBUG", "1")
    with pytest.raises(KeyError, match="surprise"):
        main(["list"])


@pytest.mark.parametrize(
    ("error", "text"),
    [(MemoryError("Unable to allocate 74.5 GiB"), "out of memory (Unable to allocate 74.5 GiB)"),
     (MemoryError(), "out of memory (no details)"),
     (RecursionError("maximum recursion depth exceeded"), "input nested too deeply to read"),
     (OverflowError("int too large to convert"), "int too large to convert"),
     (OSError(28, "No space left on device"), "No space left on device")],
    ids=["memory", "memory-bare", "recursion", "overflow", "disk-full"],
)
def test_resource_errors_are_one_line_with_exit_2(capsys, monkeypatch, error, text):
    def failing(args):
        raise error

    monkeypatch.setattr(cli, "_show", failing)
    assert text in _fails(capsys, ["show", "positions"])


def test_ctrl_c_is_exit_130_with_one_line(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_golden, "run", interrupted)
    err = _fails(capsys, ["list"], code=130)
    assert err == ("relpos-ref: interrupted; a suite being written is left as the previous one "
                   "or the new one, whole\n")


def test_help_and_version_exit_0(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("relpos-ref ")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for code, text in EXIT_CODES.items():
        assert f"{code:>3}  {text}" in out


def test_a_closed_standard_output_is_not_an_error():
    command = f"'{sys.executable}' -m relpos_ref list >&-"  # standard output closed
    run = subprocess.run(["sh", "-c", command], stderr=subprocess.PIPE, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0 and run.stderr == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-m", "relpos_ref", "list"], stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert run.stderr == ("relpos-ref: error: cannot write the output: No space left on "
                          "device\n")


@pytest.mark.parametrize(("argv", "message"), [
    (["show", "swin", "--window-width", "-1000", "--window-height", "-1000"],
     "--window-height must be >= 1, got -1000"),
    (["show", "grid", "--height", "0", "--width", "5"], "--height must be >= 1, got 0"),
    (["show", "causal-index", "--tq", "0"],
     "--length defaults to t_k, which is 0 here; give --length (>= 1)"),
])
def test_sizes_are_checked_before_their_product(capsys, argv, message):
    assert main(argv) == 2
    assert capsys.readouterr().err == f"relpos-ref: error: {message}\n"
