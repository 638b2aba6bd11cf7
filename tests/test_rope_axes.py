"""Multi-axis RoPE, the rotated part at the tail, and the weight converter between pairings.

Every axis layout (M-RoPE's contiguous and interleaved sections, axial RoPE of two
and three axes, EVA-02's interpolated grid, RoPE-Mixed's learned frequencies, 1-D
positions) against the loop reference (`tests/_reference.py`, from the formulas of
docs/schemes/rope_axes.md) on every backend; decoding one query at ``q_offset = t - 1``;
the dispatched functions, the blocked path, the distance form and the backward pass
against the specification; properties under hypothesis; bad input by name.
"""

from __future__ import annotations

import contextlib

import _reference as ref
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import relpos_ref as rp
from relpos_ref import kernels
from relpos_ref.lowering import form_attention, lower
from relpos_ref.schemes import rope as spec

BASE = 100.0
TOL = {"float64": {"rtol": 1e-12, "atol": 1e-12}, "float32": {"rtol": 2e-5, "atol": 2e-5}}

#: A Qwen2-VL-like sequence of 8 tokens: 2 text, a 2 x 2 image at time 2, then 2 text.
MROPE_POSITIONS = [[0, 1, 2, 2, 2, 2, 4, 5],
                   [0, 1, 2, 2, 3, 3, 4, 5],
                   [0, 1, 2, 3, 2, 3, 4, 5]]
GRID_3X3 = [[0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 2, 0, 1, 2, 0, 1]]  # row-major, 8 of 9 tokens
FLUX = [[0] * 8, [0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 3, 0, 1, 2, 3]]
MIXED = np.random.default_rng(7).standard_normal((2, 4, 2)).round(3)  # (h, R/2, axes)

#: name -> (options, positions, F of the reference: (R/2, n) or (h, R/2, n)); d = 8, R = 8
VARIANTS = {
    "mrope": ({"axes": {"axes_type": "mrope", "mrope_section": [2, 1, 1]}}, MROPE_POSITIONS,
              ref.mrope_matrix([2, 1, 1], False, ref.rope_scaled_thetas(8, BASE, None, 8))),
    "mrope-interleaved": (
        {"axes": {"axes_type": "mrope", "mrope_section": [2, 1, 1], "mrope_interleaved": True}},
        MROPE_POSITIONS,
        ref.mrope_matrix([2, 1, 1], True, ref.rope_scaled_thetas(8, BASE, None, 8))),
    "mrope-linear": (
        {"axes": {"axes_type": "mrope", "mrope_section": [1, 2, 1]},
         "scaling": {"rope_type": "linear", "factor": 4.0}}, MROPE_POSITIONS,
        ref.mrope_matrix([1, 2, 1], False,
                         ref.rope_scaled_thetas(8, BASE, {"rope_type": "linear", "factor": 4.0},
                                                8))),
    "axial-2d": ({"axes": {"axes_type": "axial", "axes_dims": [4, 4]}}, GRID_3X3,
                 ref.axial_matrix([4, 4], BASE, [1.0, 1.0])),
    "axial-3d": ({"axes": {"axes_type": "axial", "axes_dims": [2, 2, 4]}}, FLUX,
                 ref.axial_matrix([2, 2, 4], BASE, [1.0, 1.0, 1.0])),
    "axial-eva": ({"axes": {"axes_type": "axial", "axes_dims": [4, 4],
                            "position_scale": [0.5, 0.75]}}, GRID_3X3,
                  ref.axial_matrix([4, 4], BASE, [0.5, 0.75])),
    "mixed": ({"axes": {"axes_type": "mixed", "frequencies": MIXED.tolist()}}, GRID_3X3, MIXED),
    "positions-1d": ({}, [[0, 1, 2, 0, 1, 2, 3, 4]],
                     ref.rope_scaled_thetas(8, BASE, None, 8)),
}


def _freq(name):
    f = np.asarray(VARIANTS[name][2], dtype=np.float64)
    return f[:, None] if f.ndim == 1 else f


def _inputs(seed=0, t=8, d=8, h=2):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((h, t, d)) for _ in range(3))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_rotation_equals_the_reference(backend, name, layout):
    options, positions, _ = VARIANTS[name]
    x = _inputs()[0][:, 3:, :]  # tokens 3 .. 7 of 8
    got = rp.rope_rotate(backend.asarray(x), offset=3, base=BASE, layout=layout,
                         positions=backend.asarray(np.asarray(positions)), **options)
    want = ref.rope_rotate_axes(x, np.asarray(positions), _freq(name), layout, offset=3)
    np.testing.assert_allclose(backend.to_numpy(got), want, **TOL["float64"])


@pytest.mark.parametrize("name", ["mrope-interleaved", "axial-3d", "mixed"])
def test_attention_equals_the_reference_in_float32(backend, name):
    options, positions, _ = VARIANTS[name]
    q, k, v = (a.astype(np.float32) for a in _inputs(1))
    out = rp.rope_attention(*map(backend.asarray, (q, k, v)), base=BASE, layout="interleaved",
                            causal=True, positions=positions, **options)
    rot = [ref.rope_rotate_axes(x, np.asarray(positions), _freq(name), "interleaved")
           for x in (q, k)]
    want, _ = ref.attention(*rot, v.astype(np.float64), causal=True)
    np.testing.assert_allclose(backend.to_numpy(out), want, **TOL["float32"])
    assert out.dtype == backend.xp.float32


def test_tail_rotates_the_last_features(backend):
    x = _inputs(2, d=12)[0]
    got = rp.rope_rotate(backend.asarray(x), offset=2, base=BASE, rotary_dim=8,
                         layout="interleaved", rotary_at="tail")
    thetas = np.asarray(ref.rope_scaled_thetas(8, BASE, None, 10))[:, None]
    positions = np.arange(10)[None, :]
    want = ref.rope_rotate_axes(x, positions, thetas, "interleaved", offset=2, rotary_at="tail")
    np.testing.assert_allclose(backend.to_numpy(got), want, **TOL["float64"])
    np.testing.assert_array_equal(backend.to_numpy(got)[..., :4], x[..., :4])


def test_mrope_without_positions_is_one_dimensional_rope():
    x = _inputs(3)[0]
    for interleaved in (False, True):
        axes = {"axes_type": "mrope", "mrope_section": [2, 1, 1],
                "mrope_interleaved": interleaved}
        got = rp.rope_rotate(x, offset=5, base=BASE, axes=axes)
        np.testing.assert_allclose(got, rp.rope_rotate(x, offset=5, base=BASE),
                                   rtol=1e-13, atol=1e-13)


@given(st.data())
def test_properties_under_hypothesis(data):
    n = data.draw(st.integers(1, 3), label="axes")
    section = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n), label="section")
    pairs = max(sum(section), 1)
    section[0] += pairs - sum(section)
    t = data.draw(st.integers(1, 6), label="t")
    extra = data.draw(st.integers(0, 4), label="passing features")
    d = 2 * pairs + extra
    interleaved = data.draw(st.booleans(), label="interleaved")
    layout = data.draw(st.sampled_from(["half", "interleaved"]), label="layout")
    rotary_at = data.draw(st.sampled_from(["front", "tail"]), label="rotary_at")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    rng = np.random.default_rng(seed)
    positions = rng.integers(0, 50, size=(n, t))
    q, k = rng.standard_normal((2, 2, t, d))
    axes = {"axes_type": "mrope", "mrope_section": section, "mrope_interleaved": interleaved}
    kw = {"base": BASE, "rotary_dim": 2 * pairs, "layout": layout, "rotary_at": rotary_at,
          "axes": axes}
    got = rp.rope_rotate(q, positions=positions, **kw)
    thetas = ref.rope_scaled_thetas(2 * pairs, BASE, None, t)
    want = ref.rope_rotate_axes(q, positions, ref.mrope_matrix(section, interleaved, thetas),
                                layout, rotary_at=rotary_at)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the logits depend on each axis's positions only through differences
    shift = rng.integers(-20, 20, size=(n, 1))
    logits = [rp.rope_rotate(q, positions=p, **kw) @ np.swapaxes(
        rp.rope_rotate(k, positions=p, **kw), -1, -2) for p in (positions, positions + shift)]
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-10, atol=1e-10)
    # equal positions on every axis: 1-D RoPE at those positions
    same = np.repeat(positions[:1], n, axis=0)
    one = rp.rope_rotate(q, positions=same[:1], **{**kw, "axes": None})
    np.testing.assert_allclose(rp.rope_rotate(q, positions=same, **kw), one,
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", ["mrope", "mrope-interleaved", "axial-2d", "mixed"])
def test_decoding_one_query_equals_the_full_row(backend, name):
    options, positions, _ = VARIANTS[name]
    q, k, v = map(backend.asarray, _inputs(4))
    pos = backend.asarray(np.asarray(positions))
    full = rp.rope_attention(q, k, v, base=BASE, causal=True, positions=pos, **options)
    step = rp.rope_attention(q[:, -1:, :], k, v, base=BASE, causal=True, q_offset=7,
                             positions=pos, **options)
    np.testing.assert_allclose(backend.to_numpy(step)[:, 0], backend.to_numpy(full)[:, -1],
                               rtol=1e-12, atol=1e-12)


def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


@pytest.mark.parametrize("name", ["mrope-interleaved", "axial-eva", "mixed", "tail"])
def test_dispatched_blocked_and_lowered_equal_the_specification(name):
    if name == "tail":
        options, positions = {"rotary_dim": 4, "rotary_at": "tail"}, None
    else:
        options, positions = VARIANTS[name][:2]
        options = {**options, "positions": np.asarray(positions)}
    q, k, v = _inputs(5)
    kw = {"base": BASE, "causal": True, "q_offset": 2, **options}
    q = q[:, 2:, :]
    with kernels.disabled():
        want = spec.rope_attention(q, k, v, **kw)
    np.testing.assert_allclose(rp.rope_attention(q, k, v, **kw), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rp.blocked_attention(q, k, v, scheme="rope", block_size=3, **kw),
                               want, rtol=1e-12, atol=1e-12)
    form = lower("rope", q, k, v, causal=True, q_offset=2, base=BASE, **options)
    np.testing.assert_allclose(form_attention(form), want, rtol=1e-12, atol=1e-12)
    d_out = np.random.default_rng(6).standard_normal(want.shape)
    grads = rp.rope_attention_vjp(q, k, v, d_output=d_out, **kw)
    torch = _torch()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    tkw = {**kw, "positions": None if positions is None else torch.tensor(positions)}
    out = rp.rope_attention(tq, tk, tv, **tkw)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-12, atol=1e-12)
    (out * torch.tensor(d_out)).sum().backward()
    for name_, t in (("q", tq), ("k", tk), ("v", tv)):
        np.testing.assert_allclose(grads[name_], t.grad.numpy(), rtol=1e-10, atol=1e-10)
    torch_grads = rp.rope_attention_vjp(tq.detach(), tk.detach(), tv.detach(),
                                        d_output=torch.tensor(d_out), **tkw)
    for name_ in "qkv":
        np.testing.assert_allclose(torch_grads[name_].numpy(), grads[name_], rtol=1e-10,
                                   atol=1e-10)


@pytest.mark.parametrize(("source", "target"), [("half", "interleaved"), ("interleaved", "half")])
@pytest.mark.parametrize(("rotary_dim", "rotary_at"), [(None, "front"), (4, "front"), (4, "tail")])
def test_converted_weights_in_the_other_layout_give_the_same_logits(backend, source, target,
                                                                     rotary_dim, rotary_at):
    rng = np.random.default_rng(8)
    heads, hd, d_model, t = 2, 8, 6, 5
    x, wq, wk = (rng.standard_normal(s) for s in ((t, d_model), (heads * hd, d_model),
                                                  (heads * hd, d_model)))

    def logits(wq, wk, layout):
        q, k = (backend.asarray(np.reshape(x @ w.T, (t, heads, hd)).transpose(1, 0, 2))
                for w in (wq, wk))
        kw = {"base": BASE, "rotary_dim": rotary_dim, "rotary_at": rotary_at, "layout": layout}
        q, k = rp.rope_rotate(q, offset=3, **kw), rp.rope_rotate(k, **kw)
        return backend.to_numpy(q), backend.to_numpy(q @ backend.xp.permute_dims(k, (0, 2, 1)))

    conv = [backend.to_numpy(rp.convert_rope_weights(
        backend.asarray(w), head_dim=hd, source=source, target=target, rotary_dim=rotary_dim,
        rotary_at=rotary_at)) for w in (wq, wk)]
    q0, before = logits(wq, wk, source)
    q1, after = logits(*conv, target)
    np.testing.assert_allclose(after, before, rtol=1e-13, atol=1e-13)
    perm = rp.rope_permutation(hd, source=source, target=target, rotary_dim=rotary_dim,
                               rotary_at=rotary_at)
    np.testing.assert_array_equal(q1, q0[..., list(perm)])  # the same numbers, reordered


def test_converter_is_llama_cpp_and_transformers_permute():
    # llama.cpp's convert_hf_to_gguf (half -> interleaved) and transformers' Llama converter
    # (Meta's interleaved -> half), as those scripts reshape the rows of W_q
    heads, hd = 3, 8
    w = np.random.default_rng(9).standard_normal((heads * hd, 5))
    gguf = w.reshape(heads, 2, hd // 2, 5).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(rp.convert_rope_weights(w, head_dim=hd, source="half",
                                                          target="interleaved"), gguf)
    hf = w.reshape(heads, hd // 2, 2, 5).transpose(0, 2, 1, 3).reshape(w.shape)
    np.testing.assert_array_equal(rp.convert_rope_weights(w, head_dim=hd, source="interleaved",
                                                          target="half"), hf)
    back = rp.convert_rope_weights(gguf, head_dim=hd, source="interleaved", target="half")
    np.testing.assert_array_equal(back, w)


_AXES = {"axes_type": "mrope", "mrope_section": [2, 1, 1]}


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"axes": [2, 1, 1]}, ValueError, r"`axes` must be a mapping .* got \[2, 1, 1\]"),
    ({"axes": {"axes_type": "3d"}}, ValueError, r'`axes\["axes_type"\]` must be one of .* '
                                                r"got '3d'"),
    ({"axes": {**_AXES, "theta": 1}}, ValueError, r"takes the fields .* got 'theta'"),
    ({"axes": {**_AXES, "mrope_section": [2, 2, 1]}}, ValueError,
     r'`axes\["mrope_section"\]` must sum to rotary_dim / 2 = 4, got \[2, 2, 1\]'),
    ({"axes": {"axes_type": "axial", "axes_dims": [4, 2]}}, ValueError,
     r'`axes\["axes_dims"\]` must sum to rotary_dim = 8, got \[4, 2\]'),
    ({"axes": {"axes_type": "axial", "axes_dims": [4, 4], "position_scale": [1.0]}},
     ValueError, r'`axes\["position_scale"\]` must be a number or one per axis .* \[1.0\]'),
    ({"axes": {"axes_type": "axial", "axes_dims": [4, 4]},
      "scaling": {"rope_type": "linear", "factor": 2.0}}, ValueError, r"`scaling` applies to"),
    ({"axes": {"axes_type": "mixed", "frequencies": [[1.0, 2.0]]}}, ValueError,
     r'`axes\["frequencies"\]` must have shape .* = 4, n_axes\), got shape \(1, 2\)'),
    ({"axes": _AXES, "positions": [[0, 1, 2]]}, ValueError,
     r"`positions` must have shape \(3, \.\.\., L\) with L >= 4 .* got shape \(1, 3\)"),
    ({"positions": np.zeros((1, 4))}, TypeError, r"`positions` must have an integer dtype, got"),
    ({"positions": [[0, 1, 2, 3]], "scaling": {"rope_type": "dynamic", "factor": 2.0,
                                              "original_max_position_embeddings": 2}},
     ValueError, r"rope_type 'dynamic' with policy 'per_call' reads it"),
    ({"rotary_at": "back"}, ValueError, r"`rotary_at` must be one of 'front', 'tail', got "
                                        r"'back'"),
    ({"axes": {"axes_type": "mixed", "frequencies": np.ones((4, 2), dtype=np.int64)}},
     TypeError, r'`axes\["frequencies"\]` must have a real floating dtype, got int64'),
    ({"axes": {"axes_type": "mixed", "frequencies": np.ones((4, 2), dtype=bool)}},
     TypeError, r'`axes\["frequencies"\]` must have a real floating dtype, got bool'),
])
def test_bad_input_is_refused_by_name(kwargs, error, match):
    x = np.zeros((2, 4, 8))
    with pytest.raises(error, match=match):
        rp.rope_rotate(x, base=BASE, **kwargs)
    with pytest.raises(error, match=match):
        rp.rope_attention(x, x, x, base=BASE, **kwargs)


def test_a_negative_query_offset_with_positions_names_q_offset():
    x = np.zeros((2, 4, 8))
    positions = np.zeros((3, 8), dtype=np.int64)
    with pytest.raises(ValueError, match=r"`q_offset` must be >= 0 with `positions` .* got -1"):
        rp.rope_attention(x, x, x, axes=_AXES, positions=positions, q_offset=-1)
    with pytest.raises(ValueError, match=r"`offset` must be >= 0 with `positions` .* got -1"):
        rp.rope_rotate(x, axes=_AXES, positions=positions, offset=-1)


def test_bad_converter_input_is_refused_by_name():
    w = np.zeros((12, 3))
    with pytest.raises(ValueError, match=r"multiple of `head_dim` = 8 .* got shape \(12, 3\)"):
        rp.convert_rope_weights(w, head_dim=8, source="half", target="interleaved")
    with pytest.raises(ValueError, match=r"`source` must be one of 'half', 'interleaved', got"):
        rp.convert_rope_weights(w, head_dim=4, source="neox", target="interleaved")
    with pytest.raises(ValueError, match=r"`rotary_dim` must be even and in 0 .. 4 .* got 6"):
        rp.rope_permutation(4, source="half", target="interleaved", rotary_dim=6)
    torch = _torch()
    with pytest.raises(TypeError, match="different libraries"):
        rp.rope_rotate(torch.zeros(2, 4, 8), positions=np.zeros((1, 4), dtype=np.int64))


def test_learned_frequencies_of_another_library_are_refused_by_name():
    torch = pytest.importorskip("torch")
    x = torch.zeros((2, 4, 8), dtype=torch.float64)
    axes = {"axes_type": "mixed", "frequencies": np.ones((4, 2))}
    for call in (lambda: rp.rope_rotate(x, base=BASE, axes=axes),
                 lambda: rp.rope_attention(x, x, x, base=BASE, axes=axes)):
        with pytest.raises(TypeError, match=r'`axes\["frequencies"\]` must be an array of the '
                                            r"call's library \(torch\) or a nested list of "
                                            r"numbers, got a numpy.ndarray"):
            call()
    # float32 frequencies of a float64 (or 16-bit) call are taken: the angles are wide
    wide = {"axes_type": "mixed", "frequencies": torch.ones((4, 2), dtype=torch.float32)}
    out = rp.rope_attention(x, x, x, base=BASE, axes=wide)
    assert out.dtype == torch.float64


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("rotary_at", "rotary_dim"), [("front", None), ("tail", 4)])
@pytest.mark.parametrize("given_positions", [False, True])
def test_the_vjp_gives_the_learned_frequencies_gradient(layout, rotary_at, rotary_dim,
                                                         given_positions):
    """RoPE-Mixed's frequencies are learned: the VJP returns their gradient, equal to torch's
    autograd through the specification, and the kernels give the same (NumPy's computes it,
    torch's hands the call back)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal(s) for s in ((2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 3)))
    table = rng.standard_normal((2, (rotary_dim or 8) // 2, 2))
    positions = rng.integers(0, 9, (2, 7)) if given_positions else None
    d_output = rng.standard_normal((2, 2, 5, 3))
    options = {"layout": layout, "rotary_at": rotary_at, "rotary_dim": rotary_dim,
               "q_offset": 2, "causal": True}
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v, table)]
    with kernels.disabled():
        out = rp.rope_attention(*leaves[:3], axes={"axes_type": "mixed",
                                                   "frequencies": leaves[3]},
                                positions=None if positions is None else torch.tensor(positions),
                                **options)
    out.backward(torch.tensor(d_output))
    want = dict(zip(["q", "k", "v", "frequencies"], (x.grad.numpy() for x in leaves),
                    strict=True))
    for library in ("numpy", "torch"):
        wrap = np.asarray if library == "numpy" else torch.tensor
        axes = {"axes_type": "mixed", "frequencies": wrap(table)}
        call = {"d_output": wrap(d_output), "axes": axes,
                "positions": None if positions is None else wrap(positions), **options}
        for context in (kernels.disabled(), contextlib.nullcontext()):
            with context:
                got = rp.rope_attention_vjp(wrap(q), wrap(k), wrap(v), **call)
            assert got.keys() == want.keys()
            for name, grad in want.items():
                np.testing.assert_allclose(np.asarray(got[name]), grad, rtol=1e-11,
                                           atol=1e-12, err_msg=f"{library} {name}")


def test_learned_frequencies_given_as_a_list_are_constants():
    x = np.random.default_rng(1).standard_normal((3, 8))
    axes = {"axes_type": "mixed", "frequencies": [[0.5, 0.1]] * 4}
    assert set(rp.rope_attention_vjp(x, x, x, d_output=x, axes=axes)) == {"q", "k", "v"}


@pytest.mark.parametrize("batched", ["frequencies", "positions"])
def test_a_rotation_with_batch_axes_of_its_own_has_its_vjp(batched):
    """Learned frequencies (3, 2, R/2, n) or positions (n, 3, 2, L) widen the output's batch
    past q's: the VJP takes a cotangent of the output's shape, turns each element's gradient
    back by its own rotation and then sums it to q's shape (summing first was wrong)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(21)
    q, k, v = (rng.standard_normal(s) for s in ((2, 5, 8), (2, 7, 8), (2, 7, 3)))
    extra = ({"axes": {"axes_type": "mixed", "frequencies": rng.standard_normal((3, 2, 4, 2))}}
             if batched == "frequencies" else
             {"positions": rng.integers(0, 9, (1, 3, 2, 7))})

    def wrap(options, to):
        return {n: ({**o, "frequencies": to(o["frequencies"])} if n == "axes" else to(o))
                for n, o in options.items()}

    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    with kernels.disabled():
        out = rp.rope_attention(*leaves, q_offset=1, **wrap(extra, torch.tensor))
    assert tuple(out.shape) == (3, 2, 5, 3)
    d_output = rng.standard_normal((3, 2, 5, 3))
    out.backward(torch.tensor(d_output))
    for to in (np.asarray, torch.tensor):
        for context in (kernels.disabled(), contextlib.nullcontext()):
            with context:
                got = rp.rope_attention_vjp(to(q), to(k), to(v), d_output=to(d_output),
                                            q_offset=1, **wrap(extra, to))
            for name, leaf in zip("qkv", leaves, strict=True):
                np.testing.assert_allclose(np.asarray(got[name]), leaf.grad.numpy(),
                                           rtol=1e-11, atol=1e-12, err_msg=name)
