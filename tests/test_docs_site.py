"""The docs site is legible in the theme's narrowest desktop layout (issue 18).

Three things a reader could not read: scheme figures whose labels shrank to
about 6 px, an empty "Section Navigation" column, and equations and code cut
off at the column's edge. The layout of pydata-sphinx-theme is modelled here
(`content_width`) from its CSS, which `test_the_theme_is_laid_out_as_modelled`
checks against the built theme, and every check holds in the narrowest desktop
layout: a 1200 px window (the smallest that shows both sidebars) with a 15 px
scroll bar, where the article's content column is about 553 CSS px wide.

- Without Sphinx: the figures as `docs/_ext/figures.py` draws them (their text
  in CSS px once shrunk to the column), their captions against their panels,
  and the pages' own code lines against the column's width in characters.
- On a built site: the same on the HTML pages, and no empty navigation. The
  site is the one named by ``RELPOS_DOCS_HTML`` (``.ci/run`` sets it after its
  build), else one built here once when Sphinx is installed, else skipped.
- In a headless browser, when a Chromium is installed: the pages measured
  where they are drawn (figure widths, code and equations that overflow,
  navigation links), at a 1200 px window.
"""

from __future__ import annotations

import functools
import html
import http.server
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

SMALLEST_TEXT_PX = 11  # the smallest text a figure may show, in CSS px
SMALLEST_CELL_PX = 16  # the narrowest heatmap cell that has a value written in it

# -- the theme's layout -------------------------------------------------------

REM = 16
#: Each number of the model and the declaration of the theme's CSS it stands for.
THEME = {
    "page_max": (88 * REM, r"\.bd-page-width\{max-width:88rem\}"),
    "primary": (0.25, r"--pst-sidebar-primary-width:25%"),
    "primary_from": (960, r"@media \(min-width:960px\)\{\.bd-sidebar-primary\{"),
    "secondary": (17 * REM, r"--pst-sidebar-secondary:17rem"),
    "secondary_from": (1200, r"@media \(max-width:1199\.98px\)\{\.bd-sidebar-secondary\{"),
    "article_max": (60 * REM, r"\.bd-article-container\{[^}]*max-width:60em;[^}]*padding:1rem"),
    "article_left": (
        2 * REM,
        r"@media \(min-width:1200px\)\{\.bd-main \.bd-content \.bd-article-container "
        r"\.bd-article\{padding-left:2rem",
    ),
    "pre_font": (14, r"pre\{display:block;font-size:\.875em"),
    "pre_padding": (REM, r"pre\{[^}]*padding:1rem\}"),
}
SCROLLBAR = 15  # a classic scroll bar; overlay scroll bars leave more room
FIGURE_PADDING = 2 * 8  # figure {padding: 0.5em} in Sphinx's basic.css
PRE_BORDER = 2  # pre {border: 1px solid}
CODE_CHAR_EM = 0.602  # the advance of DejaVu Sans Mono and Menlo, the widest of the stack
DESKTOP = range(THEME["primary_from"][0], 1921)  # window widths with the primary sidebar


def content_width(window: int, *, primary: bool, scrollbar: int = SCROLLBAR) -> float:
    """The article's content column in CSS px, in a `window` px wide browser window.

    `primary`: whether the page has the left ("Section Navigation") sidebar.
    """
    t = {name: value for name, (value, _) in THEME.items()}
    page = min(window - scrollbar, t["page_max"])
    wide = window >= t["secondary_from"]
    width = page
    if primary and window >= t["primary_from"]:
        width -= t["primary"] * page
    if wide:
        width -= t["secondary"]
    width = min(width, t["article_max"]) - 2 * REM
    return width - (t["article_left"] if wide else 0)


def narrowest(*, primary: bool) -> float:
    return min(content_width(w, primary=primary) for w in DESKTOP)


def code_columns(*, primary: bool, indent: float = 0.0) -> int:
    """How many characters of code fit on a line of the narrowest column."""
    font = THEME["pre_font"][0]
    inner = narrowest(primary=primary) - indent - 2 * THEME["pre_padding"][0] - PRE_BORDER
    return math.floor(inner / (CODE_CHAR_EM * font))


def test_the_layout_model_gives_the_reported_column():
    # The user measured figures about 560 px wide; the model must say so too.
    assert 545 < narrowest(primary=True) < 565
    assert narrowest(primary=False) > narrowest(primary=True) + 200
    assert code_columns(primary=True) == 61
    assert code_columns(primary=False) == 96


# -- figures, as figures.py draws them ----------------------------------------


def _png_facts(path: Path) -> dict:
    import figures
    from PIL import Image

    with Image.open(path) as image:
        width = image.size[0]
        dpi = image.info.get("dpi", (72, 72))[0]
        text = dict(getattr(image, "text", {}))
    assert figures.MIN_FONT_KEY in text, f"{path.name} does not record its smallest font"
    cell = text.get(figures.MIN_CELL_KEY)
    return {
        "width": width,
        "dpi": dpi,
        "font_pt": float(text[figures.MIN_FONT_KEY]),
        "cell_pt": None if cell is None else float(cell),
    }


def shown_px(facts: dict, shown_width: float, what: str) -> float:
    """The size in CSS px of `what` ("font_pt", "cell_pt") with the image `shown_width` wide."""
    image_px = facts[what] * facts["dpi"] / 72
    return image_px * shown_width / facts["width"]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Every docs figure, drawn by `figures.write_all`: path -> panel titles by row."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("PIL")
    import figures

    return figures.write_all(tmp_path_factory.mktemp("figures"))


def test_figures_are_legible_in_the_narrowest_column(drawn):
    """Every figure's smallest text is >= 11 CSS px once the theme shrinks it to the column.

    The theme shows an image at its natural width, or the column's if that is
    narrower (``max-width: 100%``); a page with figures has both sidebars.
    """
    column = narrowest(primary=True) - FIGURE_PADDING
    seen = []
    for path in drawn:
        facts = _png_facts(path)
        shown = min(facts["width"], column)
        text = shown_px(facts, shown, "font_pt")
        seen.append(f"{path.name}: shown {shown:.0f} px wide, text {text:.1f} px")
        assert text >= SMALLEST_TEXT_PX, seen[-1]
        if facts["cell_pt"] is not None:
            cell = shown_px(facts, shown, "cell_pt")
            assert cell >= SMALLEST_CELL_PX, f"{path.name}: cells {cell:.1f} px wide"
    assert len(seen) >= 19


def test_figures_fill_the_column_they_are_drawn_for(drawn):
    """Drawn for the narrowest column: not wider in points, and sharp there (2x)."""
    import figures

    assert narrowest(primary=True) - FIGURE_PADDING >= figures.COLUMN_PX
    for path in drawn:
        facts = _png_facts(path)
        assert facts["width"] >= 2 * figures.COLUMN_PX, path.name


def test_the_legibility_check_fails_on_small_text(tmp_path):
    """The check of `test_figures_are_legible_in_the_narrowest_column` can fail."""
    pytest.importorskip("matplotlib")
    import figures
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3.6 * 3, 3.4))  # the old figures: 7 pt, 1188 px wide
    ax.set_title("x", fontsize=7)
    ax.tick_params(labelsize=7)
    path = tmp_path / "old.png"
    fig.savefig(path, dpi=110, metadata={figures.MIN_FONT_KEY: f"{min(figures.font_sizes(fig))}"})
    plt.close(fig)
    facts = _png_facts(path)
    shown = min(facts["width"], narrowest(primary=True) - FIGURE_PADDING)
    assert shown_px(facts, shown, "font_pt") < 6  # what the user saw


# -- captions -----------------------------------------------------------------

FIGURE_DIRECTIVE = re.compile(
    r"^```\{figure\} (?P<path>\S+)\n(?P<options>(?::[^\n]*\n)*)\n?(?P<caption>.*?)^```",
    re.M | re.S,
)


def figure_captions() -> dict[str, tuple[str, str]]:
    """Each figure a page shows: file name -> (page, caption)."""
    found = {}
    for page in sorted(DOCS.rglob("*.md")):
        if "_build" in page.parts or "_generated" in page.parts:
            continue
        for m in FIGURE_DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            caption = " ".join(m["caption"].split())
            found[Path(m["path"]).name] = (str(page.relative_to(DOCS)), caption)
    return found


def _plain(caption: str) -> str:
    return re.sub(r"[`$]|\\,|\\;", "", caption)


def caption_problems(caption: str, rows: list[list[str]], sizes: dict | None = None) -> list[str]:
    """What `caption` says that the panels (titles by row) or the example's sizes do not."""
    problems = []
    text = _plain(caption)
    words = {w for w in ("Left", "Middle", "Right", "Top", "Bottom") if re.search(
        rf"\b{w}\b", text, re.I)}
    if len(rows) == 1:
        n = len(rows[0])
        if words & {"Top", "Bottom"}:
            problems.append("says top/bottom of a single row of panels")
        if "Middle" in words and n != 3:
            problems.append(f"says middle of {n} panels")
        if words & {"Left", "Right"} and n < 2:
            problems.append("says left/right of one panel")
    elif not {"Top", "Bottom"} <= words:
        problems.append(f"does not say which of the {len(rows)} rows is which (top, bottom)")
    titles = [t.lower() for row in rows for t in row]
    lower = text.lower()
    says = {"before": "before the mask" in lower,
            "after": re.search(r"\bafter\b[^.;]*\bmask", lower) is not None}
    shows = {"before": any("before the mask" in t for t in titles),
             "after": any("after" in t and "mask" in t for t in titles)}
    for state in ("before", "after"):
        if says[state] != shows[state]:
            where = "caption" if says[state] else "panels"
            problems.append(f"only the {where} show(s) the output {state} the mask")
    for name, value in re.findall(r"\b([A-Za-z_]+)\s*=\s*(\d+)\b", text):
        key = {"S": "span"}.get(name, name)
        if sizes and key in sizes and sizes[key] != int(value):
            problems.append(f"says {name} = {value}, the figure has {sizes[key]}")
    if sizes:
        for what, pattern, want in (
            ("queries", r"(\d+) queries", sizes.get("t_q")),
            ("a memory of", r"memory of (\d+)", sizes.get("t_k", 0) - sizes.get("t_q", 0) or None),
        ):
            for got in re.findall(pattern, text):
                if want is not None and int(got) != want:
                    problems.append(f"says {what} {got}, the figure has {want}")
        if "height" in sizes:
            for h, w in re.findall(r"(\d+) \\times (\d+)", text):
                if (int(h), int(w)) != (sizes["height"], sizes["width"]):
                    problems.append(f"says {h} x {w}, the figure has {sizes['height']} x "
                                    f"{sizes['width']}")
    return problems


def test_every_caption_matches_its_figure(drawn):
    """Where each panel is, what state it shows (before/after the mask) and the sizes."""
    import figures

    captions = figure_captions()
    rows_by_name = {path.name: rows for path, rows in drawn.items()}
    assert set(captions) <= set(rows_by_name), "a page shows a figure figures.py does not draw"
    problems = []
    for name, (page, caption) in captions.items():
        scheme = name.removeprefix("scheme_").removesuffix(".png")
        sizes = figures.FIGURES.get(scheme) if name.startswith("scheme_") else None
        problems += [f"{page}: {p}" for p in caption_problems(caption, rows_by_name[name], sizes)]
    assert not problems, "\n".join(problems)
    assert len(captions) >= 18


@pytest.mark.parametrize(
    ("caption", "rows", "sizes"),
    [
        # the reported bug: "before the mask" over a panel after it
        ("The relative input (left) and the skewed output before the mask (right).",
         [["relative x[i, c]", "skew: out[i, j]"]], None),
        ("Left: a. Middle: b. Right: c.", [["a", "b"]], None),
        ("Left: a. Right: b.", [["a"], ["b", "c"]], None),
        ("Left: the row for M = 12.", [["a", "b"]], {"M": 8}),
        ("Left: for 8 queries after a memory of 4.", [["a", "b"]], {"t_q": 4, "t_k": 8}),
        ("on a $3 \\times 4$ grid", [["a"], ["b", "c"]], {"height": 2, "width": 3}),
    ],
)
def test_a_caption_that_disagrees_is_found(caption, rows, sizes):
    assert caption_problems(caption, rows, sizes)


def test_an_agreeing_caption_passes():
    rows = [["relative x[i, c]", "skew(x), before the mask", "after the causal mask"]]
    caption = ("The relative input (left), the skewed output before the mask (middle) and "
               "after the causal mask (right).")
    assert caption_problems(caption, rows) == []


# -- code in the pages' sources -----------------------------------------------

FENCE = re.compile(r"^(?P<fence>```+)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=fence)\s*$", re.M | re.S)


def has_section_navigation(page: Path) -> bool:
    """Whether the theme gives `page` a "Section Navigation" column: its section has pages."""
    top = page if page.parent == DOCS else page.parent / "index.md"
    if top == DOCS / "index.md":
        return False
    text = top.read_text(encoding="utf-8")
    listed = [b for m in FENCE.finditer(text) if m["info"].strip() == "{toctree}"
              for b in [m["body"]] if ":hidden:" not in b]
    return bool(listed) or ":toctree:" in text


def page_code_lines(page: Path) -> list[tuple[str, str]]:
    """(language, line) of each code line a page shows from its own source."""
    out = []
    for m in FENCE.finditer(page.read_text(encoding="utf-8")):
        info = m["info"].strip()
        if info.startswith("{literalinclude}"):
            source = page.parent / info.split(maxsplit=1)[1]
            out += [("include", line) for line in source.read_text(encoding="utf-8").splitlines()]
        elif not info.startswith("{") or info in ("{code-block}", "{code}"):
            out += [(info or "text", line) for line in m["body"].splitlines()]
    return out


def test_the_pages_code_fits_the_column():
    """The pages' own code lines fit the narrowest column (program output may wrap).

    The docstrings' examples and program output (``text`` blocks) wrap, by
    docs/_static/relpos.css; the pages' own code is written to fit.
    """
    too_long = []
    checked = 0
    for page in sorted(DOCS.rglob("*.md")):
        if "_build" in page.parts or "_generated" in page.parts:
            continue
        limit = code_columns(primary=has_section_navigation(page))
        for language, line in page_code_lines(page):
            if language == "text":
                continue
            checked += 1
            if len(line) > limit:
                too_long.append(f"{page.relative_to(DOCS)}: {len(line)} > {limit}: {line}")
    assert checked > 300
    assert not too_long, "\n".join(too_long)


def test_sections_with_pages_have_navigation_and_leaves_do_not():
    assert has_section_navigation(DOCS / "schemes" / "shaw.md")
    assert has_section_navigation(DOCS / "layouts" / "index.md")
    assert has_section_navigation(DOCS / "api.md")
    assert not has_section_navigation(DOCS / "golden.md")
    assert not has_section_navigation(DOCS / "index.md")


# -- the built site -----------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built HTML: ``RELPOS_DOCS_HTML``, else built here from a copy of docs/."""
    given = os.environ.get("RELPOS_DOCS_HTML")
    if given:
        path = Path(given).resolve()
        assert (path / "index.html").is_file(), f"RELPOS_DOCS_HTML={given} is not a built site"
        return path
    for module in ("sphinx", "myst_parser", "numpydoc", "pydata_sphinx_theme"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[docs]')")
    work = tmp_path_factory.mktemp("docs")
    source = work / "src"
    shutil.copytree(DOCS, source, ignore=shutil.ignore_patterns("_build", "_generated"))
    out = work / "html"
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", "-d", str(work / "doctrees"),
         str(source), str(out)],
        capture_output=True, text=True, check=False, timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return out


def site_pages(site: Path) -> list[Path]:
    """The hand-written pages (not the API stubs, the index or the search)."""
    return sorted(
        p for p in site.rglob("*.html")
        if not {"_static", "_sources", "_modules", "generated"} & set(p.parts)
        and p.name not in ("genindex.html", "search.html", "py-modindex.html")
    )


class Page(HTMLParser):
    """What the checks read from a built page: figures, code, navigation."""

    VOID = frozenset(("area", "base", "br", "col", "embed", "hr", "img", "input", "link",
                      "meta", "source", "track", "wbr"))

    def __init__(self, path: Path):
        super().__init__(convert_charrefs=True)
        self.path = path
        self.stack: list[tuple[str, set[str], str]] = []
        self.images: list[dict] = []
        self.pres: list[dict] = []
        self.primary: set[str] | None = None
        self.nav_links = 0
        self.nav_title = False
        self.css: list[str] = []
        self.feed(path.read_text(encoding="utf-8"))

    def within(self, tag: str, cls: str | None = None) -> bool:
        return any(t == tag and (cls is None or cls in c) for t, c, _ in self.stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        if tag == "link" and a.get("rel") == "stylesheet":
            self.css.append(a.get("href", ""))
        if tag == "img" and self.within("article", "bd-article"):
            self.images.append({"src": a.get("src", ""), "width": a.get("width"),
                                "style": a.get("style", ""), "figure": self.within("figure")})
        if a.get("id") == "pst-primary-sidebar":
            self.primary = classes
        if tag == "a" and self.within("nav", "bd-docs-nav"):
            self.nav_links += 1
        if tag == "nav" and "bd-docs-nav" in classes:
            self.nav_title = True
        if tag == "pre" and self.within("article", "bd-article"):
            language = next((c for _, cs, _ in reversed(self.stack) for c in cs
                             if c.startswith("highlight-")), "highlight-default")
            indent = sum(1 for t, cs, _ in self.stack
                         if t in ("ul", "ol", "blockquote") or "admonition" in cs)
            self.pres.append({"text": "", "language": language.removeprefix("highlight-"),
                              "docstring": self.within("dl", "py"), "indent": indent})
        if tag not in self.VOID:
            self.stack.append((tag, classes, a.get("id", "")))

    def handle_endtag(self, tag):
        for k in range(len(self.stack) - 1, -1, -1):
            if self.stack[k][0] == tag:
                del self.stack[k:]
                break

    def handle_data(self, data):
        if self.within("pre") and self.pres and self.within("article", "bd-article"):
            self.pres[-1]["text"] += data

    @property
    def has_primary(self) -> bool:
        return self.primary is not None and "hide-on-wide" not in self.primary


@pytest.fixture(scope="module")
def pages(site) -> list[Page]:
    return [Page(p) for p in site_pages(site)]


def test_the_theme_is_laid_out_as_modelled(site):
    """Every number of the layout model is a declaration in the built theme's CSS."""
    css = (site / "_static" / "styles" / "pydata-sphinx-theme.css").read_text(encoding="utf-8")
    missing = [name for name, (_, pattern) in THEME.items() if not re.search(pattern, css)]
    assert not missing, f"the theme's CSS changed, update THEME: {missing}"
    basic = (site / "_static" / "basic.css").read_text(encoding="utf-8")
    assert re.search(r"figure \{[^}]*padding: 0\.5em", basic)


def test_figures_on_the_built_pages_are_legible(site, pages):
    """Each figure of each page: its smallest text in CSS px as the theme shows it."""
    pytest.importorskip("PIL")
    checked = []
    for page in pages:
        column = narrowest(primary=page.has_primary) - FIGURE_PADDING
        for image in page.images:
            assert image["figure"], f"{page.path.name}: an image outside a figure"
            assert not image["width"] and "width" not in image["style"], image
            facts = _png_facts((page.path.parent / image["src"]).resolve())
            shown = min(facts["width"], column)
            text = shown_px(facts, shown, "font_pt")
            checked.append((page.path.name, image["src"], round(shown), round(text, 1)))
            assert text >= SMALLEST_TEXT_PX, checked[-1]
    assert len(checked) >= 18


def test_no_page_has_empty_navigation(pages):
    """A page either has no "Section Navigation" column or one with links in it."""
    empty = [p.path.name for p in pages if p.has_primary and p.nav_links == 0]
    assert not empty, f"empty Section Navigation on {empty}"
    with_nav = [p for p in pages if p.has_primary]
    assert len(with_nav) >= 17  # the layouts, the schemes and the API reference
    assert all(p.nav_title for p in with_nav)


def test_code_on_the_built_pages_fits_or_wraps(site, pages):
    """Own code fits the column; docstring examples and program output wrap, never clip."""
    css_file = site / "_static" / "relpos.css"
    css = re.sub(r"/\*.*?\*/", "", css_file.read_text(encoding="utf-8"), flags=re.S)
    assert re.search(r"pre\s*\{[^}]*white-space:\s*pre-wrap", css)
    too_long = []
    lines = 0
    for page in pages:
        assert any("relpos.css" in h for h in page.css), page.path.name
        for pre in page.pres:
            if pre["docstring"] or pre["language"] == "text":
                continue
            limit = code_columns(primary=page.has_primary, indent=2 * REM * pre["indent"])
            for line in html.unescape(pre["text"]).splitlines():
                lines += 1
                if len(line) > limit:
                    too_long.append(f"{page.path.name}: {len(line)} > {limit}: {line}")
    assert lines > 300
    assert not too_long, "\n".join(too_long)


# -- in a headless browser ----------------------------------------------------

HARNESS = r"""<!doctype html><meta charset="utf-8"><body><pre id="RESULT"></pre><script>
const PAGES = %(pages)s, WIDTH = %(width)d;
async function measure(url) {
  const frame = document.createElement("iframe");
  frame.style.width = WIDTH + "px"; frame.style.height = "900px";
  document.body.appendChild(frame);
  await new Promise((done) => { frame.onload = done; frame.src = url; });
  const w = frame.contentWindow, d = frame.contentDocument;
  if (w.MathJax && w.MathJax.startup) await w.MathJax.startup.promise;
  await new Promise((done) => setTimeout(done, 300));
  const art = d.querySelector(".bd-article");
  const out = {url, images: [], code: [], math: [], nav: null,
               page: d.documentElement.scrollWidth - d.documentElement.clientWidth};
  for (const im of art.querySelectorAll("img"))
    out.images.push({src: im.getAttribute("src"), shown: im.getBoundingClientRect().width});
  for (const pre of art.querySelectorAll("pre")) {
    const own = !pre.closest("dl.py") && !pre.closest(".highlight-text");
    const clipped = pre.scrollWidth > pre.clientWidth + 1;
    const wrap = pre.style.whiteSpace; pre.style.whiteSpace = "pre";
    const fits = pre.scrollWidth <= pre.clientWidth + 1; pre.style.whiteSpace = wrap;
    out.code.push({own, clipped, fits, text: pre.textContent.slice(0, 50)});
  }
  for (const m of art.querySelectorAll("div.math mjx-container"))
    out.math.push({own: !m.closest("dl.py"), clipped: m.scrollWidth > m.clientWidth + 1,
                   fit: m.dataset.relposFit || null, text: m.textContent.slice(0, 40)});
  const side = d.getElementById("pst-primary-sidebar");
  if (side && side.getBoundingClientRect().width > 0 && getComputedStyle(side).display !== "none")
    out.nav = side.querySelectorAll("nav.bd-docs-nav a").length;
  frame.remove();
  return out;
}
(async () => {
  const results = [];
  for (const url of PAGES) {
    try { results.push(await measure(url)); } catch (e) { results.push({url, error: String(e)}); }
  }
  document.getElementById("RESULT").textContent = JSON.stringify(results);
})();
</script>
"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser_measures(site, tmp_path_factory) -> list[dict]:
    """Every page measured in headless Chromium in a 1200 px frame, from a local server."""
    chromium = _chromium()
    if chromium is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    root = tmp_path_factory.mktemp("served")
    (root / "site").symlink_to(site, target_is_directory=True)
    urls = [f"site/{p.relative_to(site).as_posix()}" for p in site_pages(site)]
    (root / "harness.html").write_text(
        HARNESS % {"pages": json.dumps(urls), "width": 1200}, encoding="utf-8")
    handler = functools.partial(_QuietHandler, directory=str(root))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            run = subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--window-size=1300,1000", "--virtual-time-budget=120000", "--dump-dom",
                 f"http://127.0.0.1:{server.server_address[1]}/harness.html"],
                capture_output=True, text=True, timeout=300, check=False,
            )
        finally:
            server.shutdown()
    found = re.search(r'<pre id="RESULT"[^>]*>(.+?)</pre>', run.stdout, re.S)
    assert found, f"Chromium measured nothing: {run.stderr[-2000:]}"
    results = json.loads(html.unescape(found.group(1)))
    errors = [r for r in results if "error" in r]
    assert not errors, errors
    assert len(results) == len(urls)
    return results


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_in_a_browser_figures_are_as_wide_as_modelled(site, browser_measures):
    pytest.importorskip("PIL")
    shown = []
    for result in browser_measures:
        page = site / result["url"].removeprefix("site/")
        primary = Page(page).has_primary
        for image in result["images"]:
            facts = _png_facts((page.parent / image["src"]).resolve())
            text = shown_px(facts, image["shown"], "font_pt")
            shown.append((page.name, round(image["shown"]), round(text, 1)))
            assert text >= SMALLEST_TEXT_PX, shown[-1]
            # a classic scroll bar, or an overlay one that takes no room
            low, high = (min(facts["width"], content_width(1200, primary=primary, scrollbar=bar)
                             - FIGURE_PADDING) for bar in (SCROLLBAR, 0))
            assert low - 2 <= image["shown"] <= high + 2, (shown[-1], low, high)
    assert len(shown) >= 18


def test_in_a_browser_nothing_is_cut_off(browser_measures):
    """No code block or equation overflows its box; the pages' own ones need no help."""
    problems = []
    for result in browser_measures:
        url = result["url"]
        if result["page"] > 0:
            problems.append(f"{url}: the page scrolls sideways by {result['page']} px")
        for code in result["code"]:
            if code["clipped"]:
                problems.append(f"{url}: code cut off: {code['text']!r}")
            if code["own"] and not code["fits"]:
                problems.append(f"{url}: own code wraps: {code['text']!r}")
        for m in result["math"]:
            if m["clipped"]:
                problems.append(f"{url}: equation cut off: {m['text']!r}")
            if m["own"] and m["fit"]:
                problems.append(f"{url}: own equation shrunk to {m['fit']}: {m['text']!r}")
    assert not problems, "\n".join(problems)
    assert sum(len(r["math"]) for r in browser_measures) > 30


def test_in_a_browser_no_navigation_is_empty(browser_measures):
    empty = [r["url"] for r in browser_measures if r["nav"] == 0]
    assert not empty
    assert sum(1 for r in browser_measures if r["nav"]) >= 17
