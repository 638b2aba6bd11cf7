"""Sphinx extension: generate the docs' figures and worked tables from relpos_ref.

When the builder starts, every figure (`figures.write_all`) and every worked
table (`worked`) is written to ``docs/_generated/``, which the pages include.
Nothing there is committed: the pages always show what the installed code
computes, and a worked example whose steps disagree with the library stops
the build.
"""

from __future__ import annotations

from pathlib import Path

import defaults_table
import figures
import golden_tables
import worked
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _write(path: Path, text: str) -> None:
    # Rewrite only on change so that Sphinx does not rebuild every page each time.
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def write_tables(out: Path) -> list[Path]:
    """Write every worked table and preset list as a Markdown fragment into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    fragments = {
        "distances.md": worked.markdown(worked.worked_distances()),
        "table_index.md": worked.markdown(worked.worked_table_index()),
        "golden_params.md": golden_tables.golden_parameter_rows(),
        "defaults.md": defaults_table.default_rows(),
    }
    for name, build in worked.LAYOUTS.items():
        fragments[f"layout_{name}.md"] = worked.markdown(build())
    for name in worked.SCHEMES:
        fragments[f"scheme_{name}.md"] = worked.markdown(worked.worked_scheme(name))
        fragments[f"presets_{name}.md"] = worked.preset_rows(name) + "\n"
    paths = []
    for filename, text in fragments.items():
        path = out / filename
        _write(path, text)
        paths.append(path)
    return paths


def generate(app: Sphinx) -> None:
    out = Path(app.srcdir) / "_generated"
    tables = write_tables(out)
    images = figures.write_all(out)
    logger.info("relpos_docs: %d worked tables and %d figures in %s", len(tables), len(images), out)


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", generate)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
