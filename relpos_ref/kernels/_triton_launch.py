"""A distance form's arrays as the Triton kernel's arguments, and the launch.

`launch_forward` takes a `relpos_ref.lowering.DistanceForm` whose arrays are
torch tensors (CUDA, or CPU for Triton's interpreter) or CuPy arrays, and
returns the output in the library and on the device of ``v``. Every operand
is passed as a pointer with its strides, leading axes broadcast by strides of
zero, flattened to three batch axes ``(a, b, h)`` (heads last, as tables read
them). A form with terms outside the kernel's slots (`fits`) is not
launched.

CuPy arrays launch through a small pointer object (``data_ptr()`` and a
``dtype``), on CuPy's current stream and device: no torch at run time.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

from .. import _xp
from ..lowering import DistanceForm, bias_by_difference
from ._triton_tiling import _itemsize, _power_of_two, tile_sizes

__all__ = ["Launch", "fits", "forward_arguments", "launch_forward", "run"]

#: Largest feature widths the kernel takes (padded to a power of two, at least 16).
MAX_WIDTH = 256

#: The operand widths (bytes) whose calls read one entry per query in a tile wholly past the
#: ends of the gathered terms' maps (``G_ENDS``). 16-bit only: built for sm_90 (triton 3.6
#: and 3.9), the float32 variants, at 255 registers a thread already, spill with the branch
#: (100 to 1404 bytes), and the 16-bit ones do not.
ENDS_ITEMSIZES = frozenset({2})

_STREAM_LOCK = threading.Lock()


#: Software-pipelining stages of the key loop; ``None``: Triton's default for the GPU, or
#: fewer where a build does not fit the device (`STAGE_CHOICES`). Set, it is the only choice.
STAGES: int | None = None

#: The stages a launch tries, in order, while the device refuses a build for its shared
#: memory (triton's ``OutOfResources``): Triton's default (3 on Hopper), then 2, then 1.
#: Built for sm_90 through the JIT, the masked float32 bias variant (128 x 64 tiles) takes
#: 245760 bytes at the default (triton 3.9), past an H100's 232448; 172032 at 2.
STAGE_CHOICES: tuple[int | None, ...] = (None, 2, 1)

#: The choice that launched, per kernel, options and device: later calls start from it.
_FITTING: dict[tuple[Any, ...], int | None] = {}

#: The build failure of a kernel, options and device that triton could not build (see
#: `build_failure`): a later call raises it again at once instead of compiling again (triton
#: caches only builds that succeed; with triton 3.6 every float64 variant failed, each call
#: compiling it again). Its alignment marks are not in the key: a variant that failed
#: under one alignment is not tried under another, which costs speed, never a result.
_FAILED_BUILDS: dict[tuple[Any, ...], BaseException] = {}


def build_failure(exc: BaseException) -> bool:
    """Whether `exc` says triton could not build a variant for the GPU (a compiler pass
    failed, or the variant needs more shared memory than the GPU has): not the call's fault."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    return isinstance(exc, (CompilationError, OutOfResources)) or "PassManager" in str(exc)


def fits(form: DistanceForm) -> bool:
    """Whether the kernel's slots hold the form (every catalog scheme's form does)."""
    gathered = _gathered_terms(form)
    window_q = [t for t in form.query_terms if t.index.by_distance]
    return (len(window_q) <= 1 and len(form.key_terms) <= 1 and len(form.values) <= 1
            and all(t.index.by_distance for t in (*form.key_terms, *form.values))
            and len(gathered) <= 2
            and form.q.shape[-1] <= MAX_WIDTH and form.v.shape[-1] <= MAX_WIDTH)


def _gathered_terms(form: DistanceForm) -> list[tuple[Any, Any]]:
    """The slots read after scaling: ``(array (..., t_q or 1, n), index or None)``.

    A bias becomes one row per difference (its table read through its map);
    a query-side term whose map is not by distance (grid2d) becomes
    ``q A^T``, times the scale; plain attention's dense terms are read at the
    key's position. Float32 (float64 for a float64 call), the softmax's dtype.
    """
    xp, call = form.call.xp, form.call
    wide = xp.float64 if form.v.dtype == xp.float64 else xp.float32
    found = []
    for term in form.biases:
        found.append((bias_by_difference(term)[..., None, :], term.index, False))
    for term in form.query_terms:
        if not term.index.by_distance:
            side = xp.matmul(xp.astype(term.vectors, wide),
                             xp.matrix_transpose(xp.astype(term.table, wide)))
            rows = term.index.rows  # coordinate maps of the catalog are the identity
            found.append((xp.take(side, rows, axis=-1), term.index, True))
    position, bias = form.dense
    for dense, scaled in ((position, True), (bias, False)):
        if dense is not None:
            found.append((dense, None, scaled))
    return [(xp.astype(a, wide) * call.scale if scaled else xp.astype(a, wide), index)
            for a, index, scaled in found]


def _strides(x: Any) -> tuple[int, ...]:
    if _xp.library_name(x) == "torch":
        return tuple(x.stride())
    return tuple(s // x.itemsize for s in x.strides)


def _unit_last(xp: Any, x: Any) -> Any:
    # the kernel reads a row's features contiguously
    return x if x.ndim == 0 or x.shape[-1] <= 1 or _strides(x)[-1] == 1 else xp.asarray(
        x, copy=True)


def _leading(x: Any, batch: tuple[int, ...], tail: tuple[int, int],
             xp: Any) -> tuple[Any, tuple[int, ...]]:
    """`x` broadcast to ``(*batch, *tail)`` as ``(a, b, h, *tail)``; its strides.

    Broadcast axes (leading, or a bias row shared by every query) get a
    stride of zero: nothing is copied unless more than three leading axes
    must be merged.
    """
    x = _unit_last(xp, x)
    shape = (*batch, *tail)
    x = xp.broadcast_to(x, shape) if tuple(x.shape) != shape else x
    if len(batch) > 3:
        x = xp.reshape(x, (math.prod(batch[:-2]), *shape[-4:]))
    while x.ndim < 5:
        x = x[None, ...]
    return x, _strides(x)


def _table(xp: Any, table: Any) -> tuple[Any, int, int]:
    """A table ``(m, w)`` or ``(h, m, w)``, its head stride (0 when shared) and row stride."""
    table = _unit_last(xp, table)
    strides = _strides(table)
    per_head = table.ndim == 3 and table.shape[0] != 1
    return table, strides[0] if per_head else 0, strides[-2]


class _Pointer:
    """A CuPy array as Triton takes it: ``data_ptr()`` and a ``dtype`` (no torch needed)."""

    def __init__(self, array: Any) -> None:
        self.array = array  # kept alive for the launch
        self.dtype = array.dtype

    def data_ptr(self) -> int:
        return int(self.array.data.ptr)


def _arg(x: Any) -> Any:
    return _Pointer(x) if _xp.library_name(x) == "cupy" else x


@contextlib.contextmanager
def _on_device_of(v: Any) -> Iterator[None]:
    """CuPy's current device and stream (Triton's launcher reads the stream from its driver)."""
    if _xp.library_name(v) != "cupy":
        if getattr(v, "is_cuda", False):
            import torch

            with torch.cuda.device(v.device):
                yield
        else:
            yield
        return
    import cupy
    from triton.runtime import driver

    with cupy.cuda.Device(v.device.id), _STREAM_LOCK:
        active = driver.active
        stream = cupy.cuda.get_current_stream().ptr
        before = active.get_current_stream
        active.get_current_stream = lambda device=None: stream
        try:
            yield
        finally:
            active.get_current_stream = before


class Launch(NamedTuple):
    """The kernel's positional arguments, its ``constexpr`` options and grid, and the output."""

    args: list[Any]
    constants: dict[str, Any]
    grid: tuple[int, int]
    warps: int
    out: Any
    shape: tuple[int, ...]
    batch: tuple[int, ...] = ()
    gathered: tuple[Any, ...] = ()


def launch_forward(form: DistanceForm, kernel: Any, *, interpret: bool, precision: str,
                   store_lse: bool = False) -> Any:
    """Run the fused forward kernel on a form that `fits`; the output ``(*batch, t_q, d_v)``.

    With `store_lse`, the `Launch` too (its arguments hold each row's
    log-sum-exp, for `relpos_ref.kernels._triton_vjp`).
    """
    launch = forward_arguments(form, interpret=interpret, precision=precision,
                               store_lse=store_lse)
    run(kernel, launch.grid, launch.args, launch.constants, launch.warps, form.v)
    out = form.call.xp.reshape(launch.out, launch.shape)
    return (out, launch) if store_lse else out


def run(kernel: Any, grid: tuple[int, int], args: list[Any], constants: dict[str, Any],
        warps: int, like: Any) -> None:
    """Launch `kernel` on the device (and CuPy's stream) of `like`.

    At Triton's default pipeline stages, or the first of `STAGE_CHOICES` whose
    build the device takes (remembered for the same kernel, options and device).
    A variant triton could not build raises its failure again at once (`_FAILED_BUILDS`).
    """
    from triton.runtime.errors import OutOfResources

    # the options in `forward_arguments`' order, which is the same for a variant each time
    key = (getattr(kernel, "fn", kernel), tuple(constants.items()), warps,
           str(getattr(like, "device", "")))
    if STAGES is None and key in _FAILED_BUILDS:
        raise _FAILED_BUILDS[key].with_traceback(None)
    # from the choice that launched last (a call of other alignments may need fewer still)
    choices = ((STAGES,) if STAGES is not None else
               STAGE_CHOICES[STAGE_CHOICES.index(_FITTING.get(key, STAGE_CHOICES[0])):])
    arguments = [_arg(a) for a in args]
    with _on_device_of(like):
        for n, stages in enumerate(choices):
            options = {} if stages is None else {"num_stages": stages}
            try:
                kernel[grid](*arguments, **constants, num_warps=warps, **options)
            except Exception as exc:
                if isinstance(exc, OutOfResources) and n < len(choices) - 1:
                    continue
                if STAGES is None and build_failure(exc):
                    _FAILED_BUILDS[key] = exc
                raise
            if STAGES is None:  # a choice forced by STAGES is not one of STAGE_CHOICES
                _FITTING[key] = stages
            return


def forward_arguments(form: DistanceForm, *, interpret: bool = False,
                      precision: str = "tf32x3", store_lse: bool = False) -> Launch:
    """The arguments of the forward kernel for a form that `fits` (the output allocated)."""
    import triton.language as tl

    call, xp = form.call, form.call.xp
    q, k, v = form.q, form.k, form.v
    dtype = v.dtype
    device = _xp.device(v)
    gathered = _gathered_terms(form)
    lead = [q.shape[:-2], k.shape[:-2], v.shape[:-2]]
    lead += [a.shape[:-2] for a, _ in gathered]
    lead += [t.vectors.shape[:-2] for t in (*form.query_terms, *form.key_terms)]
    lead += [t.table.shape[:-2] for t in (*form.query_terms, *form.key_terms, *form.values)]
    if form.mask is not None:
        lead.append(form.mask.shape[:-2])
    batch = tuple(_broadcast(lead))
    if not batch:
        batch = (1,)
    n_b, n_h = (batch[-2] if len(batch) >= 2 else 1), batch[-1]
    n_z = math.prod(batch)
    t_q, t_k, d, d_v = call.t_q, call.t_k, q.shape[-1], v.shape[-1]
    (qa, sq), (ka, sk), (va, sv) = (_leading(x, batch, tuple(x.shape[-2:]), xp)
                                    for x in (q, k, v))
    # for the backward pass the output stays in the softmax's dtype (its rows' sums with the
    # cotangent are the specification's, not those of a 16-bit rounding of it)
    wide = xp.float64 if dtype == xp.float64 else xp.float32
    out = xp.empty((n_z // (n_b * n_h), n_b, n_h, t_q, d_v), dtype=wide if store_lse else dtype,
                   device=device)
    so = _strides(out)
    n_diff = t_q + t_k - 1
    window_q = [t for t in form.query_terms if t.index.by_distance]
    dummy_int = xp.zeros((1,), dtype=xp.int32, device=device)
    dummy = xp.zeros((1,), dtype=xp.float32, device=device)
    window_maps = [t.index.rows for t in (*window_q, *form.key_terms, *form.values)]
    # the gathered terms by distance: each its own ends (one read back for every map), read
    # only for the widths that use them (`ENDS_ITEMSIZES`)
    reads_ends = [index is not None and index.by_distance
                  and _itemsize(form.v) in ENDS_ITEMSIZES for _, index in gathered]
    ends = _constant_ends(xp, [*window_maps, *(index.rows for (_, index), d
                                                in zip(gathered, reads_ends, strict=True)
                                                if d)], n_diff)
    window_ends, gathered_ends = ends[:len(window_maps)], ends[len(window_maps):][:2]
    c_lo = min((lo for lo, _ in window_ends), default=-1)
    c_hi = max((hi for _, hi in window_ends), default=n_diff)
    lse = xp.empty((n_z * t_q,), dtype=wide, device=device) if store_lse else dummy
    args: list[Any] = [qa, ka, va, out, lse, *sq[:4], *sk[:4], *sv[:4], *so[:4],
                       n_b, n_h, t_q, t_k, call.q_offset, float(call.scale), n_diff, c_lo, c_hi]
    if form.mask is not None:
        mask = xp.astype(form.mask, xp.uint8)
        ma, sm = _leading(mask, batch, (t_q, t_k), xp)
        args += [ma, *sm]
    else:
        args += [dummy_int, 0, 0, 0, 0, 0]
    for terms in (window_q, form.key_terms):
        if terms:
            (term,) = terms
            side, sw = _leading(term.vectors, batch, tuple(term.vectors.shape[-2:]), xp)
            args += [side, *sw[:4], *_table(xp, term.table),
                     xp.astype(term.index.rows, xp.int32)]
        else:
            args += [qa, 0, 0, 0, 0, qa, 0, 0, dummy_int]
    if form.values:
        (term,) = form.values
        args += [*_table(xp, term.table), xp.astype(term.index.rows, xp.int32)]
    else:
        args += [va, 0, 0, dummy_int]
    coords = []
    for slot in range(2):
        if slot < len(gathered):
            array, index = gathered[slot]
            # a dense term broadcasts to every pair, a row of differences to every query
            ga, sg = _leading(array, batch, _gathered_tail(array, index, t_q, t_k), xp)
            by_coordinates = index is None or not index.by_distance
            if index is None:  # dense: [i, j], the key's position
                zero = xp.zeros((t_q,), dtype=xp.int32, device=device)
                qc, kc, low = zero, xp.arange(t_k, dtype=xp.int32, device=device), 0
            elif by_coordinates:
                qc, kc, low = (xp.astype(index.query, xp.int32),
                               xp.astype(index.key, xp.int32), index.low)
            else:
                qc, kc, low = dummy_int, dummy_int, 0
            args += [ga, *sg[:4], sg[-1], qc, kc, low]
            coords.append(by_coordinates)
        else:
            args += [qa, 0, 0, 0, 0, 0, dummy_int, dummy_int, 0]
            coords.append(False)
    # where every gathered term is by distance, the ends they all share (the narrowest): a
    # tile wholly past either reads one entry per query (G_ENDS)
    glo, ghi = -1, n_diff
    if gathered and all(reads_ends[:2]):
        glo = min(lo for lo, _ in gathered_ends)
        ghi = max(hi for _, hi in gathered_ends)
    g_ends = glo > 0 or ghi < n_diff - 1
    args += [glo, ghi]
    bm, bn, bw, warps = tile_sizes(form)
    dot = {"float16": tl.float16, "bfloat16": tl.bfloat16, "float32": tl.float32,
           "float64": tl.float64}[str(dtype).rsplit(".", 1)[-1]]
    sixteen = dot in (tl.float16, tl.bfloat16)
    constants = dict(
        D=d, DV=d_v, BD=_power_of_two(d), BDV=_power_of_two(d_v), BM=bm, BN=bn, BW=bw,
        CAUSAL=bool(call.causal), HAS_MASK=form.mask is not None, HAS_QW=bool(window_q),
        HAS_KW=bool(form.key_terms), HAS_VW=bool(form.values), NG=len(gathered),
        G1_COORDS=coords[0], G2_COORDS=coords[1], G_ENDS=g_ends, DOT=dot,
        PRECISION="ieee" if dot in (tl.float64, tl.float16, tl.bfloat16) else precision,
        SPLIT=sixteen, INTERPRET=interpret, STORE_LSE=store_lse,
        Q_WIDE=sixteen and _wide(xp, q), K_WIDE=sixteen and _wide(xp, k),
        QW_WIDE=sixteen and bool(window_q) and _wide(xp, window_q[0].vectors),
        TQ_WIDE=sixteen and bool(window_q) and _wide(xp, window_q[0].table),
        TK_WIDE=sixteen and bool(form.key_terms) and _wide(xp, form.key_terms[0].table),
    )
    shape = (*batch, t_q, d_v) if batch != (1,) or q.ndim > 2 else (t_q, d_v)
    return Launch(args, constants, (triton_cdiv(t_q, bm), n_z), warps, out, shape, batch,
                  tuple(gathered))


def _constant_ends(xp: Any, maps: list[Any], n: int) -> list[tuple[int, int]]:
    """``(lo, hi)`` of each map: its row is its first for ``c <= lo``, its last for ``c >= hi``.

    One read back of two integers a map; ``[]`` for no map. A map whose rows
    all differ has ``(0, n - 1)``; one row throughout, ``(n - 1, 0)``.
    """
    if not maps:
        return []
    ends = []
    for rows in maps:
        ones = xp.ones((n,), dtype=xp.int32, device=_xp.device(rows))
        position = xp.cumulative_sum(ones)  # 1 .. n
        first = xp.astype(rows == rows[0], xp.int32)
        last = xp.astype(xp.flip(rows) == rows[-1], xp.int32)
        # the length of the leading run: where the running count still equals the position
        ends.append(xp.stack([xp.sum(xp.astype(xp.cumulative_sum(first) == position, xp.int32)),
                              xp.sum(xp.astype(xp.cumulative_sum(last) == position, xp.int32))]))
    return [(lead - 1, n - trail) for lead, trail in xp.stack(ends).tolist()]


def _gathered_tail(array: Any, index: Any, t_q: int, t_k: int) -> tuple[int, int]:
    """The last two axes a gathered term is read with: ``(t_q, t_k)`` dense, ``(t_q, n)`` else."""
    return (t_q, t_k) if index is None else (t_q, array.shape[-1])


def _wide(xp: Any, x: Any) -> bool:
    # a float32 operand (the lowering computed it) of a 16-bit call
    return x.dtype == xp.float32


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    # the broadcast of leading shapes (the checks already refused what does not broadcast)
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for axis, n in enumerate(shape, start=ndim - len(shape)):
            if n != 1:
                out[axis] = n
    return tuple(out)
