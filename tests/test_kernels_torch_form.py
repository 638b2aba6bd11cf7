"""The torch block engine equals the specification in every branch, forward and backward.

`relpos_ref.kernels._torch_form` evaluates the distance form a block of query
rows at a time, and chooses per call and per block how to read each term:
from one product per call or per block (``GATHER_SHARE``), through the runs
of a map or distance by distance (``MAX_PIECES``), per tile of keys
(``KEY_TILE``), by a key coordinate's structure or pair by pair. The
hypothesis calls of the kernel tests (`test_kernels.calls`,
`test_kernels_vjp.vjp_calls`) run here with those knobs drawn beside them and
blocks of one row upwards, so that every branch meets offsets, causal widths,
masks of every broadcast shape, policies (``beyond="zero"`` and ``"error"``),
per-head tables and empty rows; the kernels, called directly, must not hand
any finite call back. Also: relative values in 16 bits, non-finite values
behind a mask (the specification), rows with no key, and the building blocks
against their definitions.
"""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernels import TOL, _errors_alike, _public, calls
from test_kernels_vjp import RTOL, vjp_calls

import relpos_ref as rp
from relpos_ref import catalog, kernels

torch = pytest.importorskip("torch")

from relpos_ref.kernels import (  # noqa: E402
    _torch_blocks,
    _torch_form,
    _torch_key_terms,
    _torch_plan,
)
from relpos_ref.kernels._torch_blocks import (  # noqa: E402
    Arena,
    Runs,
    add_constant,
    add_rows,
    laid_piece,
    laid_rows,
    piece_count,
    pieces,
    region_sums,
)
from relpos_ref.kernels._torch_key_terms import _one_row  # noqa: E402
from relpos_ref.kernels._torch_pairs import grid_table, structure  # noqa: E402
from relpos_ref.lowering import IndexMap, lower  # noqa: E402

KERNELS = kernels.kernels("torch")
VJP_KERNELS = kernels.vjp_kernels("torch")
#: The schemes whose forms the block engine evaluates (the others reach SDPA forward).
ENGINE = ["shaw", "music", "general", "grid2d", "swin", "transformer_xl", "deberta"]

KNOBS = st.fixed_dictionaries({
    "BLOCK_BYTES": st.sampled_from([1, 200, 2**21]),
    "KEY_TILE": st.sampled_from([1, 3, 128]),
    "MAX_PIECES": st.sampled_from([0, 8]),
    "GATHER_SHARE": st.sampled_from([0.0, 0.5, math.inf]),
})


@contextlib.contextmanager
def _knobs(values):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_torch_plan, "MIN_ROWS", 1)
        for name, value in values.items():
            owner = {"KEY_TILE": _torch_key_terms, "MAX_PIECES": _torch_form}.get(name, _torch_plan)
            patch.setattr(owner, name, value)
        yield


def _tensor(x):
    return torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x


def _on_torch(args, kwargs):
    return [_tensor(a) for a in args], {n: _tensor(a) for n, a in kwargs.items()}


def _spec(scheme, args, kwargs, vjp=False):
    with kernels.disabled():
        return getattr(rp, _public(scheme) + ("_vjp" if vjp else ""))(*args, **kwargs)


def _assert_close(got, want):
    assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.double().numpy(), want.double().numpy(),
                               **TOL[str(want.dtype).removeprefix("torch.")])


def _assert_gradients_close(got, want):
    assert list(got) == list(want)
    rtol = RTOL[str(next(iter(want.values())).dtype).removeprefix("torch.")]
    size = max((float(w.abs().max()) for w in want.values() if w.numel()), default=0)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name].numpy(), w.numpy(), rtol=rtol,
                                   atol=rtol * max(size, 1e-3), err_msg=name)


def _empty(args, kwargs=None):
    # an empty grid, or Swin v2's additive mask (the specification evaluates it)
    penalty = kwargs is not None and kwargs.get("mask") is not None \
        and kwargs.get("mask_penalty") is not None
    return args[0].shape[-2] == 0 or args[1].shape[-2] == 0 or penalty


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@given(data=st.data(), knobs=KNOBS)
def test_every_branch_of_the_forward_equals_the_specification(scheme, data, knobs):
    args, kwargs = _on_torch(*data.draw(calls(scheme, longest=12)))
    kwargs["return_weights"] = False
    with _knobs(knobs):
        got = _errors_alike(lambda: KERNELS[scheme](*args, **kwargs))
    want = _errors_alike(lambda: _spec(scheme, args, kwargs))
    if want[0] != "ok":
        assert got == want
    elif got[1] is NotImplemented:
        assert _empty(args, kwargs), "the kernel declined a call it covers"
    else:
        _assert_close(got[1], want[1])


@pytest.mark.parametrize("scheme", catalog.names(plain=True))
@given(data=st.data(), knobs=KNOBS)
def test_every_branch_of_the_backward_equals_the_specification(scheme, data, knobs):
    args, kwargs = _on_torch(*data.draw(vjp_calls(scheme)))
    with _knobs(knobs):
        got = _errors_alike(lambda: VJP_KERNELS[scheme](*args, **kwargs))
    want = _errors_alike(lambda: _spec(scheme, args, kwargs, vjp=True))
    if want[0] != "ok":
        assert got == want
    elif got[1] is NotImplemented:
        assert _empty(args, kwargs), "the kernel declined a call it covers"
    else:
        _assert_gradients_close(got[1], want[1])


def _typical(scheme, dtype=torch.float64):
    """A per-head call with every table (value tables too), an offset: (args, kwargs)."""
    gen = torch.Generator().manual_seed(3)
    entry = catalog.get(scheme)
    height, width = 3, 4
    t_q, t_k = (12, 12) if scheme in ("grid2d", "swin") else (11, 13)
    params = {"t_q": t_q, "t_k": t_k, "K": 3, "M": 6, "t_max": 16, "height": height,
              "width": width, "d_model": 6, "span": 3, "max_position": 9}
    shapes = entry.table_shapes(entry.sizes_from(params), d=4, d_v=3, heads=2,
                                include={t.switch: True for t in entry.tables if t.switch})
    tables = [torch.randn(*shapes[t.name], generator=gen, dtype=dtype)
              for t in entry.tables if t.name in shapes]
    q, k = torch.randn(2, t_q, 4, generator=gen, dtype=dtype), torch.randn(2, t_k, 4,
                                                                          generator=gen,
                                                                          dtype=dtype)
    v = torch.randn(2, t_k, 3, generator=gen, dtype=dtype)
    kwargs = entry.options_from(params)
    if scheme not in ("grid2d", "swin"):
        kwargs["q_offset"] = 1
    return [q, k, v, *tables], kwargs


@pytest.mark.parametrize("shape", [(), (13,), (1, 13), (11, 1), (11, 13), (3, 1, 11, 13)])
@pytest.mark.parametrize("scheme", ["shaw", "music", "deberta", "general", "transformer_xl"])
def test_masks_of_every_shape_in_the_engine(scheme, shape):
    args, kwargs = _typical(scheme)
    gen = torch.Generator().manual_seed(len(shape) + 5)
    kwargs.update(mask=torch.rand(shape, generator=gen) < 0.6, causal=False)
    want = _spec(scheme, args, kwargs)
    got = KERNELS[scheme](*args, **kwargs)
    assert got is not NotImplemented
    _assert_close(got, want)
    d_output = torch.randn(want.shape, generator=gen, dtype=want.dtype)
    grads = VJP_KERNELS[scheme](*args, d_output=d_output, **kwargs)
    assert grads is not NotImplemented
    _assert_gradients_close(grads, _spec(scheme, args, {"d_output": d_output, **kwargs},
                                         vjp=True))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("scheme", ENGINE)
def test_16_bit_calls_of_the_engine_compute_in_float32(scheme, dtype):
    args, kwargs = _typical(scheme, torch.float32)
    args = [a.to(getattr(torch, dtype)) for a in args]
    kwargs["mask"] = torch.rand(args[0].shape[-2], args[1].shape[-2],
                                generator=torch.Generator().manual_seed(2)) < 0.8
    got = KERNELS[scheme](*args, **kwargs)
    want = _spec(scheme, args, kwargs)
    assert got is not NotImplemented and got.dtype == want.dtype == args[0].dtype
    tol = {"rtol": 1e-2 if dtype == "bfloat16" else 2e-3, "atol": 1e-2}
    np.testing.assert_allclose(got.float().numpy(), want.float().numpy(), **tol)
    d_output = torch.randn(want.shape, generator=torch.Generator().manual_seed(4)).to(want.dtype)
    grads = VJP_KERNELS[scheme](*args, d_output=d_output, **kwargs)
    want_grads = _spec(scheme, args, {"d_output": d_output, **kwargs}, vjp=True)
    assert grads is not NotImplemented and list(grads) == list(want_grads)
    for name, w in want_grads.items():
        assert grads[name].dtype == w.dtype, name
        np.testing.assert_allclose(grads[name].float().numpy(), w.float().numpy(), rtol=3e-2,
                                   atol=3e-2 * float(w.float().abs().max()), err_msg=name)


@pytest.mark.parametrize("scheme", ["shaw", "music"])
def test_relative_values_run_in_the_engine_not_the_specification(scheme):
    # a value table used to go to the specification: the kernel now takes the call, forward
    # and backward, with rows that see no key among them (zeros, finite gradients)
    args, kwargs = _typical(scheme)
    assert len(args) == 5  # a value table
    mask = torch.ones(11, 13, dtype=torch.bool)
    mask[4] = False
    kwargs.update(mask=mask, causal=True, q_offset=-2)  # rows 0, 1 and 4 see no key
    got = KERNELS[scheme](*args, **kwargs)
    assert got is not NotImplemented and torch.all(got[:, [0, 1, 4]] == 0)
    _assert_close(got, _spec(scheme, args, kwargs))
    d_output = torch.randn(got.shape, generator=torch.Generator().manual_seed(6),
                           dtype=got.dtype)
    grads = VJP_KERNELS[scheme](*args, d_output=d_output, **kwargs)
    assert grads is not NotImplemented
    assert all(torch.isfinite(g).all() for g in grads.values())
    _assert_gradients_close(grads, _spec(scheme, args, {"d_output": d_output, **kwargs},
                                         vjp=True))


@pytest.mark.parametrize("where", ["v", "value_table", "key_table"])
def test_non_finite_values_behind_a_mask_go_to_the_specification(where):
    q, k, v, key_table, value_table = _typical("shaw")[0]
    mask = torch.ones(11, 13, dtype=torch.bool)
    mask[:, 12] = False  # key 12: masked for every query
    arrays = {"v": v.clone(), "value_table": value_table.clone(), "key_table": key_table.clone()}
    if where == "v":
        arrays["v"][:, 12] = float("nan")  # behind the mask: the specification keeps it out
    else:
        arrays[where][:, 0] = float("inf")
    args = [q, k, arrays["v"], arrays["key_table"], arrays["value_table"]]
    kwargs = {"mask": mask}
    assert KERNELS["shaw"](*args, **kwargs) is NotImplemented
    d_output = torch.ones(2, 11, 3, dtype=torch.float64)
    assert VJP_KERNELS["shaw"](*args, d_output=d_output, **kwargs) is NotImplemented
    got = rp.shaw_attention(*args, **kwargs)
    torch.testing.assert_close(got, _spec("shaw", args, kwargs), equal_nan=True)
    if where == "v":
        assert torch.isfinite(got).all()


def test_the_engine_holds_no_grid_of_scores(monkeypatch):
    # every temporary of a block comes from one arena per call, of a few blocks' size
    taken = []
    original = _torch_blocks.Arena.take

    def spy(self, *shape):
        taken.append(math.prod(shape))
        return original(self, *shape)

    monkeypatch.setattr(_torch_blocks.Arena, "take", spy)
    monkeypatch.setattr(_torch_plan, "BLOCK_BYTES", 2 * 64 * 256 * 8)  # 64 rows a block
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 256, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    table = torch.randn(9, 8, generator=gen, dtype=torch.float64)
    got = KERNELS["shaw"](q, k, v, table, table[:, :8])
    _assert_close(got, _spec("shaw", (q, k, v, table, table[:, :8]), {}))
    assert taken and max(taken) <= 2 * 64 * (256 + 2 * 64)  # a block's window at most


# -- the building blocks ----------------------------------------------------------------


def _pairs(r, width):
    return [(i, j) for i in range(r) for j in range(width)]


@settings(max_examples=60)
@given(r=st.integers(1, 6), width=st.integers(1, 8), data=st.data())
def test_block_layouts_follow_their_definitions(r, width, data):
    n = r + width - 1
    u_lo = data.draw(st.integers(0, n - 1))
    u_hi = data.draw(st.integers(u_lo + 1, n))
    gen = torch.Generator().manual_seed(r * 100 + width)
    block = torch.randn(2, r, width, generator=gen, dtype=torch.float64)
    arena = Arena(block, 0)
    inside = torch.zeros(r, width, dtype=torch.float64)
    for i, j in _pairs(r, width):
        inside[i, j] = float(u_lo <= i + j < u_hi)
    by_distance = torch.zeros(2, u_hi - u_lo, r, dtype=torch.float64)
    for i, j in _pairs(r, width):
        if u_lo <= i + j < u_hi:
            by_distance[:, i + j - u_lo, i] = block[:, i, j]
    assert torch.equal(laid_rows(block, u_lo, u_hi, arena), by_distance)
    assert torch.equal(laid_piece(block, u_lo, u_hi, arena), by_distance.mT)
    torch.testing.assert_close(region_sums(block, u_lo, u_hi), (block * inside).sum(-1))
    values = torch.randn(2, r, generator=gen, dtype=torch.float64)
    out = torch.zeros_like(block)
    add_constant(out, values, u_lo, u_hi)
    torch.testing.assert_close(out, values[..., None] * inside)
    rows = torch.randn(2, u_hi - u_lo, r, generator=gen, dtype=torch.float64)
    out = torch.zeros_like(block)
    add_rows(out, rows, u_lo, arena)
    want = torch.zeros_like(block)
    for i, j in _pairs(r, width):
        if u_lo <= i + j < u_hi:
            want[:, i, j] = rows[:, i + j - u_lo, i]
    torch.testing.assert_close(out, want)


@given(rows=st.lists(st.integers(-1, 3), min_size=1, max_size=12), data=st.data())
def test_runs_cover_the_rows_and_pieces_the_window(rows, data):
    runs = Runs.of(rows)
    covered = {}
    for lo, hi, summed, row in zip(runs.starts, runs.ends, runs.summed, runs.rows,
                                   strict=True):
        assert lo < hi
        if summed:
            assert hi - lo >= 2 and set(rows[lo:hi]) == {row}
        for c in range(lo, hi):
            covered[c] = rows[c] if not summed else row
    assert covered == {c: r for c, r in enumerate(rows) if r >= 0}
    n_all = len(rows)
    n = data.draw(st.integers(1, n_all))
    start = data.draw(st.integers(0, n_all - n))
    seen = set()
    for u_lo, u_hi, _, _ in pieces(runs, n_all, start, n):
        assert 0 <= u_lo < u_hi <= n
        seen |= set(range(u_lo, u_hi))
    window = {u for u in range(n) if rows[n_all - 1 - start - u] >= 0}
    assert seen == window
    assert piece_count(runs, n_all, start, n) == len(pieces(runs, n_all, start, n))
    # a key-side term's window read as one row only where every distance reads that row
    term = SimpleNamespace(runs=runs)
    one = {rows[n_all - 1 - start - u] for u in range(n)}
    got = _one_row(term, n_all, start, n)
    if len(one) == 1 and one != {-1}:  # (a lone distance: its run may be a stretch of singles)
        assert got == next(iter(one)) or (n == 1 and got is None)
    else:
        assert got is None


@pytest.mark.parametrize(("rows", "start", "n", "want"), [
    ([2, 2, 2, 1, 0], 2, 3, 2),  # window c = 0 .. 2: one clipped end, row 2
    ([-1, 2, 2], 0, 3, None),  # c = 0 reads no row: not every pair reads row 2
    ([2, 2, -1], 0, 3, None),
    ([2, 2, 1], 0, 3, None),
    ([0, 1, 2], 0, 2, None),  # distances of their own rows
])
def test_a_key_window_reads_one_row_only_where_every_distance_reads_it(rows, start, n, want):
    assert _one_row(SimpleNamespace(runs=Runs.of(rows)), len(rows), start, n) == want


def test_key_coordinates_by_structure():
    y = torch.arange(12) // 4  # grid rows of a 3 x 4 grid: runs of 4
    x = torch.arange(12) % 4  # its columns: period 4
    assert structure(y)[:2] == ("runs", 4) and structure(x)[:2] == ("period", 4)
    assert structure(y * 7 + x) is None  # Swin's coordinates: every key its own


def test_swin_reads_its_bias_as_a_window_of_one_2d_table():
    q = torch.randn(2, 12, 4, dtype=torch.float64)
    table = torch.randn(2, 35, dtype=torch.float64)
    form = lower("swin", q, q, q, table, window_height=3, window_width=4)
    assert [t.kind for t in _torch_plan.plan(form).terms] == ["grid_bias"]
    (term,) = form.biases
    found, rows = grid_table(torch.cat([table, table[:, :1] * 0], -1), term.index)
    assert found.shape == (2, 5, 7) and rows.shape == (5, 7)
    shuffled = term.index.key[torch.randperm(12, generator=torch.Generator().manual_seed(0))]
    assert grid_table(table, IndexMap(term.index.rows, term.index.low, shuffled, shuffled)) is None


@pytest.mark.parametrize("scheme", ["general", "grid2d", "swin", "deberta", "shaw"])
@pytest.mark.parametrize("limit", [0, 2**29])
def test_a_call_without_values_or_causal_structure_gives_sdpa_its_terms(scheme, limit,
                                                                         monkeypatch):
    # within TERMS_BYTES the engine makes the terms and SDPA takes them; past it, the engine
    from relpos_ref.kernels import _torch_sdpa
    from relpos_ref.kernels import torch as kernels_torch

    monkeypatch.setattr(_torch_sdpa, "TERMS_BYTES", limit)
    made, engine = [], []
    for name, seen in (("terms_attention", made), ("form_attention", engine)):
        inner = getattr(kernels_torch, name)
        monkeypatch.setattr(kernels_torch, name,
                            lambda *a, inner=inner, seen=seen, **kw: seen.append(1) or inner(*a,
                                                                                        **kw))
    args, kwargs = _typical(scheme)
    if scheme == "shaw":
        args = args[:4]  # the key table alone: no relative values
    kwargs = {n: x for n, x in kwargs.items() if n != "causal"}
    keep = torch.rand(args[0].shape[-2], args[1].shape[-2],
                      generator=torch.Generator().manual_seed(1)) > 0.3
    keep[0] = False  # a row with no allowed key: zeros
    for mask in (None, keep):
        got = KERNELS[scheme](*args, **kwargs, mask=mask)
        _assert_close(got, _spec(scheme, args, {**kwargs, "mask": mask}))
    assert (len(made), len(engine)) == ((2, 0) if limit else (0, 2))


def test_terms_attention_keeps_its_array_for_the_thread_s_next_call(monkeypatch):
    # two calls (different sizes) read one kept array and each equals the specification; an
    # array past KEPT_BYTES is not kept; another thread has its own
    import threading

    monkeypatch.setattr(_torch_blocks, "_KEPT", threading.local())
    args, kwargs = _typical("general")
    kwargs = {n: x for n, x in kwargs.items() if n != "causal"}
    first = KERNELS["general"](*args, **kwargs)
    kept = _torch_blocks._KEPT.arrays[0]
    short = [a[..., :7, :] if i == 0 else a for i, a in enumerate(args)]  # fewer queries
    second = KERNELS["general"](*short, **kwargs)
    assert _torch_blocks._KEPT.arrays[0] is kept  # reused, not replaced
    _assert_close(first, _spec("general", args, kwargs))
    _assert_close(second, _spec("general", short, kwargs))
    seen = []
    thread = threading.Thread(target=lambda: (KERNELS["general"](*args, **kwargs),
                                              seen.append(_torch_blocks._KEPT.arrays.get(0))))
    thread.start()
    thread.join()
    assert seen[0] is not None and seen[0] is not kept
    monkeypatch.setattr(_torch_blocks, "_KEPT", threading.local())
    monkeypatch.setattr(_torch_blocks, "KEPT_BYTES", 8)
    _assert_close(KERNELS["general"](*args, **kwargs), _spec("general", args, kwargs))
    assert not _torch_blocks._KEPT.__dict__.get("arrays")


@pytest.mark.parametrize("first", ["general", "forgetting", "fire"])
def test_a_kept_array_made_in_inference_mode_serves_the_calls_after_it(first, monkeypatch):
    # the thread's kept array is a normal tensor even when made under inference_mode, so
    # later calls outside that mode can write into it (an inference tensor could not be)
    import threading

    monkeypatch.setattr(_torch_blocks, "_KEPT", threading.local())
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 16, 8, generator=gen) for _ in range(3))
    tables = {"general": (torch.randn(31, 8, generator=gen),),
              "forgetting": (torch.randn(2, 16, generator=gen),),
              "fire": (torch.randn(4, 1, generator=gen), torch.randn(4, generator=gen),
                       torch.randn(2, 4, generator=gen))}
    with torch.inference_mode():
        KERNELS[first](q, k, v, *tables[first])
    assert not _torch_blocks._KEPT.arrays[0].is_inference()
    for scheme in ("general", "forgetting", "fire"):
        _assert_close(KERNELS[scheme](q, k, v, *tables[scheme]),
                      _spec(scheme, (q, k, v, *tables[scheme]), {}))
        got = VJP_KERNELS[scheme](q, k, v, *tables[scheme], d_output=torch.ones(2, 16, 8))
        _assert_gradients_close(got, _spec(scheme, (q, k, v, *tables[scheme]),
                                           {"d_output": torch.ones(2, 16, 8)}, vjp=True))
