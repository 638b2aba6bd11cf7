"""The backward pass of a distance form on the Triton kernels: gradients of its arrays.

`form_gradients` runs the forward kernel (keeping each row's log-sum-exp),
then the two backward kernels (`relpos_ref.kernels._triton_backward`), and
returns the output with the gradients of the form's own arrays: ``q'``,
``k'``, ``v`` and each gathered term (a bias read through its map, ALiBi's
row of distances, plain attention's dense terms, grid2d's ``q Aᵀ``), each
summed to that array's shape. The scheme's arguments' gradients follow from
these by the chain rule through the lowering, which
`relpos_ref.kernels.triton` leaves to torch's autograd, so that no kernel
re-derives a scheme: the lowering is array-API code, differentiable as it is.

Forms with window terms (query- or key-side terms by distance, relative
values: Shaw, Music, general, Transformer-XL, DeBERTa) are not covered
(`covers`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .. import _xp
from ..gradients import sum_to_shape
from ..lowering import DistanceForm
from ._triton_backward import attention_dkdv, attention_dq
from ._triton_forward import attention_forward
from ._triton_launch import (
    Launch,
    _gathered_tail,
    _leading,
    launch_forward,
    run,
    triton_cdiv,
)
from ._triton_tiling import _power_of_two, backward_tile_sizes

__all__ = ["Backward", "backward_arguments", "covers", "form_gradients"]

def covers(form: DistanceForm) -> bool:
    """Whether the backward kernels take the form: no window terms, at most two gathered ones."""
    return (not form.key_terms and not form.values
            and all(not t.index.by_distance for t in form.query_terms)
            and len(form.biases) + len(form.query_terms)
            + sum(a is not None for a in form.dense) <= 2)


class Backward(NamedTuple):
    """The two backward kernels' arguments and options, with the buffers they fill."""

    dq: tuple[tuple[int, int], list[Any], dict[str, Any]]
    dkdv: tuple[tuple[int, int], list[Any], dict[str, Any]]
    warps: int
    gradients: list[Any]  # dq', dk', dv, then one buffer per gathered term


def backward_arguments(form: DistanceForm, launch: Launch, d_output: Any) -> Backward:
    """The backward kernels' launches after the forward `launch` (made with ``store_lse``)."""
    call, xp = form.call, form.call.xp
    named = dict(zip(attention_forward.arg_names, launch.args, strict=False))
    batch, constants = launch.batch, launch.constants
    t_q, t_k, d, d_v = call.t_q, call.t_k, form.q.shape[-1], form.v.shape[-1]
    n_b, n_h = named["n_b"], named["n_h"]
    n_z = math.prod(batch)
    device = _xp.device(form.v)
    wide = xp.float64 if form.v.dtype == xp.float64 else xp.float32
    do5, sd = _leading(d_output, batch, (t_q, d_v), xp)
    delta = xp.reshape(xp.sum(xp.astype(do5, wide) * xp.astype(launch.out, wide), axis=-1),
                       (-1,))
    dq = xp.zeros((n_z, t_q, d), dtype=wide, device=device)
    dk = xp.zeros((n_z, t_k, d), dtype=wide, device=device)
    dv = xp.zeros((n_z, t_k, d_v), dtype=wide, device=device)
    extra: dict[str, Any] = {"DO": do5, "sda": sd[0], "sdb": sd[1], "sdh": sd[2], "sdm": sd[3],
                             "LSE": named["Lse"], "DELTA": delta, "DQ": dq, "DK": dk,
                             "DV_OUT": dv}
    rows_shared = []
    buffers = []
    for slot, (array, index) in enumerate(launch.gathered, start=1):
        # a row shared by the queries (a bias by distance, Swin's) has one row of gradients
        rows, cols = _gathered_tail(array, index, t_q, t_k)
        if index is not None and array.shape[-2] == 1:
            rows = 1
        buffer = xp.zeros((n_z // (n_b * n_h), n_b, n_h, rows, cols), dtype=wide, device=device)
        strides = (n_b * n_h * rows * cols, n_h * rows * cols, rows * cols,
                   0 if rows == 1 else cols, 1)
        extra.update({f"DG{slot}": buffer, **dict(zip(
            (f"e{slot}a", f"e{slot}b", f"e{slot}h", f"e{slot}m", f"e{slot}c"), strides,
            strict=True))})
        rows_shared.append(index is not None and index.by_distance and rows == 1)
        buffers.append(buffer)
    for slot in range(len(launch.gathered) + 1, 3):
        extra.update({f"DG{slot}": dq, f"e{slot}a": 0, f"e{slot}b": 0, f"e{slot}h": 0,
                      f"e{slot}m": 0, f"e{slot}c": 0})
        rows_shared.append(False)
    (bm, bn), (bm_keys, bn_keys), warps = backward_tile_sizes(form)
    values = {**named, **extra}
    shared = {n: constants[n] for n in ("D", "DV", "BD", "BDV", "CAUSAL", "HAS_MASK", "NG",
                                        "G1_COORDS", "G2_COORDS", "G_ENDS", "DOT", "PRECISION",
                                        "SPLIT", "Q_WIDE", "K_WIDE", "INTERPRET")}
    return Backward(
        ((triton_cdiv(t_q, bm), n_z),
         [values[n] for n in attention_dq.arg_names if n not in _CONSTANT_NAMES],
         {**shared, "BM": bm, "BN": bn, "BW": _power_of_two(bm + bn - 1),
          "G1_ROW": rows_shared[0], "G2_ROW": rows_shared[1]}),
        ((triton_cdiv(t_k, bn_keys), n_z),
         [values[n] for n in attention_dkdv.arg_names if n not in _CONSTANT_NAMES],
         {**shared, "BM": bm_keys, "BN": bn_keys}),
        warps, [dq, dk, dv, *buffers])


def form_gradients(form: DistanceForm, d_output: Any, kernel: Any, *, interpret: bool,
                   precision: str) -> tuple[Any, list[Any], list[Any]]:
    """``(out, arrays, gradients)``: the output, and each of the form's arrays with its gradient.

    `arrays` are ``q'``, ``k'``, ``v`` and the gathered terms' arrays (as
    the launch built them, so that autograd reaches the call's arguments
    from them); `gradients` are the same shapes, in float32 (float64 for a
    float64 call).
    """
    xp = form.call.xp
    out, launch = launch_forward(form, kernel, interpret=interpret, precision=precision,
                                 store_lse=True)
    backward = backward_arguments(form, launch, d_output)
    for kernel_of, (grid, args, constants) in ((attention_dq, backward.dq),
                                               (attention_dkdv, backward.dkdv)):
        run(kernel_of, grid, args, constants, backward.warps, form.v)
    arrays = [form.q, form.k, form.v, *(a for a, _ in launch.gathered)]
    gradients = []
    for found, array in zip(backward.gradients, arrays, strict=True):
        full = xp.reshape(found, (*launch.batch, *found.shape[-2:]))
        gradients.append(sum_to_shape(full, tuple(array.shape)))
    return out, arrays, gradients


_CONSTANT_NAMES = frozenset({
    "D", "DV", "BD", "BDV", "BM", "BN", "BW", "CAUSAL", "HAS_MASK", "NG", "G1_COORDS",
    "G2_COORDS", "G_ENDS", "G1_ROW", "G2_ROW", "DOT", "PRECISION", "SPLIT", "Q_WIDE", "K_WIDE",
    "INTERPRET",
})


