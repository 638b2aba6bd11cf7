r"""FIRE: Functional Interpolation for Relative Positions (Li et al. 2023).

A query at position :math:`p_i = i + q_\text{offset}` sees key ``j`` (at
position ``j``) with the bias, per head ``h``,

.. math:: b_{hij} = f_h\!\left(\frac{\psi(|p_i - j|)}{\psi(\max(|L|, p_i)) + \epsilon}\right),
          \qquad \psi(x) = \log(|c\, x| + 1)

added after scaling: :math:`\text{logits}_{ij} = s\, q_i\cdot k_j + b_{hij}`.
:math:`f_h(x) = w_2^{(h)} \cdot \operatorname{relu}(w_1 x + b_1) + b_2^{(h)}` is
a small MLP (``Linear(1, m)``, ReLU, ``Linear(m, H)``: one output per head),
and ``c`` (the log transform's scale) and ``L`` (the normaliser's threshold)
are learned scalars. The paper's initial values are ``c = 0.1`` and
``L = 512`` (the defaults here).

Conventions:

- The bias depends on the **absolute query position** :math:`p_i`, through
  the normaliser :math:`\psi(\max(|L|, p_i))`, not only on the distance: it is
  not a function of :math:`r = j - p_i` alone (so it lowers through the dense
  bias). :math:`p_i = i + q_\text{offset}` is the position of every other
  scheme: decoding against a cache (``q_offset = t_k - t_q``, the default)
  gives the rows of the full causal call, because query ``i`` is normalised
  by its own position, not its index in the call.
- Causal by default (the paper's decoder setting). ``causal=False`` keeps the
  same formula for keys after the query: :math:`\psi(|p_i - j|)` takes the
  absolute distance (as the reference code does, ``abs`` inside the log), so
  a future key at distance ``d`` reads the same input as a past one; its
  normaliser is still the query's, and the input may exceed 1 there.
- ``c`` and ``L`` enter through their absolute values, as in the reference
  code (``log(abs(c * x) + 1)``, ``abs(L_multiplier * init_L)``): the
  reference's learned ``L_multiplier`` times its fixed ``init_L`` is ``L``.
- ``eps`` (default ``1e-6``, the reference's) is added to the normaliser
  after the log: the input is :math:`\psi(|p_i - j|) / (\psi(\max(|L|,
  p_i)) + \epsilon)`, finite even when :math:`\max(|L|, p_i) = 0`.
- A negative :math:`p_i` (``q_offset < 0``) is normalised by :math:`|L|`.
- Gradients (`fire_attention_vjp`): ``c`` through both logs
  (:math:`\partial |c| / \partial c = \operatorname{sign}(c)`, 0 at ``c = 0``
  as ``torch.abs``'s); ``L`` only through :math:`\max(|L|, p_i)`, so only
  rows with :math:`|L| > p_i` carry it, and a tie :math:`|L| = p_i` carries
  half (``torch.maximum``'s rule, the reference's ``torch.max``); the ReLU
  passes none at 0 (``torch.relu``'s rule, the reference's), under autograd
  through `fire_attention` too.

Numerics: the input is formed in float64 where the device has it (the
positions exact up to ``2**53``), and rounded once to the call's dtype
before the MLP, which runs in the call's dtype (float32 for 16-bit calls).

The MLP's tables, as Swin v2's: ``w1 (m, 1)`` (or ``(m,)``), ``b1 (m,)``,
``w2 (H, m)`` (or ``(m,)``, one output shared), each with an optional head
axis first (``w1 (H, m, 1)``, ``b1 (H, m)``: one MLP per head). The output
layer's bias ``b2`` (``(H,)``, ``()`` or ``(1,)``; ``(H, 1)`` per head) is a
keyword, default none: it adds one constant to every logit of a head's row,
which softmax takes away, so it is in the bias (`fire_bias`) but never in
the weights or the output, and its gradient is exactly 0.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import as_float, as_int, nonnegative_int
from ..attention import attention
from ..calls import Call, Defaults, computes_in_float32, resolve_call
from ..gradients import check_d_output, core_vjp, forward, sum_to_shape
from ._fire_inputs import (
    _check_eps,
    _check_scalar,
    _like,
    _parameter_gradients,
    _parts,
    _wide,
)
from ._fire_mlp import _check_mlp, _tables, mlp_output, mlp_vjp

__all__ = [
    "DEFAULTS",
    "EPS",
    "TABLES",
    "fire_attention",
    "fire_attention_vjp",
    "fire_bias",
    "fire_call",
    "fire_inputs",
    "fire_tile",
]

#: FIRE's defaults: ``scale = 1/sqrt(d)``, causal, end-aligned queries.
DEFAULTS = Defaults(causal=True, q_offset="end")

#: The reference code's ``eps``, added to the normaliser after its log.
EPS = 1e-6

#: The MLP's tables, in the order `fire_attention` takes them.
TABLES = ("w1", "b1", "w2")


def fire_inputs(
    t_q: int, t_k: int, /, *, c: Any = 0.1, L: Any = 512.0, eps: float = EPS, q_offset: int = 0,
    xp: Any, dtype: Any = None, device: Any = None,
) -> Any:
    r"""The MLP's input :math:`\psi(|p_i - j|) / (\psi(\max(|L|, p_i)) + \epsilon)` of each pair.

    Parameters
    ----------
    t_q, t_k : int
        Queries and keys.
    c, L : float or floating array of shape ``()``, optional
        The log transform's scale and the normaliser's threshold (0.1 and 512).
    eps : float, optional
        Added to the normaliser after its log (the reference's ``1e-6``).
    q_offset : int, optional
        Position of query 0 (0 here, the first queries).
    xp : namespace
    dtype, device : optional
        Of the result (default: `c`'s or `L`'s where an array, else the
        default floating dtype and device).
        Computed in float64 where the device has it, rounded once.

    Returns
    -------
    array, shape ``(t_q, t_k)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = fire_inputs(3, 3, c=1.0, L=1.0, eps=0.0, xp=xp)
    >>> x  # row 2: log(1 + |2 - j|) / log(1 + max(1, 2)) = log(3) / log(3), log 2 / log 3, 0
    Array([[0.        , 1.        , 1.5849625 ],
           [1.        , 0.        , 1.        ],
           [1.        , 0.63092975, 0.        ]], dtype=array_api_strict.float64)
    """
    t_q = nonnegative_int("t_q", t_q)
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    _check_scalar("c", c)
    _check_scalar("L", L)
    eps = as_float("eps", eps)
    xp = _xp.check_namespace(xp)
    given = [x for x in (c, L) if hasattr(x, "dtype")]
    if device is None and given:
        device = _xp.device(given[0])
    if dtype is None:
        dtype = given[0].dtype if given else xp.asarray(0.0, device=device).dtype
    wide = _wide(xp, dtype, device, t_q, t_k, q_offset)
    return xp.astype(_parts(xp, t_q, t_k, c, L, eps, q_offset, wide, device)["x"], dtype)


def fire_tile(
    w1: Any, b1: Any, w2: Any, /, t_q: int, t_k: int, *, b2: Any = None, c: Any, L: Any,
    eps: float, q_offset: int, j0: int = 0,
) -> Any:
    """The bias of a tile: queries at ``q_offset ..``, keys ``j0 .. j0 + t_k - 1`` (unchecked).

    For the blocked evaluation (`relpos_ref.blocked`); in `w1`'s dtype,
    ``(H, t_q, t_k)`` where a table has a head axis.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> w1, b1, w2 = xp.ones((1, 1)), xp.zeros(1), xp.ones((1, 1))
    >>> fire_tile(w1, b1, w2, 1, 2, c=1.0, L=1.0, eps=0.0, q_offset=2, j0=1)  # keys 1, 2
    Array([[[0.63092975, 0.        ]]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(w1, b1, w2)
    dev = _xp.device(w1)
    wide = _wide(xp, w1.dtype, dev, t_q, t_k + j0, q_offset)
    x = _parts(xp, t_q, t_k, c, L, eps, q_offset, wide, dev, j0)["x"]
    out = mlp_output(xp.astype(x, w1.dtype), w1, b1, w2, b2)
    return out if _check_mlp(w1, b1, w2, b2) is not None else out[0, ...]


def fire_bias(
    w1: Any, b1: Any, w2: Any, /, t_q: int, t_k: int, *, b2: Any = None, c: Any = 0.1,
    L: Any = 512.0, eps: float = EPS, q_offset: int = 0,
) -> Any:
    r"""FIRE's bias :math:`f_h(\psi(|p_i - j|) / (\psi(\max(|L|, p_i)) + \epsilon))`.

    Parameters
    ----------
    w1, b1, w2 : floating arrays
        The MLP: ``Linear(1, m)``'s weight ``(m, 1)`` and bias ``(m,)``,
        ``Linear(m, H)``'s weight ``(H, m)`` (see the module).
    t_q, t_k : int
    b2 : floating array, optional
        ``Linear(m, H)``'s bias ``(H,)``; default none (0).
    c, L, eps, q_offset
        As in `fire_inputs`.

    Returns
    -------
    array, shape ``(t_q, t_k)``, or ``(H, t_q, t_k)`` where a table has a head axis
        In `w1`'s dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> w1, b1 = xp.ones((1, 1)), xp.zeros(1)  # f(x) = 2 relu(x) - 1, for two heads
    >>> w2, b2 = xp.asarray([[2.0], [-2.0]]), xp.asarray([-1.0, 1.0])
    >>> b = fire_bias(w1, b1, w2, 1, 3, b2=b2, c=1.0, L=1.0, eps=0.0, q_offset=2)
    >>> b.shape, b[:, 0, :]  # x = log 3 / log 3, log 2 / log 3, 0 for keys 0, 1, 2
    ((2, 1, 3), Array([[ 1.        ,  0.26185951, -1.        ],
           [-1.        , -0.26185951,  1.        ]], dtype=array_api_strict.float64))
    """
    heads = _check_mlp(w1, b1, w2, b2)
    xp = _xp.array_namespace(w1, b1, w2, b2)
    _xp.check_same_dtype(w1=w1, b1=b1, w2=w2, **({} if b2 is None else {"b2": b2}))
    x = fire_inputs(t_q, t_k, c=c, L=L, eps=eps, q_offset=q_offset, xp=xp, dtype=w1.dtype,
                    device=_xp.device(w1))
    out = mlp_output(x, w1, b1, w2, b2)
    return out if heads is not None else out[0, ...]


def fire_call(
    q: Any, k: Any, v: Any, w1: Any, b1: Any, w2: Any, /, *, b2: Any, c: Any, L: Any,
    eps: float, scale: float | None, mask: Any, causal: bool | None, q_offset: int | None,
) -> Call:
    """Validate a `fire_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.zeros((2, 3, 4))
    >>> fire_call(q, q, q, xp.zeros((5, 1)), xp.zeros(5), xp.zeros((2, 5)), b2=None,
    ...           c=0.1, L=512.0, eps=1e-6, scale=None, mask=None, causal=None,
    ...           q_offset=None).causal
    True
    """
    tables = {n: x for n, x in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2), ("c", c),
                                ("L", L)) if hasattr(x, "shape")}
    call = resolve_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                        defaults=DEFAULTS, tables=tables)
    heads = _check_mlp(w1, b1, w2, b2)
    _check_scalar("c", c)
    _check_scalar("L", L)
    _check_eps(eps, c, L, call)
    _xp.check_same_dtype(q=q, w1=w1, b1=b1, w2=w2, **{
        n: x for n, x in (("b2", b2), ("c", c), ("L", L)) if hasattr(x, "shape")})
    h = q.shape[-3] if q.ndim >= 3 else 1
    if heads not in (None, 1, h):
        msg = f"the MLP has {heads} heads, `q` has {h} on axis -3 (shape {tuple(q.shape)})"
        raise ValueError(msg)
    _wide(call.xp, q.dtype, _xp.device(q), call.t_q, call.t_k, call.q_offset)
    return call


@computes_in_float32
def fire_attention(
    q: Any, k: Any, v: Any, w1: Any, b1: Any, w2: Any, /, *, b2: Any = None, c: Any = 0.1,
    L: Any = 512.0, eps: float = EPS, scale: float | None = None, mask: Any = None,
    causal: bool | None = None, q_offset: int | None = None, return_weights: bool = False,
) -> Any:
    r"""Attention with FIRE's bias (Li et al. 2023).

    .. math:: w = \operatorname{softmax}(s\, q k^\top + b), \qquad
              b_{hij} = f_h\!\left(\frac{\log(|c (p_i - j)| + 1)}
              {\log(|c \max(|L|, p_i)| + 1) + \epsilon}\right)

    Parameters
    ----------
    q, k, v : floating arrays ``(..., h, t_q, d)``, ``(..., h, t_k, d)``, ``(..., h, t_k, d_v)``
    w1, b1, w2 : floating arrays
        The MLP (`fire_bias`), `q`'s dtype.
    b2 : floating array, optional
        The output layer's bias: it changes no weight (see the module).
    c, L : float or floating array of shape ``()``, optional
        Learned scalars (0.1 and 512, the paper's initial values).
    eps : float, optional
        Added to the normaliser after its log; finite, at least 0, and not 0
        where a query that sees a key has a normaliser of 0 (``c = 0``, or
        ``L = 0`` and a query at a position ``p_i <= 0``; causal queries
        before position 0 see none).
    scale, mask, return_weights
        As in `relpos_ref.attention`.
    causal : bool, optional
        Default ``True``; ``False`` reads :math:`\psi(|p_i - j|)` for later keys too.
    q_offset : int, optional
        Position of query 0; default ``t_k - t_q`` (end-aligned, decoding).

    Returns
    -------
    out : array ``(..., h, t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((2, 3, 4))
    >>> v = xp.ones((2, 3, 1))
    >>> out = fire_attention(q, k, v, xp.ones((4, 1)), xp.zeros(4), xp.ones((2, 4)))
    >>> out[:, :, 0]  # every weight row sums to 1
    Array([[1., 1., 1.],
           [1., 1., 1.]], dtype=array_api_strict.float64)
    """
    call = fire_call(q, k, v, w1, b1, w2, b2=b2, c=c, L=L, eps=eps, scale=scale, mask=mask,
                     causal=causal, q_offset=q_offset)
    bias = fire_bias(w1, b1, w2, call.t_q, call.t_k, b2=b2, c=c, L=L, eps=eps,
                     q_offset=call.q_offset)
    return attention(q, k, v, scale=call.scale, mask=mask, causal=call.causal,
                     q_offset=call.q_offset, bias=bias, return_weights=return_weights)


@computes_in_float32
def fire_attention_vjp(
    q: Any, k: Any, v: Any, w1: Any, b1: Any, w2: Any, /, *, d_output: Any, b2: Any = None,
    c: Any = 0.1, L: Any = 512.0, eps: float = EPS, scale: float | None = None, mask: Any = None,
    causal: bool | None = None, q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `fire_attention` for the output's cotangent `d_output` (a VJP).

    The bias's cotangent :math:`\bar b` (the logits') goes back through the
    MLP (``w2``: against the hidden layer; through the ReLU where its input
    is > 0, to ``b1``, ``w1`` and the input ``x``; ``b2``'s is 0, each row of
    :math:`\bar b` summing to 0), and from :math:`\bar x` to ``c`` and ``L``:

    .. math:: \frac{\partial x}{\partial c} = \operatorname{sign}(c) \left(
              \frac{|p_i - j|}{(|c| |p_i - j| + 1) N_i} - \frac{A_{ij}\, m_i}{(|c| m_i + 1) N_i^2}
              \right), \qquad
              \frac{\partial x}{\partial L} = -\operatorname{sign}(L)\, \theta_i
              \frac{A_{ij} |c|}{(|c| m_i + 1) N_i^2}

    with :math:`A_{ij} = \psi(|p_i - j|)`, :math:`m_i = \max(|L|, p_i)`,
    :math:`N_i = \psi(m_i) + \epsilon` and :math:`\theta_i` 1 where
    :math:`|L| > p_i`, 0 where :math:`|L| < p_i`, 1/2 at a tie (``torch.maximum``'s).

    Parameters
    ----------
    q, k, v, w1, b1, w2, b2, c, L, eps, scale, mask, causal, q_offset
        As in `fire_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``

    Returns
    -------
    dict
        The gradient with respect to ``q``, ``k``, ``v``, ``w1``, ``b1``, ``w2``, ``b2``
        (when given: zeros), ``c`` and ``L`` (those used when not given: shape ``()``,
        `q`'s dtype), each of its argument's shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = xp.zeros((1, 2, 1))
    >>> v = xp.asarray([[[1.0], [3.0]]])
    >>> g = fire_attention_vjp(q, k, v, xp.ones((2, 1)), xp.zeros(2), xp.ones((1, 2)),
    ...                        d_output=xp.ones((1, 2, 1)))
    >>> sorted(g)
    ['L', 'b1', 'c', 'k', 'q', 'v', 'w1', 'w2']
    """
    call = fire_call(q, k, v, w1, b1, w2, b2=b2, c=c, L=L, eps=eps, scale=scale, mask=mask,
                     causal=causal, q_offset=q_offset)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    xp, dev = call.xp, _xp.device(q)
    heads = _check_mlp(w1, b1, w2, b2)
    wide = _wide(xp, q.dtype, dev, call.t_q, call.t_k, call.q_offset)
    parts = _parts(xp, call.t_q, call.t_k, c, L, float(eps), call.q_offset, wide, dev)
    x = xp.astype(parts["x"], q.dtype)
    out = mlp_output(x, w1, b1, w2, b2)  # (H, t_q, t_k), a block of rows at a time
    bias = out if heads is not None else out[0, ...]
    fwd = forward(q, k, call, mask=mask, bias=bias)
    core = core_vjp(q, k, v, d_output, call, fwd)
    d_bias = core.d_logits
    if d_bias.ndim == 2:
        d_bias = d_bias[None, ...]
    d_out = sum_to_shape(d_bias, tuple(out.shape))  # (H, t_q, t_k)
    tw1, tb1, tw2, _ = _tables(w1, b1, w2, b2)
    d_x, d_w1, d_b1, d_w2 = mlp_vjp(x, d_out, w1, b1, w2)  # no (H, t_q, t_k, m) array
    d_c, d_l = _parameter_gradients(xp, parts, xp.astype(d_x, wide), c, L)
    grads = {
        "q": sum_to_shape(core.dq, q.shape), "k": sum_to_shape(core.dk, k.shape),
        "v": sum_to_shape(core.dv, v.shape),
        "w1": xp.reshape(sum_to_shape(d_w1, tuple(tw1.shape)), w1.shape),
        "b1": xp.reshape(sum_to_shape(d_b1, tuple(tb1.shape)), b1.shape),
        "w2": xp.reshape(sum_to_shape(d_w2, tuple(tw2.shape)), w2.shape),
    }
    if b2 is not None:  # softmax takes a row's constant away: exactly 0
        grads["b2"] = xp.zeros(b2.shape, dtype=b2.dtype, device=_xp.device(b2))
    return {**grads, "c": _like(xp, d_c, c, q.dtype), "L": _like(xp, d_l, L, q.dtype)}
