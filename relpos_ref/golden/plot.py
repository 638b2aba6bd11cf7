"""Pictures of a mismatch: ``|obtained - golden|`` as heatmaps, one per head.

``relpos-ref check --plot DIR`` writes, for each case that does not match,
``DIR/<case file name>.png``: a row per mismatching array, a column per head
(of the first batch element, at most `MAX_HEADS`), each a heatmap of the
absolute error over the array's last two axes. For ``weights``, ``logits``,
``position`` and ``bias`` those are queries ``i`` by keys ``j``, where an
offset bug shows as a shifted diagonal band and a clipping bug as wrong
columns at the edges; for ``output`` and the gradients they are rows by
features. Needs matplotlib (``pip install 'relpos-ref[plot]'``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .paths import SuiteError

__all__ = ["MAX_HEADS", "error_maps", "plot_case", "plot_report"]

#: At most this many heads are drawn per array.
MAX_HEADS = 8
_PAIR_AXES = {"weights", "logits", "position", "bias"}


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError:
        msg = "--plot needs matplotlib: pip install 'relpos-ref[plot]'"
        raise SuiteError(msg) from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def error_maps(obtained: np.ndarray, golden: np.ndarray) -> np.ndarray:
    """``|obtained - golden|`` as ``(heads, rows, columns)`` (first batch element).

    A 1-D array becomes one row; a 2-D array one head; leading axes beyond
    the head axis are indexed at 0. Non-finite obtained values are ``inf``.

    Examples
    --------
    >>> error_maps(np.ones((2, 3, 4, 5)), np.zeros((2, 3, 4, 5))).shape
    (3, 4, 5)
    """
    err = np.abs(obtained.astype(np.float64) - golden.astype(np.float64))
    err = np.where(np.isfinite(obtained), err, np.inf)
    while err.ndim > 3:
        err = err[0]
    if err.ndim == 1:
        err = err[None, :]
    if err.ndim == 2:
        err = err[None]
    return err


def plot_case(case: Any, obtained: Mapping[str, Any], names: list[str],
              out: str | os.PathLike[str]) -> Path:
    """Draw the error maps of arrays `names` of `case` into ``out/<case file>.png``.

    Parameters
    ----------
    case : relpos_ref.golden.GoldenCase
    obtained : mapping
        The obtained arrays by name (NumPy or convertible).
    names : list of str
        The arrays to draw (those that mismatch).
    out : path
        A directory (created if needed).

    Returns
    -------
    Path
        The PNG written.
    """
    from .compare import to_numpy

    plt = _pyplot()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    maps = {n: error_maps(to_numpy(obtained[n]), case.golden(n)) for n in names}
    columns = min(MAX_HEADS, max(m.shape[0] for m in maps.values()))
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(len(maps), columns, squeeze=False, layout="constrained",
                                figsize=(2.6 * columns + 1.2, 2.8 * len(maps) + 0.6))
    for row, (name, m) in enumerate(maps.items()):
        atol = case.limit(name)
        finite = m[np.isfinite(m)]
        top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        rows, cols = ("query i", "key j") if name in _PAIR_AXES else ("row", "feature")
        for head in range(columns):
            ax = axes[row][head]
            if head >= m.shape[0]:
                ax.axis("off")
                continue
            image = ax.imshow(np.minimum(m[head], top), cmap="magma", vmin=0.0, vmax=top,
                              interpolation="nearest", aspect="auto")
            ax.set_title(f"{name}, head {head}", fontsize=9)
            ax.set_xlabel(cols, fontsize=8)
            ax.set_ylabel(rows, fontsize=8)
            ax.tick_params(labelsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        figure.colorbar(image, ax=list(axes[row]), shrink=0.8,
                        label=f"|obtained - golden| (atol {atol:.2g})")
    figure.suptitle(case.id, fontsize=10)
    path = out / (case.entry["file"].rsplit(".", 1)[0] + ".png")
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_report(golden: str | os.PathLike[str], obtained: str | os.PathLike[str],
                report: Any, out: str | os.PathLike[str]) -> list[Path]:
    """`plot_case` for every case of a `check` report that does not match.

    Only the arrays outside their tolerance are drawn; a case that fails
    only for a missing array has nothing to draw. Returns the PNGs written.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from relpos_ref import golden
    >>> from relpos_ref.golden.fileformat import dumps
    >>> root = Path(tempfile.mkdtemp())
    >>> cases = golden.default_cases().select(["bias/clip/*"], dtypes=["float32"])
    >>> _ = golden.generate(root / "golden", cases)
    >>> case = golden.load_suite(root / "golden").load(cases[0].id)
    >>> (root / "mine").mkdir()
    >>> wrong = case.expected["output"][..., ::-1, :].astype("float32")  # queries reversed
    >>> data = dumps({"output": wrong}, "safetensors")
    >>> _ = (root / "mine" / case.entry["file"]).write_bytes(data)
    >>> report = golden.check(root / "golden", root / "mine")
    >>> [p.name for p in plot_report(root / "golden", root / "mine", report, root / "plots")]
    ['bias__clip__b1-h3-q7-k11-d8-K3__float32__s0.png']
    """
    from .results import read_result, result_files
    from .suite import load_suite

    _pyplot()  # refuse before any work when matplotlib is missing
    suite = load_suite(golden)
    files = result_files(Path(obtained), suite)
    written = []
    for cid, results in report.results.items():
        names = [r.name for r in results if not r.passed and r.size]
        if not names:
            continue
        entry = suite.cases[cid]
        path = Path(obtained) / files[cid]
        arrays = read_result(path, entry)
        written.append(plot_case(suite.load(cid), arrays, names, out))
    return written
