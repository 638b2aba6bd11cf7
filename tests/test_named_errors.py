"""Every message names the parameter; what a consumer reads is right (issue 26, items 6, 7).

- ``xp=None`` (or anything that is not a namespace) for each public function
  that takes ``xp`` instead of an array: a `TypeError` naming ``xp``, not
  ``'NoneType' object has no attribute 'int64'``;
- `masked_softmax` on integer logits or a non-bool ``allowed``, and
  `compose_logits` with ``scale=None`` or integer scores: errors naming the
  parameter, not ``OverflowError: cannot convert float infinity to integer``;
- a scalar table in HF transformers' T5 layout ``(num_buckets, h)`` gets a
  hint to transpose it;
- leading axes of ``q``, ``k`` and ``v`` that do not broadcast: the message
  shows the whole shapes, for every scheme.

Each case asserts the exact message (or its library-independent part).
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import catalog

XP_FUNCTIONS = sorted(
    name for name in rp.__all__
    if callable(getattr(rp, name)) and not isinstance(getattr(rp, name), type)
    and "xp" in inspect.signature(getattr(rp, name)).parameters
)
SIZES = {"span": 4, "max_distance": 2, "t_max": 4, "length": 3, "rotary_dim": 4}
NAMESPACE = "`xp` must be an array API namespace (array_api_strict, numpy, torch, ...), got "


def exactly(message: str) -> str:
    """A `pytest.raises` pattern for `message`, whole."""
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize(("given", "shown"), [
    (None, "None"), ("numpy", "'numpy'"), (np.zeros(2), "an object of type ndarray"),
], ids=["None", "str", "array"])
@pytest.mark.parametrize("name", XP_FUNCTIONS)
def test_a_missing_namespace_is_named(name, given, shown):
    function = getattr(rp, name)
    parameters = inspect.signature(function).parameters
    sizes = [3, 4][:sum(p.kind is p.POSITIONAL_ONLY for p in parameters.values())]
    with pytest.raises(TypeError, match=exactly(NAMESPACE + shown)):
        function(*sizes, xp=given, **{k: v for k, v in SIZES.items() if k in parameters})


def test_the_namespace_check_covers_every_function_that_takes_xp():
    assert len(XP_FUNCTIONS) == 14 and "relative_positions" in XP_FUNCTIONS
    assert "rope_cos_sin" in XP_FUNCTIONS


def test_masked_softmax_refuses_integer_logits_by_name(backend):
    logits = backend.asarray(np.array([[1, 2]], dtype=np.int64))
    with pytest.raises(TypeError, match=r"^`logits` must have a real floating dtype, got \S*int"):
        rp.masked_softmax(logits)


def test_masked_softmax_refuses_a_non_bool_allowed_by_name(backend):
    logits = backend.asarray(np.zeros((1, 2)))
    allowed = backend.asarray(np.ones((1, 2)))
    with pytest.raises(TypeError, match=r"^`allowed` must be a bool array \(True = may attend\), "
                                        r"got dtype \S*float64"):
        rp.masked_softmax(logits, allowed=allowed)


@pytest.mark.parametrize(("scale", "message"), [
    (None, "`scale` must be a real number, got None of type NoneType"),
    ("0.5", "`scale` must be a real number, got '0.5' of type str"),
    (float("nan"), "`scale` must be finite, got nan"),
], ids=["None", "str", "nan"])
def test_compose_logits_names_a_bad_scale(backend, scale, message):
    with pytest.raises(ValueError, match=exactly(message)):
        rp.compose_logits(backend.asarray(np.ones((2, 2))), scale=scale)


def test_compose_logits_refuses_integer_scores_by_name(backend):
    with pytest.raises(TypeError, match=r"^`content` must have a real floating dtype"):
        rp.compose_logits(backend.asarray(np.ones((2, 2), dtype=np.int64)), scale=1.0)


# -- HF's T5 table layout --------------------------------------------------------------


@pytest.mark.parametrize(("scheme", "shape"), [("t5", (32, 8)), ("bias", (5, 8))])
def test_a_table_in_hf_layout_gets_a_hint_to_transpose(backend, scheme, shape):
    q = backend.asarray(np.zeros((8, 6, 4)))
    table = backend.asarray(np.zeros(shape))
    function = getattr(rp, f"{scheme}_attention")
    n = shape[0]
    message = (
        f"`table` has {n} heads (shape {shape}) but `q` has shape (8, 6, 4); per-head tables "
        f"need q of shape (..., {n}, t_q, d); a table of shape (n, h) = {shape}, the layout of "
        "HF transformers' T5 `relative_attention_bias.weight`, is ours transposed: pass its "
        f"transpose, of shape (h, n) = {shape[::-1]}")
    with pytest.raises(ValueError, match=exactly(message)):
        function(q, q, q, table)


def test_the_transposed_hf_table_is_the_right_one():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((8, 6, 4)) for _ in range(3))
    hf = rng.standard_normal((32, 8))  # (num_buckets, h)
    out = rp.t5_attention(q, k, v, hf.T)
    head = rp.t5_attention(q[3], k[3], v[3], hf[:, 3])
    np.testing.assert_allclose(out[3], head, rtol=1e-12)


# -- batch mismatches show whole shapes ------------------------------------------------


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
def test_leading_axes_that_do_not_broadcast_show_the_whole_shapes(scheme):
    entry = catalog.get(scheme)
    q = np.zeros((2, 6, 4))
    k = v = np.zeros((3, 6, 4))
    shapes = entry.table_shapes(entry.sizes_from({"t_q": 6, "t_k": 6, "K": 2, "M": 6,
                                                  "t_max": 6, "height": 2, "width": 3,
                                                  "buckets": 8, "d_model": 4, "rows": 6,
                                                  "span": 3}), d=4, d_v=4)
    tables = [np.zeros(shapes[t.name]) for t in entry.tables if t.required]
    options = entry.options_from({"height": 2, "width": 3, "K": 2, "span": 3})
    function = rp.attention if scheme == "plain" else getattr(rp, f"{scheme}_attention")
    message = ("shapes do not broadcast: `q` (2, 6, 4), `k` (3, 6, 4), `v` (3, 6, 4) (their "
               "leading axes (2,), (3,) and (3,) must broadcast)")
    with pytest.raises(ValueError, match=exactly(message)):
        function(q, k, v, *tables, **options)


def test_alibi_slopes_that_do_not_match_the_heads_show_the_whole_shapes():
    q = np.zeros((2, 3, 4))
    message = (
        "`slopes` has 3 entries (shape (3,)), one per head, but the heads of `q` (2, 3, 4), "
        "`k` (2, 3, 4) and `v` (2, 3, 4) (axis -3) number 2")
    with pytest.raises(ValueError, match=exactly(message)):
        rp.alibi_attention(q, q, q, slopes=np.ones(3))
