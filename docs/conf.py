"""Sphinx configuration of the relpos_ref documentation.

Build: ``pip install -e '.[docs]'`` then
``sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

from sphinx.util import logging

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import relpos_ref  # noqa: E402

logger = logging.getLogger("relpos_ref.docs")

project = "relpos_ref"
author = "relpos_ref developers"
copyright = "2026, relpos_ref developers"
release = version = relpos_ref.__version__

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    # MathJax served from the built site, so the math renders with no network.
    "sphinx-mathjax-offline",
    "relpos_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_generated/*.md", "_ext", "Thumbs.db", ".DS_Store"]
templates_path = []

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_dmath_double_inline = True
myst_heading_anchors = 3

autosummary_generate = True
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
default_role = "py:obj"

html_theme = "pydata_sphinx_theme"
html_title = f"relpos_ref {release}"
html_theme_options = {
    "navigation_depth": 2,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    # The "Section Navigation" sidebar lists the pages under the current top-level
    # page. With hidden toctrees included the theme draws it on every page, empty on
    # a page with nothing under it (quickstart, golden, ...); without, it leaves it
    # out there and the content column takes its width. No toctree below the root
    # is hidden, so the other pages' navigation is unchanged.
    "sidebar_includehidden": False,
}
html_static_path = ["_static"]
html_css_files = ["relpos.css"]
html_js_files = ["relpos.js"]

# Intersphinx: the upstream inventories, used when they can be fetched. A
# machine without internet access (CI here) builds without them rather than
# failing on "failed to reach any of the inventories"; a copy saved as
# docs/_inventories/<name>.inv is used when present.
_UPSTREAM = {
    "python": "https://docs.python.org/3/",
    "numpy": "https://numpy.org/doc/stable/",
    "array-api": "https://data-apis.org/array-api/latest/",
    "cupy": "https://docs.cupy.dev/en/stable/",
    "torch": "https://docs.pytorch.org/docs/stable/",
}


def _inventory(name: str, url: str) -> tuple[str, str | None] | None:
    local = HERE / "_inventories" / f"{name}.inv"
    if local.is_file():
        return (url, str(local))
    try:
        with urllib.request.urlopen(url + "objects.inv", timeout=3) as response:
            response.read(1)
    except (OSError, ValueError) as error:
        logger.info("intersphinx: %s unreachable (%s); building without it", name, error)
        return None
    return (url, None)


intersphinx_mapping = {
    name: target for name, url in _UPSTREAM.items() if (target := _inventory(name, url)) is not None
}
intersphinx_timeout = 5
