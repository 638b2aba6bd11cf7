"""The conventions page's table of each scheme's defaults for ``None``, from the catalog.

Generated at build time (``_generated/defaults.md``) from each scheme's
``DEFAULTS`` (`relpos_ref.calls.Defaults`, listed by `relpos_ref.catalog`),
and tested against calls in ``tests/test_docs.py``: the table cannot fall
behind a scheme's own rule.
"""

from __future__ import annotations

from relpos_ref import catalog
from relpos_ref.calls import Defaults, inverse_sqrt_width
from relpos_ref.schemes.deberta import deberta_scale
from relpos_ref.schemes.t5 import unscaled

#: How each scale rule reads in the table.
SCALES = {
    inverse_sqrt_width: r"$1/\sqrt{d}$",
    unscaled: "$1$ (never scaled)",
    deberta_scale: r"$1/\sqrt{d f}$, $f = 1 +$ the number of tables given",
}

#: How each query alignment reads in the table.
ALIGNMENTS = {"start": "`0` (start-aligned)",
              "end": "`t_k - t_q` (end-aligned: the queries are the last positions)"}


def cells(defaults: Defaults) -> tuple[str, str, str]:
    """``(scale, causal, q_offset)`` as the table writes them."""
    return SCALES[defaults.scale], f"`{defaults.causal}`", ALIGNMENTS[defaults.q_offset]


def default_rows() -> str:
    """A Markdown table: every catalog scheme (``attention`` for plain) and its defaults."""
    rows = ["| scheme | `scale` when `None` | `causal` when `None` | `q_offset` when `None` |",
            "|---|---|---|---|"]
    for name in catalog.names(plain=True):
        label = "`attention`" if name == "plain" else f"`{name}`"
        rows.append(f"| {label} | " + " | ".join(cells(catalog.get(name).defaults)) + " |")
    return "\n".join(rows) + "\n"
