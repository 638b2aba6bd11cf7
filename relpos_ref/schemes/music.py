r"""Music Transformer relative attention (Huang et al. 2018): causal, one-sided.

.. math:: \text{logits}_{ij} = s\,(q_i \cdot k_j + q_i \cdot E_{\text{idx}(r_{ij})}),
          \quad r_{ij} \le 0,

with a table ``E`` of ``M`` rows for ``r = -(M-1) .. 0`` (row ``r + M - 1``).
The efficient path, for end-aligned queries (``q_offset = t_k - t_q``, the
decoder's case, with ``t_q <= t_k``), is the "skew": ``Q E^T`` for the ``t_k`` distances that
occur, laid out by `relpos_ref.layouts.rel_shift` (exactly the skew when
``t_q = t_k``), memory ``O(L d + L^2)`` instead of ``O(L^2 d)``. For any
other offset the table's rows are taken for every distance the grid reaches
and laid out as stacked diagonals, as in `relpos_ref.schemes.general`.
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import as_int, check_bool, check_choice, nonnegative_int
from ..attention import allowed_keys, attention
from ..calls import Call, Defaults, computes_in_float32, resolve_call
from ..gradients import check_d_output, forward
from ..layouts import pad_flatten_reshape, rel_shift
from ..positions import (
    _ERROR_POLICY_HINT,
    BEYOND_POLICIES,
    TableIndex,
    _raise_if_outside,
    causal_table_index,
    distance_range,
    relative_positions,
)
from ._tables import (
    binned_keys_values_vjp,
    binned_values,
    check_method,
    check_table,
    check_value_table,
    check_value_width,
    contract_rows,
    gather_rows,
    gather_valid_rows,
    table_logits,
    weighted_rows,
)

__all__ = [
    "DEFAULTS",
    "music_attention",
    "music_attention_vjp",
    "music_call",
    "music_index",
    "music_logits",
    "music_values",
]

#: The Music Transformer's defaults: ``scale = 1/sqrt(d)``, causal, start-aligned queries.
DEFAULTS = Defaults(causal=True)


def _check_beyond(t_q: int, t_k: int, length: int, q_offset: int, beyond: str) -> None:
    # Host-side: the policy name, and under "error" that no past distance
    # falls before the table (future distances have no row and are not errors).
    check_choice("beyond", beyond, BEYOND_POLICIES)
    if beyond == "error":
        span = distance_range(t_q, t_k, q_offset=q_offset)
        if span is not None:  # the table has rows for r = -(length - 1) .. 0
            past_end, _ = span
            _raise_if_outside(past_end, 0, -(length - 1), 0, f"length={length}", _ERROR_POLICY_HINT)


def music_index(
    t_q: int,
    t_k: int,
    /,
    *,
    length: int,
    q_offset: int = 0,
    beyond: str = "clip",
    xp: Any,
    device: Any = None,
) -> TableIndex:
    """One-sided table row and validity per pair; future entries are invalid.

    Parameters
    ----------
    t_q, t_k : int
        Number of queries and keys.
    length : int
        ``M``; rows for ``r = -(M-1) .. 0``.
    q_offset : int, optional
        Position of query 0.
    beyond : {"clip", "zero", "error"}, optional
        Policy for ``r < -(M-1)``.
    xp : namespace
        Array API namespace of the result.
    device : optional
        Device of the result.

    Returns
    -------
    TableIndex
        ``index = clip(r, -(M-1), 0) + M - 1`` and ``valid``, each ``(t_q, t_k)``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> music_index(3, 3, length=3, xp=xp).index
    Array([[2, 2, 2],
           [1, 2, 2],
           [0, 1, 2]], dtype=array_api_strict.int64)
    """
    _check_beyond(t_q, t_k, length, q_offset, beyond)
    if beyond == "error":
        beyond = "clip"
    r = relative_positions(t_q, t_k, q_offset=q_offset, xp=xp, device=device)
    return causal_table_index(r, length, beyond=beyond)


def _rows_for_every_distance(xp: Any, table: Any, t_k: int, beyond: str) -> Any:
    # Rows for r = -(t_k - 1) .. 0: the table's last t_k rows, extended at the
    # past end with its first row ("clip") or zeros ("zero") when M < t_k.
    m = table.shape[-2]
    if m >= t_k:
        return table[..., m - t_k :, :]
    shape = (*table.shape[:-2], t_k - m, table.shape[-1])
    if beyond == "clip":
        fill = xp.broadcast_to(table[..., :1, :], shape)
    else:
        fill = xp.zeros(shape, dtype=table.dtype, device=_xp.device(table))
    return xp.concat([fill, table], axis=-2)


@computes_in_float32
def music_logits(
    q: Any,
    table: Any,
    /,
    t_k: int,
    *,
    q_offset: int = 0,
    beyond: str = "clip",
    method: str = "efficient",
) -> Any:
    r"""Positional term :math:`P_{ij} = q_i \cdot E_{\text{idx}(r_{ij})}` for ``r <= 0``, else 0.

    Parameters
    ----------
    q : floating array, shape ``(..., t_q, d)``
    table : floating array, shape ``(M, d)`` or ``(h, M, d)``
        Row ``r + M - 1`` for distance ``r = -(M-1) .. 0``.
    t_k : int
        Number of keys.
    q_offset : int, optional
        Position of query 0. With end alignment, ``q_offset = t_k - t_q``
        (``0`` for self-attention), the efficient path is the skew.
    beyond : {"clip", "zero", "error"}, optional
        Past distances ``r < -(M-1)``.
    method : {"efficient", "definition"}, optional

    Returns
    -------
    array, shape ``(..., t_q, t_k)``; zero where ``r > 0`` (no row).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = xp.ones((3, 1))
    >>> E = xp.asarray([[-2.0], [-1.0], [0.0]])  # M = 3: r = -2, -1, 0
    >>> music_logits(q, E, 3)
    Array([[ 0.,  0.,  0.],
           [-1.,  0.,  0.],
           [-2., -1.,  0.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(q, table)
    check_method(method)
    check_table("table", table, q, width=q.shape[-1])
    t_k = nonnegative_int("t_k", t_k)
    q_offset = as_int("q_offset", q_offset)
    t_q = q.shape[-2]
    m = _length(table)
    dev = _xp.device(q)
    index, valid = music_index(
        t_q, t_k, length=m, q_offset=q_offset, beyond=beyond, xp=xp, device=dev
    )
    zero = xp.zeros((), dtype=q.dtype, device=dev)
    if method == "definition":
        return contract_rows(q, gather_valid_rows(table, index, valid))
    if t_q == 0 or t_k == 0:
        return xp.zeros((*q.shape[:-2], t_q, t_k), dtype=q.dtype, device=dev)
    if q_offset == t_k - t_q and t_k >= t_q:  # the skew (Huang et al.)
        policy = "zero" if beyond == "zero" else "clip"
        rows = _rows_for_every_distance(xp, table, t_k, policy)
        out = rel_shift(table_logits(q, rows))
    else:  # stacked diagonals of the rows of every distance the grid reaches
        r_min = -(t_q - 1) - q_offset
        r = xp.arange(t_q + t_k - 1, dtype=index.dtype, device=dev) + r_min
        rows = xp.take(table, xp.clip(r, -(m - 1), 0) + (m - 1), axis=table.ndim - 2)
        out = pad_flatten_reshape(table_logits(q, rows), t_k, offset=-r_min, q_offset=q_offset)
    return xp.where(valid, out, zero)


@computes_in_float32
def music_values(
    weights: Any,
    value_table: Any,
    /,
    *,
    q_offset: int = 0,
    beyond: str = "clip",
    method: str = "efficient",
    allowed: Any = None,
) -> Any:
    r"""Relative value term :math:`\sum_{j:\, r_{ij} \le 0} w_{ij}\, E^V_{\text{idx}(r_{ij})}`.

    Parameters
    ----------
    weights : floating array, shape ``(..., t_q, t_k)``
    value_table : floating array, shape ``(M, d_v)`` or ``(h, M, d_v)``
        Row ``r + M - 1`` for ``r = -(M-1) .. 0``; future keys get no row.
    q_offset, beyond
        As in `music_logits`.
    allowed : bool array broadcastable to ``(..., t_q, t_k)``, optional
        The keys each query attends to (`relpos_ref.allowed_keys`); a row
        read only through other keys contributes nothing, even NaN. Default:
        every key.
    method : {"efficient", "definition"}, optional
        ``"efficient"`` sums the weights into the ``M`` distance bins,
        memory ``O(t_q (t_k + M))``.

    Returns
    -------
    array, shape ``(..., t_q, d_v)``

    Examples
    --------
    >>> import array_api_strict as xp
    >>> w = xp.asarray([[0.25, 0.25, 0.5]])
    >>> EV = xp.asarray([[1.0], [10.0]])  # M = 2: r = -1, 0
    >>> music_values(w, EV, q_offset=2)  # r = -2 (clipped), -1, 0
    Array([[5.5]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(weights, value_table)
    check_method(method)
    check_value_table("value_table", value_table, weights)
    m = value_table.shape[-2]
    t_q, t_k = weights.shape[-2:]
    if method == "definition":
        dev = _xp.device(weights)
        index, valid = music_index(
            t_q, t_k, length=m, q_offset=q_offset, beyond=beyond, xp=xp, device=dev
        )
        used = valid if allowed is None else valid & allowed
        return weighted_rows(weights, gather_rows(value_table, index), used)
    _check_beyond(t_q, t_k, m, q_offset, beyond)
    return binned_values(
        weights, value_table, low=-(m - 1), high=0, q_offset=q_offset, clip=beyond == "clip",
        clip_future=False, allowed=allowed,
    )


def _length(table: Any) -> int:
    m = table.shape[-2]
    if m < 1:
        msg = f"`table` must have at least one row, got shape {tuple(table.shape)}"
        raise ValueError(msg)
    return m


def music_call(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    value_table: Any = None,
    /,
    *,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    q_offset: int | None,
    beyond: str,
    method: str,
) -> Call:
    """Validate a `music_attention` call and resolve its defaults (shared with the kernels).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 4))
    >>> music_call(q, k, v, xp.zeros((3, 4)), scale=None, mask=None, causal=None,
    ...            q_offset=None, beyond="clip", method="efficient").causal
    True
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS,
        tables={"table": table, "value_table": value_table},
    )
    check_method(method)
    check_value_width(value_table, v)
    check_table("table", table, q, width=q.shape[-1])
    _check_beyond(call.t_q, call.t_k, _length(table), call.q_offset, beyond)
    if value_table is not None:
        check_table("value_table", value_table, q)
    return call


@computes_in_float32
def music_attention(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    value_table: Any = None,
    /,
    *,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    beyond: str = "clip",
    method: str = "efficient",
    return_weights: bool = False,
) -> Any:
    r"""Causal relative self-attention of the Music Transformer.

    .. math:: w = \operatorname{softmax}_{r \le 0}\bigl(s\,(q k^\top + S^\text{rel})\bigr),
              \quad S^\text{rel}_{ij} = q_i \cdot E_{r_{ij} + M - 1}

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    table : floating array, ``(M, d)`` or ``(h, M, d)``
    value_table : floating array, ``(M, d_v)`` or ``(h, M, d_v)``, optional
        Relative value embeddings, added as in `music_values`.
    scale, mask, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`).
    causal : bool, optional
        Default ``True`` (the scheme's setting). With ``False`` future keys
        are attended with a zero positional term.
    beyond, method
        As in `music_logits`.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(3)
    >>> music_attention(q, k, v, xp.zeros((3, 3)))[0, :]
    Array([1., 0., 0.], dtype=array_api_strict.float64)
    """
    call = music_call(
        q, k, v, table, value_table, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        beyond=beyond, method=method,
    )
    position = music_logits(
        q, table, call.t_k, q_offset=call.q_offset, beyond=beyond, method=method
    )
    out, weights = attention(
        q, k, v, scale=call.scale, mask=mask, causal=call.causal, q_offset=call.q_offset,
        position=position, return_weights=True,
    )
    if value_table is not None:
        allowed = allowed_keys(
            call.t_q, call.t_k, mask=mask, causal=call.causal, q_offset=call.q_offset,
            xp=call.xp, device=_xp.device(q),
        )
        out = out + music_values(
            weights, value_table, q_offset=call.q_offset, beyond=beyond, method=method,
            allowed=allowed,
        )
    return (out, weights) if check_bool("return_weights", return_weights) else out


@computes_in_float32
def music_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    table: Any,
    value_table: Any = None,
    /,
    *,
    d_output: Any,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    beyond: str = "clip",
) -> dict[str, Any]:
    r"""Gradients of `music_attention` for the output's cotangent `d_output` (a VJP).

    As `relpos_ref.schemes.shaw.shaw_attention_vjp` with the one-sided row
    map: a future distance (``r > 0``) reads no row, so it adds nothing to
    any table; with ``"clip"`` row 0 collects every ``r < -(M - 1)``.

    Parameters
    ----------
    q, k, v, table, value_table, scale, mask, causal, q_offset, beyond
        As in `music_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k``, ``v``, ``table`` and, when given,
        ``value_table``, of its shape and dtype.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.ones((2, 1))
    >>> g = music_attention_vjp(q, k, v, xp.zeros((2, 1)), d_output=xp.ones((2, 1)))
    >>> g["table"][:, 0]  # the output does not move: v is the same everywhere
    Array([0., 0.], dtype=array_api_strict.float64)
    """
    call = music_call(
        q, k, v, table, value_table, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
        beyond=beyond, method="efficient",
    )
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    position = music_logits(q, table, call.t_k, q_offset=call.q_offset, beyond=beyond)
    fwd = forward(q, k, call, mask=mask, position=position)
    m = _length(table)
    policy = "zero" if beyond == "zero" else "clip"  # "error" checked: every r has a row
    bins = {"low": -(m - 1), "high": 0, "q_offset": call.q_offset, "clip": policy == "clip",
            "clip_future": False}

    def value_rows() -> TableIndex:
        return music_index(call.t_q, call.t_k, length=m, q_offset=call.q_offset,
                           beyond=policy, xp=call.xp, device=_xp.device(q))

    return binned_keys_values_vjp(q, k, v, d_output, call, fwd, table, value_table,
                                  value_rows, names=("table", "value_table"), **bins)
