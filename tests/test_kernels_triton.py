"""The Triton kernels equal the specification, scheme by scheme (on the CPU, interpreted).

Triton's interpreter runs the very kernel source on CPU torch tensors
(``TRITON_INTERPRET=1``, which `conftest` sets on a machine without a GPU);
with a CUDA device the same tests run the compiled kernels on it. Hypothesis
draws calls of every scheme (`_calls.calls`: shapes, offsets, causality,
masks with empty rows, policies, per-head tables, scales, relative values)
in float64, float32, float16 and bfloat16, with tiles of 16 so that a call
of up to 40 queries spans several tiles of queries and keys; the kernel,
called directly, must return what the specification returns on the same
tensors, or hand the call back only where the module says it does.
"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

import numpy as np
import pytest
from _calls import calls
from hypothesis import given, settings
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import catalog, kernels

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
kt = pytest.importorskip("relpos_ref.kernels.triton")
from relpos_ref.kernels import _triton_launch, _triton_tiling  # noqa: E402
from relpos_ref.kernels._triton_forward import attention_forward  # noqa: E402
from relpos_ref.lowering import lower  # noqa: E402

INTERPRETED = kt.INTERPRETER
if INTERPRETED:
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip("triton is compiling (TRITON_INTERPRET is not 1) and there is no CUDA device",
                allow_module_level=True)

#: Under the ``ci`` profile the interpreter's hypothesis tests draw 8 examples per scheme (a
#: tile costs the interpreter tens of milliseconds); ``thorough`` draws its own count.
INTERPRETED_EXAMPLES = (settings(max_examples=8)
                        if os.environ.get("RELPOS_HYPOTHESIS_PROFILE", "ci") == "ci"
                        else settings())

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16}
TOL = {"float64": {"rtol": 1e-10, "atol": 1e-12}, "float32": {"rtol": 2e-4, "atol": 2e-5},
       "float16": {"rtol": 2.5e-3, "atol": 1e-3}, "bfloat16": {"rtol": 2e-2, "atol": 8e-3}}


@contextlib.contextmanager
def _small_tiles():
    """Tiles of 16 queries and keys, so that calls of a few dozen span several.

    Every dtype reads one entry per query in the tiles past a bias's ends,
    as 16-bit calls do, so that float64 proves that path exactly.
    """
    every = frozenset({2, 4, 8})
    with mock.patch.dict(_triton_tiling.TILES, dict.fromkeys(_triton_tiling.TILES, (16, 16, 4))), \
            mock.patch.object(_triton_launch, "ENDS_ITEMSIZES", every):
        yield


def _public(scheme):
    return "attention" if scheme == "plain" else f"{scheme}_attention"


def _tensor(x, dtype):
    if not isinstance(x, np.ndarray):
        return x
    t = torch.from_numpy(np.ascontiguousarray(x)).to(DEVICE)
    return t.to(dtype) if t.dtype.is_floating_point else t


def _on(dtype, args, kwargs):
    return ([_tensor(a, dtype) for a in args],
            {name: _tensor(a, dtype) for name, a in kwargs.items()})


def _spec(scheme, args, kwargs):
    with kernels.disabled():
        return getattr(rp, _public(scheme))(*args, **kwargs)


def _run(scheme, args, kwargs):
    context = kt.interpreted() if INTERPRETED else mock.patch.dict({})
    with context:
        return kt.KERNELS[scheme](*args, **kwargs)


def _outcome(function):
    try:
        return "ok", function()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)


def _assert_close(got, want, dtype):
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype
    assert got.shape == want.shape and got.device == want.device
    np.testing.assert_allclose(got.double().cpu().numpy(), want.double().cpu().numpy(),
                               **TOL[dtype])


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@INTERPRETED_EXAMPLES
@given(data=st.data(), dtype=st.sampled_from(list(DTYPES)))
def test_kernel_equals_the_specification(scheme, data, dtype):
    args, kwargs = data.draw(calls(scheme, dtypes=("float64",), longest=40))
    kwargs.pop("return_weights")
    args, kwargs = _on(DTYPES[dtype], args, kwargs)
    want = _outcome(lambda: _spec(scheme, args, kwargs))
    with _small_tiles():
        got = _outcome(lambda: _run(scheme, args, kwargs))
    empty = 0 in (args[0].shape[-2], args[1].shape[-2])
    if got[1] is NotImplemented:
        assert empty or want[0] != "ok", "the kernel declined a call it covers"
        return
    assert got[0] == want[0], (got, want)
    if want[0] == "ok":
        _assert_close(got[1], want[1], dtype)
    else:
        assert got == want


@pytest.mark.parametrize("scheme", ["shaw", "bias", "deberta", "transformer_xl", "plain"])
def test_kernel_equals_the_specification_with_its_own_tiles(scheme):
    """The default tiles (64 queries and keys), two tiles each way, a mask and an offset."""
    data = np.random.default_rng(7)
    entry = catalog.get(scheme)
    sizes = {"K": 40, "d_model": 8, "span": 24, "rows": 150}
    shapes = entry.table_shapes(entry.sizes_from({"t_q": 100, "t_k": 150, **sizes}), d=16,
                                d_v=8, heads=2)
    q, k, v = (_tensor(data.standard_normal(s), torch.float32)
               for s in ((2, 100, 16), (2, 150, 16), (2, 150, 8)))
    tables = {n: _tensor(data.standard_normal(s), torch.float32) for n, s in shapes.items()}
    kwargs = {"mask": _tensor(data.random((100, 150)) < 0.9, None), "q_offset": 30,
              "causal": True}
    args = (q, k, v, *entry.table_args(tables))
    _assert_close(_run(scheme, args, kwargs), _spec(scheme, args, kwargs), "float32")


@pytest.mark.parametrize("q_offset", [-1, 0, 1, 15, 16, 17])
def test_causal_calls_reach_the_last_key_a_tile_may_see(q_offset):
    """Key tiles wholly in the future are skipped, and no other: tile edges at every offset."""
    data = np.random.default_rng(3)
    q, k, v = (_tensor(data.standard_normal((2, t, 16)), torch.float64) for t in (32, 48, 48))
    kwargs = {"causal": True, "q_offset": q_offset}
    with _small_tiles():
        got = _run("plain", (q, k, v), kwargs)
    _assert_close(got, _spec("plain", (q, k, v), kwargs), "float64")


@pytest.mark.parametrize("max_distance", range(18))
def test_tiles_at_the_ends_of_the_table_read_one_row(max_distance):
    """A tile wholly beyond the band reads one row (a bias: one entry) per end; no other tile does.

    Tiles of 16 and every K from 0 to 17 put the band's edge at every place
    of a tile's window of 31 distances.
    """
    data = np.random.default_rng(max_distance)
    q, k, v = (_tensor(data.standard_normal((2, 48, 16)), torch.float64) for _ in range(3))
    rows = 2 * max_distance + 1
    tables = [_tensor(data.standard_normal((rows, 16)), torch.float64),
              _tensor(data.standard_normal((rows, 16)), torch.float64)]
    span = max(max_distance, 1)  # DeBERTa: rows for -(S - 1) .. S
    deberta = [_tensor(data.standard_normal((2 * span, 16)), torch.float64) for _ in range(2)]
    bias = _tensor(data.standard_normal((2, rows)), torch.float64)  # one entry per pair's tile
    for scheme, args in (("shaw", (q, k, v, *tables)), ("deberta", (q, k, v, *deberta)),
                         ("bias", (q, k, v, bias))):
        with _small_tiles():
            got = _run(scheme, args, {"q_offset": 3})
        _assert_close(got, _spec(scheme, args, {"q_offset": 3}), "float64")


@pytest.mark.parametrize(("scheme", "options", "ends"), [
    ("bias", {}, (36, 42)),  # K = 3: r <= -3 is c <= 36, r >= 3 is c >= 42 (c = r + 39)
    ("bias", {"beyond": "zero"}, (35, 43)),  # zero beyond K: from r = -4 and r = 4 on
    ("t5", {"max_distance": 8}, (35, 43)),  # 4 buckets a side, 2 exact: the last from |r| = 4
    ("alibi", {}, (0, 88)),  # a row per distance: no tile reads one entry, no split
])
def test_the_launch_passes_where_a_bias_reads_one_entry(scheme, options, ends):
    q = _tensor(np.zeros((2, 40, 8)), torch.float32)
    k = v = _tensor(np.zeros((2, 50, 8)), torch.float32)
    tables = {"bias": [_tensor(np.arange(14.0).reshape(2, 7), torch.float32)],
              "t5": [_tensor(np.arange(16.0).reshape(2, 8), torch.float32)]}.get(scheme, [])
    form = lower(scheme, q, k, v, *tables, **options)
    launch = _triton_launch.forward_arguments(form, interpret=INTERPRETED)
    named = dict(zip(attention_forward.arg_names, launch.args, strict=False))
    assert (named["glo"], named["ghi"]) == (-1, 89)  # float32: each pair read, no ends read
    assert not launch.constants["G_ENDS"]
    half = lower(scheme, *(x.to(torch.float16) for x in (q, k, v, *tables)), **options)
    launch = _triton_launch.forward_arguments(half, interpret=INTERPRETED)
    named = dict(zip(attention_forward.arg_names, launch.args, strict=False))
    assert (named["glo"], named["ghi"]) == ends
    assert launch.constants["G_ENDS"] == (ends != (0, 88))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("scheme", ["plain", "shaw"])
def test_16_bit_weights_keep_float32_accuracy(scheme, dtype):
    """``P v`` (and relative values) with the weights split in two 16-bit parts.

    Values of +-1000 cancel, so the output is small: the weights rounded to
    16 bits would put the error near 2^-12 * 1000 (float16) or 2^-9 * 1000;
    kept to float32's accuracy it stays within the output's own rounding.
    """
    data = np.random.default_rng(5)
    sign = np.where(np.arange(64) % 2 == 0, 1.0, -1.0)
    q, k = (_tensor(data.standard_normal((2, 64, 16)) / 2, DTYPES[dtype]) for _ in range(2))
    v = _tensor(1000 * sign[:, None] * (1 + data.random((2, 64, 16)) / 64), DTYPES[dtype])
    tables = [_tensor(data.standard_normal((9, 16)) / 4, DTYPES[dtype]),
              _tensor(1000 * data.standard_normal((9, 16)), DTYPES[dtype])]
    args = (q, k, v, *(tables if scheme == "shaw" else []))
    got = _run(scheme, args, {}).double()
    exact = _spec(scheme, [a.double() for a in args], {})  # the 16-bit values, in float64
    rounding = exact.abs() * (2.0 ** -10 if dtype == "float16" else 2.0 ** -7)
    assert bool(((got - exact).abs() <= rounding + 0.05).all())


@pytest.mark.parametrize(("change", "reason"), [
    ({"return_weights": True}, "weights"),
    ({"method": "definition"}, "definition"),
])
def test_kernel_hands_back_what_it_does_not_cover(change, reason):
    q = k = v = _tensor(np.eye(4), torch.float32)
    assert _run("shaw", (q, k, v, _tensor(np.zeros((3, 4)), torch.float32)), change) \
        is NotImplemented, reason


def test_a_non_finite_value_goes_to_the_specification():
    q = k = _tensor(np.eye(4), torch.float32)
    v = _tensor(np.eye(4), torch.float32)
    v[0, 0] = float("nan")
    mask = _tensor(np.ones((4, 4), dtype=bool), None)
    mask[:, 0] = False  # the NaN is behind the mask: the specification keeps it out
    assert _run("plain", (q, k, v), {"mask": mask}) is NotImplemented
    with (kt.interpreted() if INTERPRETED else mock.patch.dict({})):
        out = rp.attention(q, k, v, mask=mask)
    assert bool(torch.isfinite(out).all())


def test_kernel_for_names_the_triton_kernel_only_when_it_runs():
    q = k = v = _tensor(np.eye(4), torch.float32)
    if INTERPRETED:
        assert kernels.kernel_for("t5", (q, k, v)).__name__ == "t5_attention_torch"
        with kt.interpreted():
            assert kernels.kernel_for("t5", (q, k, v)).__name__ == "t5_attention_triton"
            with kernels.disabled():
                assert kernels.kernel_for("t5", (q, k, v)) is None
    else:
        assert kernels.kernel_for("t5", (q, k, v)).__name__ == "t5_attention_triton"


def test_a_variant_triton_cannot_build_hands_the_call_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(kt, "_UNBUILT", set())  # warned once per process: anew here
    q = k = v = _tensor(np.ones((2, 4, 4)), torch.float32)
    failure = RuntimeError("PassManager::run failed")
    with mock.patch.object(kt, "launch_forward", side_effect=failure), \
            pytest.warns(RuntimeWarning, match="could not be built for this call"):
        assert _run("alibi", (q, k, v), {}) is NotImplemented
    with mock.patch.object(kt, "launch_forward", side_effect=RuntimeError("a real fault")), \
            pytest.raises(RuntimeError, match="a real fault"):
        _run("alibi", (q, k, v), {})


def test_bad_input_gets_the_specification_message():
    q = k = v = _tensor(np.eye(4), torch.float32)
    with pytest.raises(ValueError, match="must have 2K \\+ 1 entries"):
        _run("bias", (q, k, v, _tensor(np.zeros(4), torch.float32)), {})


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_call_that_may_overflow_goes_to_the_specification(sign):
    """The conventions' overflow rule: the specification's NaN, never zeros nor a finite value.

    Logits of 4e40 (either sign) overflow float32; the kernel, bounding them
    from the inputs' magnitudes, hands the call back, and the dispatched call
    gives NaN for the overflowed row and zeros for the row with no key.
    """
    q = _tensor(1e20 * np.ones((1, 2, 4)), torch.float32)
    k = _tensor(sign * np.array([[[1e20] * 4, [2e20] * 4, [3e20] * 4]]), torch.float32)
    v = _tensor(np.arange(12.0).reshape(1, 3, 4), torch.float32)
    mask = _tensor(np.array([[True, True, True], [False, False, False]]), None)
    assert _run("plain", (q, k, v), {"mask": mask}) is NotImplemented
    with kt.interpreted() if INTERPRETED else mock.patch.dict({}):
        got = rp.attention(q, k, v, mask=mask)
    assert bool(torch.isnan(got[0, 0]).all()) and bool((got[0, 1] == 0).all())
    small = _tensor(np.ones((1, 2, 4)), torch.float32)  # and a call far below the bound runs
    assert _run("plain", (small, small, small), {}) is not NotImplemented
