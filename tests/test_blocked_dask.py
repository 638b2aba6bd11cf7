"""`blocked_attention` over Dask arrays: one task per chunk of queries, equal to NumPy's.

The chunked evaluation (`relpos_ref._blocked_dask`) against the NumPy call
for every scheme, with random chunks on every axis, masks, causal and
``q_offset``; the same errors as NumPy; laziness and the shape of the graph;
and a small `dask.distributed` cluster of two worker processes with a memory
limit. Skipped, with the reason, where dask (or distributed) is missing.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_blocked import D, H, _case

from relpos_ref import backends
from relpos_ref.blocked import BLOCKED_SCHEMES, blocked_attention

_MISSING = backends.get("dask").unavailable_reason()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))

GRID = {"grid2d": {"height": 3, "width": 4}, "swin": {"window_height": 3, "window_width": 4},
        "swinv2": {"window_height": 3, "window_width": 4}}
MASKS = ("none", "pairs", "heads", "keys", "queries", "scalar", "vector")


def _chunks(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    """Random positive chunk sizes summing to `n` (``(0,)`` for 0)."""
    if n <= 1:
        return (n,)
    cuts = sorted(rng.choice(np.arange(1, n), size=rng.integers(0, min(n - 1, 4) + 1),
                             replace=False).tolist())
    return tuple(np.diff([0, *cuts, n]).tolist())


def _dask(rng: np.random.Generator, a: np.ndarray):
    """`a` as a Dask array with random chunks along every axis."""
    import dask.array as da

    return da.from_array(a, chunks=tuple(_chunks(rng, n) for n in a.shape))


def _mask(rng: np.random.Generator, kind: str, t_q: int, t_k: int) -> np.ndarray | None:
    shapes = {"pairs": (t_q, t_k), "heads": (H, t_q, t_k), "keys": (1, t_k),
              "queries": (t_q, 1), "scalar": (), "vector": (t_k,)}
    return None if kind == "none" else rng.random(shapes[kind]) < 0.7


def _grid_case(name: str, rng: np.random.Generator):
    if name == "grid2d":
        return (rng.standard_normal((H, 5, D)), rng.standard_normal((H, 7, D))), GRID[name]
    if name == "swinv2":  # the MLP: w1, b1 per head, w2 shared
        return (rng.standard_normal((H, 3, 2)), rng.standard_normal((H, 3)),
                rng.standard_normal(3)), GRID[name]
    return (rng.standard_normal((H, 5 * 7)),), GRID[name]


@pytest.mark.parametrize("name", BLOCKED_SCHEMES)
@settings(max_examples=max(4, settings.default.max_examples // 3))
@given(
    t_q=st.integers(0, 11), t_k=st.integers(1, 11), shift=st.integers(-3, 3),
    block=st.integers(1, 5), causal=st.booleans(), mask=st.sampled_from(MASKS),
    dtype=st.sampled_from(["float32", "float64"]), seed=st.integers(0, 999),
)
def test_chunked_equals_numpy(name, t_q, t_k, shift, block, causal, mask, dtype, seed):
    """Every scheme, random chunks on every axis: the NumPy call's result, lazily, chunked."""
    import dask
    import dask.array as da

    rng = np.random.default_rng(seed)
    q_offset = max(t_k - t_q, 0) + shift
    if name in GRID:
        t_q = t_k = 12
        tables, params = _grid_case(name, rng)
        q_offset = None
        causal = causal and name == "grid2d"  # swin attends within a window, never causally
    else:
        tables, params, _ = _case(name, rng, t_q, t_k)
    if name in ("music", "forgetting"):  # music's skew path; the forgetting bias is causal only
        causal = True
    q = rng.standard_normal((H, t_q, D)).astype(dtype)
    k, v = (rng.standard_normal((H, t_k, D)).astype(dtype) for _ in range(2))
    tables = tuple(t.astype(dtype) for t in tables)
    mask_np = _mask(rng, mask, t_q, t_k)
    kwargs = {"scheme": name, "block_size": block, "causal": causal, "q_offset": q_offset,
              **params}
    want = blocked_attention(q, k, v, *tables, mask=mask_np, **kwargs)
    q_d = _dask(rng, q)
    got = blocked_attention(q_d, _dask(rng, k), _dask(rng, v), *(_dask(rng, t) for t in tables),
                            mask=None if mask_np is None else _dask(rng, mask_np), **kwargs)
    assert isinstance(got, da.Array)
    assert got.chunks[-2] == q_d.chunks[-2] and got.dtype == want.dtype
    assert got.shape == want.shape
    tol = {"float32": 2e-5, "float64": 1e-12}[dtype]
    with dask.config.set(scheduler="sync"):
        np.testing.assert_allclose(got.compute(), want, rtol=tol, atol=tol)


def test_broadcast_batches_rope_and_float16():
    """Leading axes broadcast between q, k, v and mask; RoPE rotates each chunk at its rows."""
    import dask
    import dask.array as da

    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 37, D))
    k, v = rng.standard_normal((2, H, 29, D))
    mask = rng.random((3, 1, 37, 29)) < 0.8
    for scheme, params in (("plain", {}), ("rope", {"rotary_dim": 2, "layout": "interleaved"})):
        want = blocked_attention(q, k, v, mask=mask, block_size=4, q_offset=5, scheme=scheme,
                                 **params)
        got = blocked_attention(da.from_array(q, chunks=(1, 10, D)), da.from_array(k, chunks=7),
                                da.from_array(v, chunks=(1, 29, 2)),
                                mask=da.from_array(mask, chunks=(1, 1, 8, 5)), block_size=4,
                                q_offset=5, scheme=scheme, **params)
        assert got.shape == want.shape == (3, H, 37, D) and got.chunks[-2] == (10, 10, 10, 7)
        with dask.config.set(scheduler="sync"):
            np.testing.assert_allclose(got.compute(), want, rtol=1e-12, atol=1e-12)
    half = rng.standard_normal((H, 20, D)).astype(np.float16)
    got = blocked_attention(*(da.from_array(half, chunks=(1, 6, D)),) * 3, block_size=4)
    assert got.dtype == np.float16
    with dask.config.set(scheduler="sync"):
        np.testing.assert_array_equal(got.compute(), blocked_attention(half, half, half,
                                                                       block_size=4))


def _error(call):
    try:
        call()
    except (TypeError, ValueError) as error:
        return type(error), str(error)
    return None


@pytest.mark.parametrize("causal", [False, True])
def test_same_errors_as_numpy(causal):
    """Bad calls raise at the call, before any work, with NumPy's type and message."""
    import dask.array as da

    def z(*shape, dtype="float64"):
        return np.zeros(shape, dtype=dtype)

    q = z(9, 2)
    calls = [
        ((q, q, q), {"scheme": "nope"}),
        ((q, q, q, z(3, 2)), {"scheme": "shaw", "K": 1}),
        ((q, q, q), {"block_size": 0}),
        ((q, q, q, z(3), z(3)), {"scheme": "bias"}),
        ((q, q, q), {"scheme": "general"}),
        ((q, q, q, z(3, 2)), {"scheme": "general"}),
        ((q, z(9, 3), q), {}),
        ((q, q, z(9, 2, dtype="float32")), {}),
        ((q, q, q), {"mask": z(4, 9, dtype=bool)}),
        ((q, q, q), {"mask": z(9, 9)}),
        ((q, q, q, z(3, 2), z(5, 2)), {"scheme": "grid2d", "height": 2, "width": 3}),
        # the tiles' own checks: distances beyond the table under beyond="error"
        ((q, q, q, z(3, 2)), {"scheme": "shaw", "beyond": "error", "block_size": 2}),
        ((q, q, q, z(5, 2), z(5, 2)), {"scheme": "shaw", "beyond": "error", "block_size": 4,
                                       "q_offset": 1}),
        ((q, q, q, z(7)), {"scheme": "bias", "beyond": "error", "block_size": 3}),
        ((q, q, q, z(7)), {"scheme": "bias", "beyond": "error", "block_size": 3,
                           "q_offset": -2}),
        ((q, q, q, z(4, 2)), {"scheme": "music", "beyond": "error", "block_size": 2}),
        # ... and the value terms' (a value table shorter than the key table)
        ((q, q, q, z(9, 2), z(4, 2)), {"scheme": "music", "beyond": "error", "block_size": 2}),
    ]
    for arrays, kwargs in calls:
        kwargs = {"causal": causal, **kwargs}
        want = _error(lambda a=arrays, kw=kwargs: blocked_attention(*a, **kw))
        lazy = [da.from_array(a, chunks=2) for a in arrays]
        mask = kwargs.get("mask")
        if mask is not None:
            kwargs = {**kwargs, "mask": da.from_array(mask, chunks=3)}
        got = _error(lambda a=lazy, kw=kwargs: blocked_attention(*a, **kw))
        assert want is not None and got == want, (kwargs, got, want)


def test_lazy_one_task_per_chunk_and_no_gathers_through_dask_indices():
    """Nothing runs at the call; the graph has one attention task per chunk of queries."""
    import dask
    import dask.array as da

    runs = []

    def source(n):
        runs.append(n)
        return np.random.default_rng(n).standard_normal((1, 64, 8))

    q = da.concatenate([da.from_delayed(dask.delayed(source)(n), (1, 64, 8), dtype=float)
                        for n in range(4)], axis=1)
    table = da.from_array(np.ones((9, 8)), chunks=4)
    out = blocked_attention(q, q, q, table, table, scheme="shaw", block_size=16, causal=True)
    assert runs == []
    layers = out.__dask_graph__().layers
    assert len(layers[out.name]) == 4
    names = " ".join(str(key) for layer in layers.values() for key in layer)
    assert "slice_with_int_dask_array" not in names  # what killed the workers before
    with dask.config.set(scheduler="sync"):
        got = out.compute()
    q_np = q.compute()
    np.testing.assert_allclose(got, blocked_attention(q_np, q_np, q_np, np.ones((9, 8)),
                                                      np.ones((9, 8)), scheme="shaw",
                                                      block_size=16, causal=True), rtol=1e-12)


def _peak_rss() -> int | None:
    """This process's peak resident memory in bytes, Linux's ``VmHWM`` (``None`` elsewhere).

    Not ``getrusage``'s ``ru_maxrss``: a spawned worker inherits the peak of the
    process that forked it.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def test_distributed_workers_with_a_memory_limit():
    """T = 4096 on two worker processes of 384 MiB: completes, no worker lost, NumPy's result."""
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    import dask.array as da
    from distributed import Client, LocalCluster

    t, d, chunk = 4096, 64, 1024
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, t, d)).astype(np.float32) for _ in range(3))
    table = rng.standard_normal((33, d)).astype(np.float32)
    want = blocked_attention(q, k, v, table, table, scheme="shaw", causal=True)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      memory_limit="384MiB", dashboard_address=None) as cluster, \
            Client(cluster) as client:
        workers = set(client.scheduler_info()["workers"])
        lazy = [da.from_array(a, chunks=(1, chunk, d)) for a in (q, k, v)]
        t_d = da.from_array(table)
        out = blocked_attention(*lazy, t_d, t_d, scheme="shaw", causal=True)
        got = out.compute()
        assert set(client.scheduler_info()["workers"]) == workers  # none died, none restarted
        peaks = client.run(_peak_rss)
    if None not in peaks.values():
        assert max(peaks.values()) < 384 * 2**20, peaks
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_docstring_examples_run():
    """The private module's examples (it is not in test_docstrings: it imports dask)."""
    import importlib

    from _doctest import run_docstring_examples

    result = run_docstring_examples(importlib.import_module("relpos_ref._blocked_dask"))
    assert result.attempted > 0 and result.failed == 0
