"""Every public function has a numpydoc docstring with an example, and the examples run."""

from __future__ import annotations

import importlib
import inspect

import pytest
from _doctest import run_docstring_examples

import relpos_ref

MODULES = [
    "relpos_ref._xp",
    "relpos_ref._exact",
    "relpos_ref._validate",
    "relpos_ref._adapters",
    "relpos_ref._rope_adapters",
    "relpos_ref._fire_pieces",
    "relpos_ref.positions",
    "relpos_ref.layouts",
    "relpos_ref.attention",
    "relpos_ref.calls",
    "relpos_ref.gradients",
    "relpos_ref.distance_gradients",
    "relpos_ref.catalog",
    "relpos_ref.lowering",
    "relpos_ref.flex",
    "relpos_ref.kernels",
    "relpos_ref.kernels.torch",
    "relpos_ref.kernels._torch_sdpa",
    "relpos_ref.kernels._torch_form",
    "relpos_ref.kernels._torch_form_vjp",
    "relpos_ref.kernels._torch_blocks",
    "relpos_ref.kernels._torch_key_terms",
    "relpos_ref.kernels._torch_plan",
    "relpos_ref.kernels._torch_pairs",
    "relpos_ref.kernels._overflow",
    "relpos_ref.kernels._torch_cope",
    "relpos_ref.kernels._torch_fire",
    "relpos_ref.kernels._torch_forgetting",
    "relpos_ref.kernels._numpy_fire",
    "relpos_ref.kernels._numpy_forgetting",
    "relpos_ref.kernels._fire_vjp",
    "relpos_ref.kernels._triton_variants",
    "relpos_ref.kernels._triton_tiling",
    "relpos_ref.kernels._numpy_blocks",
    "relpos_ref.cli_show",
    "relpos_ref.backends",
    "relpos_ref.schemes.absolute",
    "relpos_ref.schemes.bias",
    "relpos_ref.schemes.general",
    "relpos_ref.schemes.grid2d",
    "relpos_ref.schemes.music",
    "relpos_ref.schemes.shaw",
    "relpos_ref.schemes.clipped_index",
    "relpos_ref.schemes.t5",
    "relpos_ref.schemes.alibi",
    "relpos_ref.schemes.swin",
    "relpos_ref.schemes.rope",
    "relpos_ref.schemes.transformer_xl",
    "relpos_ref.schemes.transformer_xl_sinusoids",
    "relpos_ref.schemes.deberta",
    "relpos_ref.schemes.deberta_buckets",
    "relpos_ref.schemes.fire",
    "relpos_ref.schemes._fire_mlp",
    "relpos_ref.schemes.cope",
    "relpos_ref.schemes.forgetting",
    "relpos_ref.schemes.kerple",
    "relpos_ref.schemes.swinv2",
    "relpos_ref.schemes.swinv2_table",
    "relpos_ref.schemes.rope_axes",
    "relpos_ref.schemes.rope_learned",
    "relpos_ref.kernels._numpy_vjp_tiles",
    "relpos_ref.schemes._tables",
    "relpos_ref.blocked",
    "relpos_ref.golden",
    "relpos_ref.golden.casefile",
    "relpos_ref.golden.cases",
    "relpos_ref.golden.compare",
    "relpos_ref.golden.decode",
    "relpos_ref.golden.diagnose",
    "relpos_ref.golden.diagnose_rope",
    "relpos_ref.golden.dtypes",
    "relpos_ref.golden.fileformat",
    "relpos_ref.golden.paths",
    "relpos_ref.golden.rederive",
    "relpos_ref.golden.results",
    "relpos_ref.golden.tolerance",
    "relpos_ref.testing",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    if name == "relpos_ref.flex" or name.startswith(("relpos_ref.kernels.torch",
                                                     "relpos_ref.kernels._torch")):
        pytest.importorskip("torch")
    module = importlib.import_module(name)
    result = run_docstring_examples(module, with_kernels=name.startswith("relpos_ref.kernels"))
    assert result.attempted > 0 or name in (
        "relpos_ref._xp", "relpos_ref._validate", "relpos_ref.schemes._tables"
    )
    assert result.failed == 0


SPECIFICATION = [n for n in MODULES if n.startswith(("relpos_ref.schemes", "relpos_ref.positions",
                                                     "relpos_ref.layouts", "relpos_ref.attention",
                                                     "relpos_ref.calls",
                                                     "relpos_ref.gradients"))]


@pytest.mark.parametrize("name", SPECIFICATION)
def test_specification_examples_run_on_array_api_strict_and_numpy(name):
    """The examples of the specification import array-api-strict (and run on NumPy too)."""
    import doctest

    from _doctest import NUMPY_IMPORT, STRICT_IMPORT

    module = importlib.import_module(name)
    for test in doctest.DocTestFinder().find(module, module.__name__):
        source = "".join(e.source for e in test.examples)
        if not test.examples or ("xp" not in source and "np." not in source):
            continue
        if "float16" in source:  # array-api-strict has no float16: shown on NumPy
            continue
        assert STRICT_IMPORT in source, f"{test.name}: write the example for array-api-strict"
        assert NUMPY_IMPORT not in source and "import numpy" not in source, test.name


PUBLIC = [n for n in relpos_ref.__all__ if not n.startswith("_")]


@pytest.mark.parametrize("name", PUBLIC)
def test_public_function_has_formula_and_example(name):
    obj = getattr(relpos_ref, name)
    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj):
        assert "Attributes" in doc
        return
    assert "Examples" in doc and ">>>" in doc, f"{name} has no runnable example"
    assert "Parameters" in doc or "Returns" in doc, f"{name} has no numpydoc sections"
