"""FIRE's MLP (`relpos_ref.schemes.fire`): its tables' shapes, and its evaluation per pair.

``f_h(x) = w_2^(h) . relu(w_1 x + b_1) + b_2^(h)`` on every pair's input ``x``
``(t_q, t_k)``: the hidden layer is ``(H', t_q, t_k, m)``, so the output
alone (`mlp_output`) is computed a block of query rows at a time, at most
`HIDDEN_ENTRIES` hidden entries at once; the rows do not interact, so the
result is the same, bit for bit, as one evaluation.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from ._activations import relu

__all__ = ["HIDDEN_ENTRIES", "mlp_output", "mlp_vjp"]

#: The most hidden-layer entries `mlp_output` holds at once (2**22: 32 MiB in float64).
HIDDEN_ENTRIES = 2**22


def _check_mlp(w1: Any, b1: Any, w2: Any, b2: Any) -> int | None:
    # the MLP's shapes; the head count (None: no head axis on any table)
    ranks = {"w1": (1, 2, 3), "b1": (1, 2), "w2": (1, 2), "b2": (0, 1, 2)}
    named = {"w1": w1, "b1": b1, "w2": w2, **({} if b2 is None else {"b2": b2})}
    for name, x in named.items():
        if not hasattr(x, "shape") or x.ndim not in ranks[name]:
            msg = (f"`{name}` must be an array of {' or '.join(map(str, ranks[name]))} "
                   f"dimensions, got {getattr(x, 'shape', type(x).__name__)}")
            raise ValueError(msg)
    xp = _xp.array_namespace(*named.values())
    for name, x in named.items():
        _xp.check_floating(xp, name, x)
    m = w1.shape[0] if w1.ndim == 1 else w1.shape[-2]
    if m == 0:
        msg = ("the MLP needs at least one hidden unit (m >= 1), got `w1` of shape "
               f"{tuple(w1.shape)}")
        raise ValueError(msg)
    if (w1.ndim > 1 and w1.shape[-1] != 1) or b1.shape[-1] != m or w2.shape[-1] != m or (
            b2 is not None and b2.ndim == 2 and b2.shape[-1] != 1):
        shown = ", ".join(f"`{n}` {tuple(x.shape)}" for n, x in named.items())
        msg = ("the MLP needs `w1` (m, 1), `b1` (m,), `w2` (H, m) and `b2` (H,) (w1 (H, m, 1), "
               f"b1 (H, m), b2 (H, 1) for one MLP per head), got {shown}")
        raise ValueError(msg)
    heads = [x.shape[0] for x, r in ((w1, 3), (b1, 2), (w2, 2), (b2, 2))
             if x is not None and x.ndim == r]
    if b2 is not None and b2.ndim == 1 and b2.shape[0] != 1:
        heads.append(b2.shape[0])
    if len(set(heads) - {1}) > 1:
        msg = f"the head axes of `w1`, `b1`, `w2`, `b2` must agree, got {sorted(set(heads))}"
        raise ValueError(msg)
    return max(heads) if heads else None


def _tables(w1: Any, b1: Any, w2: Any, b2: Any) -> tuple[Any, Any, Any, Any]:
    # each with a head axis (1 or H): W1 (H1, m), B1 (H1', m), W2 (H2, m), B2 (H2',)
    xp = _xp.array_namespace(w1)
    if b2 is None:
        b2 = xp.zeros((), dtype=w1.dtype, device=_xp.device(w1))
    m = w1.shape[-2] if w1.ndim > 1 else w1.shape[0]
    w1 = xp.reshape(w1, (-1, m))
    b1 = xp.reshape(b1, (-1, m))
    w2 = xp.reshape(w2, (-1, m))
    b2 = xp.reshape(b2, (-1,))
    return w1, b1, w2, b2


def _mlp(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> tuple[Any, Any, Any]:
    # pre-activation (H', t_q, t_k, m), hidden layer, output (H, t_q, t_k)
    xp = _xp.array_namespace(x)
    w1, b1, w2, b2 = _tables(w1, b1, w2, b2)
    pre = x[None, :, :, None] * w1[:, None, None, :] + b1[:, None, None, :]
    hidden = relu(pre)  # no gradient at pre = 0 under autograd, as `mlp_vjp`'s pre > 0
    if hidden.shape[0] == 1:  # the paper's shared hidden layer: one product for every head
        out = xp.permute_dims(xp.matmul(hidden[0, ...], xp.matrix_transpose(w2)), (2, 0, 1))
    else:
        out = xp.sum(hidden * w2[:, None, None, :], axis=-1)
    return pre, hidden, out + b2[:, None, None]


def mlp_output(x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    """The MLP's output ``(H, t_q, t_k)`` at the inputs `x` ``(t_q, t_k)``, by blocks of rows.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.reshape(xp.arange(6.0), (2, 3)) / 4  # f(x) = relu(x - 1/2)
    >>> mlp_output(x, xp.ones((1, 1)), xp.asarray([-0.5]), xp.ones((1, 1)), None)
    Array([[[0.  , 0.  , 0.  ],
            [0.25, 0.5 , 0.75]]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x)
    rows = _block_rows(x, w1, b1, w2)
    if x.shape[0] <= rows:
        return _mlp(x, w1, b1, w2, b2)[2]
    t_q = x.shape[0]
    return xp.concat([_mlp(x[i:min(i + rows, t_q), :], w1, b1, w2, b2)[2]
                      for i in range(0, t_q, rows)], axis=-2)


def _block_rows(x: Any, w1: Any, b1: Any, w2: Any) -> int:
    # query rows per block: at most HIDDEN_ENTRIES entries of a (H, rows, t_k, m) array
    w1, b1, w2, _ = _tables(w1, b1, w2, None)
    heads = max(w1.shape[0], b1.shape[0], w2.shape[0])
    return max(1, HIDDEN_ENTRIES // max(1, x.shape[1] * w1.shape[-1] * heads))


def mlp_vjp(x: Any, d_out: Any, w1: Any, b1: Any, w2: Any) -> tuple[Any, Any, Any, Any]:
    """The MLP's VJP for the output's cotangent `d_out` ``(H, t_q, t_k)``, by blocks of rows.

    Returns ``(d_x, d_w1, d_b1, d_w2)``: ``d_x`` ``(t_q, t_k)`` and the tables'
    gradients ``(H, m)`` per output head (the caller sums them to the tables'
    shapes); no ``(H, t_q, t_k, m)`` array, `HIDDEN_ENTRIES` entries at a time.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[0.0, 1.0]])  # f(x) = relu(x - 1/2): slope 1 past 1/2
    >>> d_x, d_w1, d_b1, d_w2 = mlp_vjp(x, xp.ones((1, 1, 2)), xp.ones((1, 1)),
    ...                                 xp.asarray([-0.5]), xp.ones((1, 1)))
    >>> d_x  # the hidden unit is live at x = 1 only
    Array([[0., 1.]], dtype=array_api_strict.float64)
    >>> d_w2  # relu(1 - 1/2)
    Array([[0.5]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x, d_out)
    tw1, _, tw2, _ = _tables(w1, b1, w2, None)
    heads, m = d_out.shape[0], tw1.shape[-1]
    dev = _xp.device(x)
    zero = xp.zeros((), dtype=x.dtype, device=dev)
    d_w1, d_b1, d_w2 = (xp.zeros((heads, m), dtype=x.dtype, device=dev) for _ in range(3))
    d_x = []
    rows = _block_rows(x, w1, b1, w2)
    t_q = x.shape[0]
    for i in range(0, t_q, rows):
        xb, db = x[i:min(i + rows, t_q), :], d_out[:, i:min(i + rows, t_q), :]
        pre, hidden, _ = _mlp(xb, w1, b1, w2, None)
        n = xb.shape[0] * xb.shape[1]
        flat = xp.reshape(hidden, (hidden.shape[0], n, m))
        d_w2 = d_w2 + xp.matmul(xp.reshape(db, (heads, 1, n)), flat)[:, 0, :]
        d_pre = xp.where(pre > 0, db[..., None] * tw2[:, None, None, :], zero)  # (H, b, t_k, m)
        d_x.append(xp.sum(d_pre * tw1[:, None, None, :], axis=(0, -1)))
        d_w1 = d_w1 + xp.sum(d_pre * xb[None, :, :, None], axis=(-3, -2))
        d_b1 = d_b1 + xp.sum(d_pre, axis=(-3, -2))
    if not d_x:  # no query rows
        return xp.zeros(x.shape, dtype=x.dtype, device=dev), d_w1, d_b1, d_w2
    return xp.concat(d_x, axis=0), d_w1, d_b1, d_w2
