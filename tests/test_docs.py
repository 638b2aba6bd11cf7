"""The docs are tested: code blocks run, worked tables match the code, every
public function, scheme and layout has its page, and the C++ and Rust readers
read what the generator writes.

The site itself is built by ``.ci/run`` with ``sphinx-build -W --keep-going``.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _doctest import NUMPY_IMPORT, STRICT_IMPORT, numbers_close, run_text_examples

import relpos_ref
from relpos_ref.cli import build_parser

DOCS = Path(__file__).resolve().parents[1] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import defaults_table  # noqa: E402
import golden_tables  # noqa: E402
import worked  # noqa: E402

PAGES = sorted(
    p for p in DOCS.rglob("*.md") if "_build" not in p.parts and "_generated" not in p.parts
)
OPENING = re.compile(r"^```(?P<lang>[\w{}-]*)")
REQUIRES = re.compile(r"^<!-- requires: (?P<requires>[\w, ]+) -->$")


def code_blocks(page: Path) -> list[tuple[str, str, list[str]]]:
    """(language, body, requirements) of each fenced block of a page, in order.

    Read line by line: a fence opens with three backticks and a language (or
    a directive such as ``{include}``) and closes at the next line of three
    backticks; a ``<!-- requires: ... -->`` line right before names the
    libraries it needs.
    """
    lines = page.read_text(encoding="utf-8").splitlines()
    out, n = [], 0
    while n < len(lines):
        opening = OPENING.match(lines[n])
        if opening is None:
            n += 1
            continue
        end = next(i for i in range(n + 1, len(lines)) if lines[i].strip() == "```")
        before = REQUIRES.match(lines[n - 1]) if n else None
        requires = [r.strip() for r in before["requires"].split(",")] if before else []
        out.append((opening["lang"], "\n".join(lines[n + 1 : end]), requires))
        n = end + 1
    return out


def _missing(requirement: str) -> str | None:
    if importlib.util.find_spec(requirement) is None:
        return f"{requirement} is not installed"
    if requirement == "cupy":
        try:
            import cupy

            cupy.cuda.runtime.getDeviceCount()
        except Exception as error:
            return f"CuPy has no GPU here ({type(error).__name__})"
    return None


def _page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


def _pages_with(language: str) -> list[Path]:
    return [p for p in PAGES if any(b[0] == language for b in code_blocks(p))]


def _pages_and_libraries() -> list:
    """Each page with python blocks, as written and, where it uses array-api-strict, on NumPy."""
    out = []
    for page in _pages_with("python"):
        out.append(pytest.param(page, False, id=_page_id(page)))
        if any(STRICT_IMPORT in body for _, body, _ in code_blocks(page)):
            out.append(pytest.param(page, True, id=f"{_page_id(page)}-numpy"))
    return out


@pytest.mark.parametrize(("page", "on_numpy"), _pages_and_libraries())
def test_python_blocks_run(page, on_numpy):
    """Every python block runs, in page order and one namespace; >>> output must match.

    The kernels are disabled (the blocks show the specification); pages
    written for array-api-strict run a second time on NumPy.
    """
    blocks = [b for b in code_blocks(page) if b[0] == "python"]
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    ran = 0
    for number, (_, body, requires) in enumerate(blocks, 1):
        if any(_missing(r) for r in requires):
            continue
        if on_numpy:
            body = body.replace(STRICT_IMPORT, NUMPY_IMPORT)
        name = f"{_page_id(page)} block {number}"
        if ">>>" in body:
            result = run_text_examples(body, name, namespace)
            assert result.failed == 0, f"{name}: {result.failed} example(s) failed"
        else:
            with relpos_ref.kernels.disabled():
                exec(compile(body, name, "exec"), namespace)
        ran += 1
    assert ran > 0, "every block on this page needs a library that is missing"


def command_lines(page: Path) -> list[str]:
    """The relpos-ref command lines shown in a page's bash blocks, comments removed."""
    return [
        line.split("#")[0].strip()
        for lang, body, _ in code_blocks(page)
        if lang == "bash"
        for line in body.splitlines()
        if line.strip().startswith("relpos-ref")
    ]


@pytest.mark.parametrize("page", [p for p in PAGES if command_lines(p)], ids=_page_id)
def test_command_lines_parse(page):
    """Every relpos-ref command shown in a bash block is a valid command line."""
    lines = command_lines(page)
    parser = build_parser()
    for line in lines:
        args = parser.parse_args(shlex.split(line)[1:])
        assert args.command, line


@pytest.mark.parametrize("name", list(worked.LAYOUTS))
def test_worked_layout_tables_match_the_library(name):
    # Each worked example checks its last step against the library and gather.
    steps = worked.LAYOUTS[name]()
    assert len(steps) >= 3
    assert worked.markdown(steps).count("**Step") == len(steps)


def test_worked_pad_flatten_reshape_has_every_step():
    captions = " ".join(s.caption for s in worked.worked_pad_flatten_reshape())
    for word in ("zero column", "flatten", "pad", "reshape", "keep rows"):
        assert word in captions


def test_worked_stacked_diagonals_is_for_t_max_4():
    first = worked.worked_stacked_diagonals()[0]
    assert first.array.shape[1] == 2 * 4 - 1


@pytest.mark.parametrize("name", worked.SCHEMES)
def test_worked_scheme_tables_render(name):
    steps = worked.worked_scheme(name)
    assert steps
    assert all(s.array.size > 0 for s in steps)
    text = worked.markdown(steps)
    assert "|---|" in text or "```text" in text


def test_worked_step_disagreeing_with_the_library_fails():
    with pytest.raises(AssertionError, match="worked example"):
        worked._check(np.array([[1, 2]]), np.array([[1, 3]]), "demo")


@pytest.mark.parametrize("name", worked.SCHEMES)
def test_every_scheme_has_a_page_with_formula_figure_and_sections(name):
    page = (DOCS / "schemes" / f"{name}.md").read_text(encoding="utf-8")
    assert f"_generated/scheme_{name}.png" in page
    assert f"_generated/scheme_{name}.md" in page
    assert f"_generated/presets_{name}.md" in page
    assert "$$" in page
    for section in ("## Parameters", "## Special cases", "## Cost", "## Popular implementations"):
        assert section in page, f"{name}: no {section!r}"
    assert f"relpos_ref.{name}_attention" in page


@pytest.mark.parametrize("name", [n for n in worked.LAYOUTS if "future" not in n])
def test_every_layout_has_a_page_with_figure(name):
    page = (DOCS / "layouts" / f"{name}.md").read_text(encoding="utf-8")
    assert f"_generated/layout_{name}.png" in page
    assert f"_generated/layout_{name}.md" in page
    assert f"relpos_ref.{name}" in page


def _api_entries() -> set[str]:
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    return set(re.findall(r"^   ([\w.]+)$", text, re.M))


PUBLIC = sorted(n for n in relpos_ref.__all__ if not n.startswith("_"))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_function_is_in_the_api_reference(name):
    assert name in _api_entries(), f"{name} has no page in docs/api.md"


def test_api_reference_lists_only_what_exists():
    for entry in _api_entries():
        module, _, attr = entry.rpartition(".")
        owner = importlib.import_module(f"relpos_ref.{module}") if module else relpos_ref
        assert hasattr(owner, attr), entry


def test_every_page_is_in_a_toctree():
    for page in PAGES:
        if page == DOCS / "index.md":
            continue
        nested = page.parent != DOCS and page.name != "index.md"
        parent = page.parent / "index.md" if nested else DOCS / "index.md"
        entry = page.stem if page.parent == DOCS or nested else f"{page.parent.name}/index"
        toctrees = re.findall(r"```\{toctree\}(.*?)```", parent.read_text(encoding="utf-8"), re.S)
        assert any(re.search(rf"^{re.escape(entry)}$", t, re.M) for t in toctrees), page


def test_float_tolerant_comparison():
    assert numbers_close("array([0.1, 2.5])", "array([0.1000000001, 2.5])")
    assert numbers_close("1.25", "1.2500004")
    assert not numbers_close("1.25", "1.27")
    assert not numbers_close("array([1, 2])", "array([1, 2, 3])")
    assert not numbers_close("True", "False")


@pytest.fixture(scope="module")
def golden_file(tmp_path_factory):
    """The directory of shaw/clip in float32, float16 and bfloat16."""
    from relpos_ref import golden

    out = tmp_path_factory.mktemp("golden") / "suite"
    golden.generate(out, golden.default_cases().select(
        ["shaw/clip/*"], dtypes=["float32", "float16", "bfloat16"]))
    return out


def _printed_array(stdout: str) -> tuple[tuple[int, ...], np.ndarray]:
    header, *values = stdout.splitlines()
    words = header.split()
    assert words[0] == "shape"
    return tuple(int(n) for n in words[1:]), np.array([float(v) for v in values])


def _check_reader(binary: Path, suite: Path) -> None:
    # every float array a backward-pass test needs: goldens (F64) and the inputs and
    # cotangent in the dtype under test (F32, F16, BF16); integer arrays are refused
    from relpos_ref.golden import load_suite

    opened = load_suite(suite)
    read = 0
    for cid, entry in opened.cases.items():
        path = suite / entry["file"]
        arrays = opened.load(cid, rederive=False).arrays
        for name in ("output", "dq", "d_key_table", "q", "d_output"):
            run = subprocess.run([str(binary), str(path), name], capture_output=True,
                                 text=True, check=True)
            shape, values = _printed_array(run.stdout)
            want = arrays[name]
            assert shape == want.shape
            np.testing.assert_array_equal(values, want.astype(np.float64).reshape(-1))
            read += 1
        refused = subprocess.run([str(binary), str(path), "index"], capture_output=True,
                                 text=True, check=False)
        assert refused.returncode != 0 and "not a floating array" in refused.stderr
    assert read == 15


def test_cpp_reader_reads_a_golden_file(golden_file, tmp_path):
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler on this machine")
    binary = tmp_path / "read_golden"
    source = DOCS / "examples" / "read_golden.cpp"
    cmd = [compiler, "-std=c++17", "-O1", "-Wall", "-Werror", str(source), "-o", str(binary)]
    subprocess.run(cmd, check=True)
    _check_reader(binary, golden_file)


def test_rust_reader_reads_a_golden_file(golden_file, tmp_path):
    rustc = shutil.which("rustc")
    if rustc is None:
        pytest.skip("no rustc on this machine")
    binary = tmp_path / "read_golden_rs"
    source = DOCS / "examples" / "read_golden.rs"
    cmd = [rustc, "--edition", "2021", "-O", str(source), "-o", str(binary)]
    subprocess.run(cmd, check=True, capture_output=True)
    _check_reader(binary, golden_file)


def test_the_docs_examples_cover_the_catalog():
    from relpos_ref import catalog

    assert set(worked.EXAMPLES) == set(worked.SCHEMES) == set(catalog.names())
    assert set(worked.EXTRAS) <= set(catalog.names())


def test_license_and_changelog_match_the_package():
    import tomllib

    root = DOCS.parent
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (root / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## {project['version']} " in changelog
    assert (root / "relpos_ref" / "py.typed").is_file()


def test_the_golden_kwargs_of_asymmetric_cases_are_in_the_table():
    # issue 26: the table comes from the catalog, so max_past (asymmetric cases) is in it
    from relpos_ref import golden

    table = golden_tables.golden_parameter_rows()
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines()[2:]}
    asymmetric = [c for c in golden.default_cases() if c.parameters.get("P") is not None]
    assert {c.scheme for c in asymmetric} == {"shaw", "bias"}
    for case in asymmetric:
        from relpos_ref.golden.pipeline import call_keywords

        kwargs = call_keywords(case.entry, case.parameters)
        assert kwargs["max_past"] == case.parameters["P"]
        cell = rows[case.scheme].split(" | ")[2]
        assert all(f"`{k}`" in cell for k in kwargs), (case.id, cell)
        assert "`max_past` (cases with `P`: asymmetric)" in cell


def test_the_golden_params_table_covers_the_catalog_and_says_the_kwargs(tmp_path):
    from relpos_ref import catalog, golden

    table = golden_tables.golden_parameter_rows()
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines()[2:]}
    assert set(rows) == set(catalog.names())
    out = tmp_path / "suite"
    golden.generate(out, [golden.Case.make(name, "doc") for name in catalog.names()])
    opened = golden.load_suite(out)
    decoding = {c.scheme for c in golden.default_cases() if c.kind == "decode"}
    for cid in opened.cases:
        case = opened.load(cid)
        kwargs_cell = rows[case.scheme].split(" | ")[2]
        assert kwargs_cell == ", ".join(golden_tables.golden_kwargs(catalog.get(case.scheme)))
        listed = [k.split("`")[1] for k in kwargs_cell.split(", ")]
        conditional = [k.split("`")[1] for k in kwargs_cell.split(", ") if "(cases with" in k]
        assert list(case.kwargs) == [k for k in listed if k not in conditional], case.scheme
        decode_cell = rows[case.scheme].split(" | ")[5].rstrip(" |")
        assert decode_cell == ("yes" if case.scheme in decoding else "no (a whole grid)")
        gradients_cell = rows[case.scheme].split(" | ")[4].rstrip(" |")
        listed = set(gradients_cell.split(", "))
        stored = {f"`{g}`" for g in case.gradient_names}
        assert stored <= listed, case.scheme
        switched_off = {f"`d_{t.name}`" for t in catalog.get(case.scheme).tables
                        if t.name not in case.inputs}
        assert listed - stored == switched_off, case.scheme


def test_the_table_of_defaults_is_every_scheme_s_own_rule():
    """conventions.md includes the generated table; each row is what a call resolves."""
    import math

    import numpy as np

    from relpos_ref import catalog

    assert "```{include} _generated/defaults.md" in (DOCS / "conventions.md").read_text()
    rows = [line.split(" | ") for line in defaults_table.default_rows().splitlines()[2:]]
    assert [r[0].strip("|` ") for r in rows] == [
        "attention" if n == "plain" else n for n in catalog.names(plain=True)]
    t_q, t_k, d = 2, 5, 4
    for row, name in zip(rows, catalog.names(plain=True), strict=True):
        defaults = catalog.get(name).defaults
        assert tuple(cell.strip("| ") for cell in row[1:]) == defaults_table.cells(defaults)
        assert ("$1$" in row[1]) == (defaults.resolve_scale(None, d) == 1.0)
        if "sqrt{d}$" in row[1]:
            assert defaults.resolve_scale(None, d) == 1 / math.sqrt(d)
        assert defaults.resolve_causal(None) is (row[2].strip() == "`True`")
        end = defaults.resolve_q_offset(None, t_q, t_k) == t_k - t_q
        assert end == row[3].startswith("`t_k - t_q`"), name
    # the defaults are the ones the public functions take: end-aligned and causal for FIRE
    q = np.zeros((t_q, d))
    kv = np.zeros((t_k, d))
    call = catalog.get("fire").check_call(q, kv, kv, {"w1": np.ones((2, 1)), "b1": np.zeros(2),
                                                     "w2": np.ones((1, 2))},
                                          scale=None, mask=None, causal=None, q_offset=None,
                                          options={})[0]
    assert call.causal and call.q_offset == t_k - t_q
