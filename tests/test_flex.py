"""The FlexAttention export (`relpos_ref.flex`) equals the specification, scheme by scheme.

Every catalog scheme (relative value tables aside: refused, by name) is
proven equal to its ``*_attention`` with the kernels disabled, on the CPU:
hypothesis draws calls (`_calls.calls`: shapes, offsets, causal calls, masks
with empty rows, policies, per-head tables, scales) with 1, 2, 3, 5, 6 or 12
heads and runs FlexAttention eagerly; one call per scheme runs under
``torch.compile`` (inductor's CPU kernel, float32 and float16: it takes no
float64), counted so that a silent fall-back to eager would fail.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import pytest
from _calls import calls
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import catalog, kernels

torch = pytest.importorskip("torch", reason="torch is not installed")
flex_attention_module = pytest.importorskip(
    "torch.nn.attention.flex_attention", reason="this torch has no FlexAttention")
from relpos_ref.flex import attend, flex_attention_args  # noqa: E402

# eager FlexAttention warns once that it is unfused; the compiled tests are counted instead
pytestmark = pytest.mark.filterwarnings(
    "ignore:flex_attention called without torch.compile:UserWarning")

SCHEMES = catalog.names(plain=True)
HEADS = st.sampled_from([1, 2, 3, 5, 6, 12])
TOL = {torch.float64: {"rtol": 1e-10, "atol": 1e-12},
       torch.float32: {"rtol": 2e-4, "atol": 2e-5},
       # 16-bit: FlexAttention rounds the weights to the input dtype before `@ v`
       torch.float16: {"rtol": 4e-3, "atol": 4e-3},
       torch.bfloat16: {"rtol": 3e-2, "atol": 3e-2}}


def _public(scheme):
    return getattr(rp, "attention" if scheme == "plain" else f"{scheme}_attention")


def _spec(scheme, args, kwargs):
    with kernels.disabled():
        return _public(scheme)(*args, **kwargs)


def _outcome(function):
    try:
        return "ok", function()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)


def _to_torch(args, kwargs):
    def convert(a):
        return torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a

    kwargs = {n: convert(a) for n, a in kwargs.items() if n != "return_weights"}
    return [convert(a) for a in args], kwargs


def _value_tables(scheme):
    """Positions, among the arguments, of the scheme's relative value tables (rows of d_v)."""
    return [3 + n for n, t in enumerate(catalog.get(scheme).tables) if t.width == "d_v"]


def _without_value_tables(scheme, args):
    args = [None if n in _value_tables(scheme) else a for n, a in enumerate(args)]
    while args[-1] is None:
        args.pop()
    return args


def _close(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.double(), want.double(), **TOL[want.dtype])


def _unfused():
    """Eager FlexAttention without its per-call Dynamo trace (0.3 s a new shape, torch 2.13).

    torch's eager ``flex_attention`` traces each new call with Dynamo's eager
    backend, then runs the same unfused implementation (``math_attention``)
    that its debugging switch runs directly: the hypothesis tests use the
    switch; the typical calls run the traced path as users do.
    """
    name = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"
    if not hasattr(flex_attention_module, name):
        return contextlib.nullcontext()
    return mock.patch.object(flex_attention_module, name, True)


def _check_value_tables_refused(scheme, args, kwargs):
    given_tables = [n for n in _value_tables(scheme) if n < len(args) and args[n] is not None]
    if not given_tables:
        return args
    with pytest.raises(ValueError, match=r"`value_table`: FlexAttention cannot add a "
                                         r"per-distance value term"):
        flex_attention_args(scheme, *args, **kwargs)
    return _without_value_tables(scheme, args)


@pytest.mark.parametrize("scheme", SCHEMES)
@given(data=st.data())
def test_export_equals_the_specification(scheme, data):
    args, kwargs = _to_torch(*data.draw(calls(scheme, heads=HEADS)))
    want = _outcome(lambda: _spec(scheme, args, kwargs))
    if want[0] == "ok":
        args = _check_value_tables_refused(scheme, args, kwargs)
        want = _outcome(lambda: _spec(scheme, args, kwargs))
    with _unfused():
        got = _outcome(lambda: attend(scheme, *args, **kwargs))
    if want[0] != "ok":
        assert got == want  # the scheme's own checks, word for word
        return
    assert got[0] == "ok", got
    _close(got[1], want[1])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("scheme", ["bias", "rope", "deberta"])
@settings(max_examples=5)
@given(data=st.data())
def test_16_bit_calls_are_within_a_rounding_of_the_weights(scheme, dtype, data):
    args, kwargs = data.draw(calls(scheme, dtypes=("float32",), heads=HEADS))
    args, kwargs = _to_torch(args, kwargs)
    low = getattr(torch, dtype)
    args = [a.to(low) if torch.is_tensor(a) else a for a in args]
    kwargs = {n: a.to(low) if torch.is_tensor(a) and a.is_floating_point() else a
              for n, a in kwargs.items()}
    want = _outcome(lambda: _spec(scheme, args, kwargs))
    with _unfused():
        got = _outcome(lambda: attend(scheme, *args, **kwargs))
    if want[0] != "ok":
        assert got == want
        return
    _close(got[1], want[1])


#: Sizes of the typical calls: t_q = t_k = 6, so 11 distances. Schemes whose score_mods
#: have one structure share a compiled kernel (and a compilation, 3 to 5 s of a CPU): Shaw,
#: Music, general and Transformer-XL read 11-row tables (general's 2 t_max - 1); bias, T5
#: and ALiBi 11 entries per head; plain, RoPE and absolute no term; Swin, grid2d and
#: DeBERTa one kernel each. Offsets, cross lengths and dense terms are the hypothesis
#: tests' (eager): under compilation they are constants and one more gather.
SIZES = {"K": 5, "M": 11, "t_max": 6, "height": 2, "width": 3, "buckets": 8, "d_model": 4,
         "span": 3, "rows": 8}


def _typical_call(scheme, heads=3, dtype="float32"):
    """A causal call of `scheme`, 6 queries and keys: per-head tables, a masked-out row."""
    entry = catalog.get(scheme)
    rng = np.random.default_rng(1)
    shapes = entry.table_shapes(entry.sizes_from({"t_q": 6, "t_k": 6, **SIZES}), d=8, d_v=8,
                                heads=heads)
    values = {t.name for t in entry.tables if t.width == "d_v"}
    tables = {n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()
              if n not in values}
    q, k, v = (rng.standard_normal((2, heads, 6, 8)).astype(dtype) for _ in range(3))
    mask = rng.random((6, 6)) < 0.8
    mask[1] = False
    kwargs = {"mask": mask, "scale": 0.5}  # one scale: the compiled kernels take it as given
    if scheme not in ("swin", "swinv2"):
        kwargs["causal"] = True
    kwargs.update({"grid2d": {"height": 2, "width": 3},
                   "swin": {"window_height": 2, "window_width": 3},
                   "swinv2": {"window_height": 2, "window_width": 3},
                   "t5": {"max_distance": 10}}.get(scheme, {}))
    return _to_torch((q, k, v, *entry.table_args(tables)), kwargs)


@pytest.fixture(scope="module")
def compiled():
    """``torch.compile(flex_attention)`` on inductor, and a count of its compilations.

    One compiled function for the module: schemes whose score_mods have the
    same structure and shapes run the same kernel with their own tensors. A
    fall-back to eager (graph break, recompile limit) is an error.
    """
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    function = torch.compile(flex_attention_module.flex_attention, backend=counter,
                             fullgraph=True, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        yield function, counter
    torch._dynamo.reset()


# inductor imports a module that warns (torch 2.13); nothing of ours
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_compiled_export_equals_the_specification(scheme, compiled):
    function, counter = compiled
    args, kwargs = _typical_call(scheme)
    want = _spec(scheme, args, kwargs)
    before = counter.frame_count
    got = attend(scheme, *args, flex_attention=function, **kwargs)
    assert counter.frame_count - before <= 1  # compiled now, or the kernel of an earlier one
    _close(got, want)
    assert torch.all(got[..., 1, :] == 0)  # the masked row: zeros, as the specification's
    _close(attend(scheme, *args, **kwargs), want)  # torch's eager path, as users call it


def _small(heads=2, t_q=4, t_k=6):
    g = torch.Generator().manual_seed(2)
    return tuple(torch.randn(heads, t, 4, generator=g) for t in (t_q, t_k, t_k))


def test_a_query_with_no_allowed_key_gets_zeros():
    q, k, v = _small()
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False
    args, kwargs = (q, k, v, torch.randn(2, 8)), {"mask": mask, "q_offset": -1, "causal": True}
    with _unfused():
        out = attend("t5", *args, **kwargs)
    # row 0 (position -1) has no key at or before it; row 2 is masked out
    assert torch.all(out[:, 0] == 0) and torch.all(out[:, 2] == 0)
    assert torch.all(out[:, 1].abs().sum(-1) > 0)
    _close(out, _spec("t5", args, kwargs))


@pytest.mark.parametrize(("t_q", "t_k"), [(0, 5), (3, 0), (0, 0)])
def test_an_empty_grid_is_refused_by_the_arguments_and_zeros_from_attend(t_q, t_k):
    q, k, v = _small(t_q=t_q, t_k=t_k)
    with pytest.raises(ValueError, match=rf"FlexAttention cannot run an empty grid, got "
                                         rf"`t_q` = {t_q} and `t_k` = {t_k}"):
        flex_attention_args("shaw", q, k, v, torch.randn(5, 4))
    got = attend("shaw", q, k, v, torch.randn(5, 4))
    _close(got, _spec("shaw", (q, k, v, torch.randn(5, 4)), {}))


def test_value_tables_are_refused_by_name():
    q, k, v = _small()
    for scheme, tables in (("shaw", (torch.randn(5, 4), torch.randn(5, 4))),
                           ("music", (torch.randn(6, 4), torch.randn(6, 4)))):
        with pytest.raises(ValueError, match=r"^`value_table`: FlexAttention cannot add a "
                                             r"per-distance value term \(a score_mod changes "
                                             r"scores only"):
            attend(scheme, q, k, v, *tables)


def test_arrays_of_another_library_are_refused_by_name():
    q, k, v = _small()
    with pytest.raises(TypeError, match=r"`k` must be a torch tensor \(FlexAttention is "
                                        r"torch's\), got numpy.ndarray"):
        flex_attention_args("plain", q, k.numpy(), v)


def test_the_schemes_own_checks_come_first():
    q, k, v = _small()
    with pytest.raises(ValueError, match="`scheme` must be one of"):
        flex_attention_args("relative", q, k, v)
    with pytest.raises(ValueError, match="`key_table` must have"):
        flex_attention_args("shaw", q, k, v, torch.randn(5, 3))
    with pytest.raises(ValueError, match="`causal` must be True or False, got 'yes'"):
        flex_attention_args("bias", q, k, v, torch.randn(3), causal="yes")


def test_the_arguments_say_what_flex_attention_takes():
    q, k, v = _small(heads=3)
    a = flex_attention_args("alibi", q, k, v)
    assert a.block_mask is None and a.mask_mod is None  # no mask, not causal
    assert a.q.shape == (1, 3, 4, 4) and a.v.shape == (1, 3, 6, 4)
    assert a.kwargs == {"score_mod": a.score_mod, "block_mask": None, "scale": 0.5}
    causal = flex_attention_args("alibi", q, k, v, causal=True, q_offset=2)
    assert causal.block_mask is not None
    i, j = torch.tensor(1), torch.tensor(3)  # r = 3 - (1 + 2) = 0: allowed; j = 4 is not
    assert causal.mask_mod(0, 0, i, j) and not causal.mask_mod(0, 0, i, j + 1)
    # the score_mod adds ALiBi's -m |r| (r = -2 here), and the constant m |q_offset| that
    # alibi_attention adds, to a score that arrives scaled
    score = causal.score_mod(torch.tensor(0.0), torch.tensor(0), torch.tensor(0), i, j - 2)
    slope = rp.alibi_slopes(3)[0]
    assert torch.isclose(score, torch.tensor(-2 * slope + 2 * slope))
    plain = flex_attention_args("alibi", q, k, v)  # no offset: no constant
    score = plain.score_mod(torch.tensor(0.0), torch.tensor(0), torch.tensor(0), i, j)
    assert torch.isclose(score, torch.tensor(-2 * slope))


def test_a_value_table_passed_as_the_key_table_too_is_named_as_the_value_table():
    q, k, v = _small()
    table = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"^`value_table`: FlexAttention cannot"):
        flex_attention_args("shaw", q, k, v, table, table)


def _described(form):
    """The docs table's words for a form's pieces."""
    def by(terms):
        return "by distance" if all(t.index.by_distance for t in terms) else "by coordinates"

    if any(a is not None for a in form.dense):
        return "dense `position`, `bias`"
    if form.key_terms:
        return f"query and key sides, {by(form.query_terms + form.key_terms)}"
    if form.query_terms:
        count = {1: "query side", 2: "two query sides"}[len(form.query_terms)]
        return f"{count}, {by(form.query_terms)}"
    if form.biases:
        return f"bias, {by(form.biases)}"
    return "no term"


def test_the_docs_table_says_what_each_scheme_lowers_to():
    from pathlib import Path

    from relpos_ref.lowering import lower

    page = Path(__file__).resolve().parents[1] / "docs" / "flex.md"
    rows = {cells[1].strip(): cells[2].strip() for line in page.read_text().splitlines()
            if (cells := line.split("|")) and len(cells) == 6}
    for scheme in SCHEMES:
        args, kwargs = _typical_call(scheme)
        if scheme == "plain":
            kwargs["bias"] = torch.zeros(6, 6)
        assert rows[scheme] == _described(lower(scheme, *args, **kwargs)), scheme
