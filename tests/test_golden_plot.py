"""``relpos-ref check --plot DIR``: a heatmap of |obtained - golden| per mismatching case."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from _golden import make_suite, write_results

from relpos_ref.cli import main
from relpos_ref.golden.dtypes import numpy_dtype
from relpos_ref.golden.plot import error_maps


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return make_suite(tmp_path_factory.mktemp("plot") / "golden")


def _shifted(case):
    # right weights for shaw, an offset bug (keys shifted by one) for the bias case
    dtype = numpy_dtype(case.dtype)
    out = {n: case.expected[n].astype(dtype) for n in ("output", "weights")}
    if case.scheme == "bias":
        out["weights"] = np.roll(out["weights"], 1, axis=-1)
        out["output"] = out["output"] * 2
    return out


def test_plot_draws_each_mismatching_case(suite, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    mine = write_results(tmp_path / "mine", suite, _shifted)
    plots = tmp_path / "plots"
    assert main(["check", str(suite), str(mine), "--plot", str(plots)]) == 1
    drawn = sorted(p.name for p in plots.iterdir())
    assert drawn == sorted(p.name.rsplit(".", 1)[0] + ".png" for p in mine.iterdir()
                           if p.name.startswith("bias__"))
    assert len(drawn) == 2  # float32 and bfloat16; the shaw cases match
    for name in drawn:
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"relpos-ref: wrote {plots / drawn[0]}" in capsys.readouterr().err


def test_the_error_map_shows_an_offset_as_a_shifted_band():
    golden = np.eye(6)[None, None]  # one head, a diagonal
    shifted = np.roll(golden, 1, axis=-1)
    (m,) = error_maps(shifted, golden)
    assert m.shape == (6, 6)
    i = np.arange(6)
    want = np.zeros((6, 6))
    want[i, i] = want[i, (i + 1) % 6] = 1.0  # the golden's diagonal and the band beside it
    assert np.array_equal(m, want)
    nan = error_maps(np.full((2, 3), np.nan), np.zeros((2, 3)))
    assert nan.shape == (1, 2, 3) and np.isinf(nan).all()


def test_plot_without_matplotlib_says_how_to_get_it(suite, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    mine = write_results(tmp_path / "mine", suite, _shifted)
    assert main(["check", str(suite), str(mine), "--plot", str(tmp_path / "p")]) == 2
    assert "--plot needs matplotlib: pip install 'relpos-ref[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
