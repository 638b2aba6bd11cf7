"""The command line: show prints the worked tables; errors exit 2 with one line."""

from __future__ import annotations

import subprocess
import sys

from relpos_ref.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_positions_is_the_hand_drawn_table(capsys):
    code, out, _ = _run(capsys, "show", "positions", "--tq", "3", "--tk", "4")
    assert code == 0
    assert out.splitlines() == [
        "distance r = j - (i + q_offset)   t_q=3 t_k=4 q_offset=0",
        "i\\j  0  1  2  3",
        "  0  0  1  2  3",
        "  1 -1  0  1  2",
        "  2 -2 -1  0  1",
    ]


def test_show_end_aligned(capsys):
    _, out, _ = _run(capsys, "show", "positions", "--tq", "2", "--tk", "4", "--end-aligned")
    assert "q_offset=2" in out
    assert out.splitlines()[-1] == "  1 -3 -2 -1  0"


def test_show_index_marks_zero_policy_entries(capsys):
    _, out, _ = _run(
        capsys, "show", "index", "--tq", "1", "--tk", "4", "-K", "1", "--beyond", "zero"
    )
    assert out.splitlines()[-1] == "  0  1  2  -  -"
    _, out, _ = _run(
        capsys, "show", "valid", "--tq", "1", "--tk", "4", "-K", "1", "--beyond", "zero"
    )
    assert out.splitlines()[-1] == "  0  1  1  0  0"


def test_show_causal_index_and_grid(capsys):
    _, out, _ = _run(capsys, "show", "causal-index", "--tq", "3", "-M", "2", "--beyond", "zero")
    assert out.splitlines()[-3:] == ["  0  1  -  -", "  1  0  1  -", "  2  -  0  1"]
    _, out, _ = _run(capsys, "show", "grid", "--height", "2", "--width", "2")
    assert "tokens  0:(0,0)  1:(0,1)  2:(1,0)  3:(1,1)" in out


def test_errors_are_one_line_with_exit_2(capsys):
    code, out, err = _run(capsys, "show", "index", "--tq", "4", "-K", "1", "--beyond", "error")
    assert code == 2 and out == ""
    assert err.strip().startswith("relpos-ref: error: distance -3 is beyond the table")
    assert len(err.strip().splitlines()) == 1
    code, _, err = _run(capsys, "show", "positions", "--tq", "-2")
    assert code == 2 and "argument --tq: must be >= 0, got -2" in err


def test_help_lists_views(capsys):
    assert main(["show", "--help"]) == 0
    out = capsys.readouterr().out
    for view in ("positions", "index", "valid", "causal-index", "grid"):
        assert view in out


def test_module_entry_point_and_console_script():
    out = subprocess.run(
        [sys.executable, "-m", "relpos_ref", "show", "positions", "--tq", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.splitlines()[1] == "i\\j  0  1"


def test_show_every_scheme_layout(capsys):
    _, out, _ = _run(capsys, "show", "shaw", "--tq", "5", "-K", "4")
    assert out.splitlines()[2] == "  0  4  5  6  7  8"  # word 0 uses indices 4..8
    assert out.splitlines()[-1] == "  4  0  1  2  3  4"  # word 4 uses 0..4
    _, out, _ = _run(capsys, "show", "general", "--tq", "4", "--t-max", "4")
    assert out.splitlines()[-1] == "  3  0  1  2  3"  # index 0 is distance -3
    _, out, _ = _run(
        capsys,
        "show",
        "general",
        "--tq",
        "1",
        "--tk",
        "4",
        "--t-max",
        "4",
        "--order",
        "future_to_past",
    )
    assert out.splitlines()[-1] == "  0  3  2  1  0"
    _, out, _ = _run(capsys, "show", "music", "--tq", "2")
    assert out.splitlines()[-1] == "  1  0  1"
    _, out, _ = _run(capsys, "show", "absolute", "--tq", "1", "--tk", "3")
    assert out.splitlines()[-1] == "  0  0  1  2"
    _, out, _ = _run(capsys, "show", "grid2d", "--height", "2", "--width", "1")
    assert "row_table of 3 rows (2 height - 1), col_table of 1 rows (2 width - 1)" in out
    code, _, err = _run(capsys, "show", "general", "--tq", "4", "--tk", "5", "--t-max", "4")
    assert code == 2 and "exceeds the table's maximum length t_max = 4" in err


def test_show_rope_prints_each_pairs_frequency_and_the_factors(capsys):
    scaling = ('{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 16, '
               '"mscale": 1, "mscale_all_dim": 1, "softmax_mscale": true}')
    assert main(["show", "rope", "--tq", "2", "--tk", "3", "--rotary-dim", "4", "--base",
                 "100", "--scaling", scaling, "--angles", "float32"]) == 0
    out = capsys.readouterr().out
    assert "frequencies of rope_type 'yarn' factor=4.0" in out
    assert "rotary_dim=4 base=100.0 call length L=3" in out
    assert "     0            1            1         1" in out  # the fastest pair is kept
    assert "attention factor a = 1: cos and sin times a" in out  # mscale / mscale_all_dim
    assert "softmax scale times mscale^2 = 1.296476993 (DeepSeek)" in out
    assert "angles float32: fl32(fl32(p) * fl32(scaled))" in out
    assert main(["show", "rope"]) == 0  # no scaling: the frequencies, unchanged
    assert "frequencies of rope_type 'default'" in capsys.readouterr().out
