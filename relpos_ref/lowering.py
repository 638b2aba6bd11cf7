r"""The distance form: every scheme's call as small arrays read at an index of the distance.

A relative scheme's terms depend on the pair ``(i, j)`` only through a few
small arrays read at a row that a map of the pair's distance picks. Lowered
to that form, a call is:

.. math::
    \text{logits}_{ij} = s\,\Bigl(q'_i \cdot k'_j
        + \sum_t a_t[i] \cdot A_t[\text{row}_t(i, j)]
        + \sum_t b_t[j] \cdot B_t[\text{row}_t(i, j)]\Bigr)
        + \sum_t \beta_t[\text{row}_t(i, j)]

    \text{out}_i = \sum_j w_{ij}\, v_j + \sum_t \sum_j w_{ij}\, V_t[\text{row}_t(i, j)]

with ``w`` the softmax of the logits over the allowed keys (mask, causal
structure, empty rows as in `relpos_ref.attention`). Each map is an
`IndexMap`: ``row(i, j) = rows[key[j] - query[i] - low]``, where ``query``
and ``key`` are coordinates (by default the positions ``i + q_offset`` and
``j``, so the difference is the distance ``r``), and a row of ``-1`` means
no term for that pair. A fused kernel (the Triton kernels, FlexAttention's
``score_mod``) computes the terms this way, tile by tile, without any
``(t_q, t_k)`` array: a term needs ``rows`` (``t_q + t_k - 1`` entries for a
distance map), the table and, for content-position terms, one product of a
tile of ``q`` (or ``k``) with the table rows the tile reaches.

A `DistanceForm` holds:

- ``q``, ``k``, ``v``: the content operands, after what a scheme does to them
  (RoPE's rotation; Transformer-XL's content bias ``u`` added to ``q``;
  absolute key embeddings added to ``k``);
- ``query_terms``: `SideTerm` s ``a_t . A_t[row]``, scaled with ``q . k``
  (Shaw's and Music's keys, general, grid2d's rows and columns, DeBERTa's
  c2p, Transformer-XL's ``(q + v) . W_R R``);
- ``key_terms``: the same with the keys, ``b_t . B_t[row]`` (DeBERTa's p2c);
- ``biases``: `BiasTerm` s ``β_t[row]``, per head or shared, added after
  scaling (bias, T5, ALiBi, Swin);
- ``values``: `ValueTerm` s, relative values ``V_t[row]`` weighted into the
  output (Shaw's and Music's value tables);
- ``dense``: plain attention's given ``position`` and ``bias`` arrays, which
  have no distance structure.

Every catalog scheme has a lowering (`relpos_ref.catalog.Scheme.lower`);
`lower` validates a call with the scheme's own checks and returns its form,
and `form_attention` evaluates a form the slow way (the whole grid), which
the tests prove equal to the scheme's ``*_attention``.

Arrays the lowering computes (a rotation, ALiBi's rows, Transformer-XL's
projected sinusoids, ``q + u``) are float32 for 16-bit calls, as the
specification computes them (`relpos_ref.calls.computes_in_float32`); the
arrays a call passed in keep their dtype.

Examples
--------
>>> import numpy as np
>>> from relpos_ref.lowering import lower
>>> q = k = v = np.zeros((3, 4))
>>> form = lower("bias", q, k, v, np.arange(5.0))  # K = 2: rows for r = -2 .. 2
>>> (term,) = form.biases
>>> term.index.low, term.index.rows  # distances r = -2 .. 2, row clip(r, -2, 2) + 2
(-2, array([0, 1, 2, 3, 4]))
"""

from __future__ import annotations

from typing import Any, NamedTuple

from . import _xp
from ._validate import check_bool
from .attention import allowed_keys, attention
from .calls import Call, check_terms
from .layouts import _take_per_row
from .positions import relative_positions
from .schemes._tables import gather_rows, gather_scalars, table_logits, weighted_rows

__all__ = [
    "BiasTerm",
    "DistanceForm",
    "IndexMap",
    "SideTerm",
    "ValueTerm",
    "bias_by_difference",
    "distance_map",
    "distances",
    "form_attention",
    "form_terms",
    "lower",
    "pair_rows",
]


class IndexMap(NamedTuple):
    """Which table row each pair reads: ``rows[key[j] - query[i] - low]``, ``-1`` for none.

    Attributes
    ----------
    rows : integer array, shape ``(n,)``
        The row of each difference ``low .. low + n - 1``; ``-1``: the pair has
        no term (a policy's ``"zero"``, Music's future).
    low : int
        The smallest difference of the call's grid.
    query, key : integer arrays, shapes ``(t_q,)`` and ``(t_k,)``, optional
        Coordinates of queries and keys; ``None`` (both): the positions
        ``i + q_offset`` and ``j``, so the difference is the distance ``r``
        and ``low = -(t_q - 1) - q_offset`` (a "distance map").
    """

    rows: Any
    low: int
    query: Any = None
    key: Any = None

    @property
    def by_distance(self) -> bool:
        """Whether the difference is the distance ``r`` (the coordinates are positions)."""
        return self.query is None and self.key is None


class SideTerm(NamedTuple):
    """A content-position term, ``vectors[.., t, :]`` dotted with ``table[.., row, :]``, scaled.

    Scaled with the content term ``q k^T``.

    ``vectors`` are ``(..., t_q, d)`` queries in `DistanceForm.query_terms`,
    ``(..., t_k, d)`` keys in `DistanceForm.key_terms`; ``table`` is
    ``(m, d)`` or ``(h, m, d)``.
    """

    vectors: Any
    table: Any
    index: IndexMap


class BiasTerm(NamedTuple):
    """``table[.., row]``: a scalar added after scaling; ``table`` is ``(m,)`` or ``(h, m)``."""

    table: Any
    index: IndexMap


class ValueTerm(NamedTuple):
    """``sum_j w_ij table[.., row, :]``, added to the output.

    ``table`` is ``(m, d_v)`` or ``(h, m, d_v)``.
    """

    table: Any
    index: IndexMap


class DistanceForm(NamedTuple):
    """One call in the distance form (see the module docstring for the formula)."""

    q: Any
    k: Any
    v: Any
    call: Call
    mask: Any = None
    query_terms: tuple[SideTerm, ...] = ()
    key_terms: tuple[SideTerm, ...] = ()
    biases: tuple[BiasTerm, ...] = ()
    values: tuple[ValueTerm, ...] = ()
    dense: tuple[Any, Any] = (None, None)


def distances(call: Call, *, device: Any = None) -> Any:
    r"""The distances of a call's grid, most distant past first: ``r_min`` to ``r_max``.

    .. math:: r_c = c - (t_q - 1) - q_\text{offset}, \quad c = 0 .. t_q + t_k - 2

    Returns
    -------
    integer array, shape ``(n,)``
        ``n = t_q + t_k - 1`` (``0`` for an empty grid), the namespace's
        index dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.calls import resolve_call
    >>> q, k = np.zeros((2, 1)), np.zeros((3, 1))  # two queries at 1, 2; keys at 0, 1, 2
    >>> distances(resolve_call(q, k, k, scale=None, mask=None, causal=None, q_offset=1))
    array([-2, -1,  0,  1])
    """
    n = call.t_q + call.t_k - 1 if call.t_q and call.t_k else 0
    r = relative_positions(1, n, q_offset=call.t_q - 1 + call.q_offset, xp=call.xp,
                           device=device)
    return r[0, :]


def distance_map(rows: Any, call: Call) -> IndexMap:
    """An `IndexMap` over the call's distances (`distances`), ``rows`` one per distance.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.calls import resolve_call
    >>> x = np.zeros((2, 1))
    >>> call = resolve_call(x, x, x, scale=None, mask=None, causal=None, q_offset=None)
    >>> distance_map(np.arange(3), call).low
    -1
    """
    return IndexMap(rows, -(call.t_q - 1) - call.q_offset)


def pair_rows(index: IndexMap, call: Call) -> Any:
    """The row of every pair, ``(t_q, t_k)``: the map on the whole grid (``-1``: none).

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.calls import resolve_call
    >>> x = np.zeros((2, 1))
    >>> call = resolve_call(x, x, x, scale=None, mask=None, causal=None, q_offset=None)
    >>> pair_rows(distance_map(np.asarray([5, 6, 7]), call), call)
    array([[6, 7],
           [5, 6]])
    """
    xp = call.xp
    if index.by_distance:
        difference = relative_positions(call.t_q, call.t_k, q_offset=call.q_offset, xp=xp,
                                        device=_xp.device(index.rows))
    else:
        difference = index.key[None, :] - index.query[:, None]
    return gather_scalars(index.rows, difference - index.low)


def bias_by_difference(term: BiasTerm) -> Any:
    """A bias read through its map once: its value at each difference, ``(..., n)``.

    ``out[..., c] = table[..., rows[c]]``, zero where ``rows[c] = -1``. A
    fused kernel reads this row at each pair's difference (a Toeplitz view
    for a distance map), so the table and its map cost one gather per pair.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.zeros((3, 2))
    >>> form = lower("bias", x, x, x, np.asarray([10.0, 20.0, 30.0]), beyond="zero")
    >>> bias_by_difference(form.biases[0])  # r = -2 .. 2: beyond K = 1 is zero
    array([ 0., 10., 20., 30.,  0.])
    """
    xp = _xp.array_namespace(term.table, term.index.rows)
    rows = term.index.rows
    valid = rows >= 0
    entries = xp.take(term.table, xp.where(valid, rows, xp.zeros_like(rows)), axis=-1)
    return xp.where(valid, entries, xp.zeros_like(entries))


def _valid_rows(index: IndexMap, call: Call) -> tuple[Any, Any]:
    rows = pair_rows(index, call)
    valid = rows >= 0
    return call.xp.where(valid, rows, call.xp.zeros_like(rows)), valid


def _where(xp: Any, valid: Any, x: Any) -> Any:
    return xp.where(valid, x, xp.zeros((), dtype=x.dtype, device=_xp.device(x)))


def form_terms(form: DistanceForm) -> tuple[Any, Any]:
    """The form's ``(position, bias)`` on the whole grid, ``(..., t_q, t_k)`` or ``None`` each.

    ``position`` sums the content-position terms (scaled later with
    ``q . k``), ``bias`` the scalar terms and plain attention's dense ones.
    This is the slow evaluation the kernels are proven against.
    """
    xp, call = form.call.xp, form.call
    position, bias = form.dense
    for term in form.query_terms:
        rows, valid = _valid_rows(term.index, call)
        found = _where(xp, valid, _take_per_row(table_logits(term.vectors, term.table), rows))
        position = found if position is None else position + found
    for term in form.key_terms:
        rows, valid = _valid_rows(term.index, call)
        per_key = table_logits(term.vectors, term.table)  # (..., t_k, m)
        found = xp.matrix_transpose(_take_per_row(per_key, xp.matrix_transpose(rows)))
        found = _where(xp, valid, found)
        position = found if position is None else position + found
    for term in form.biases:
        rows, valid = _valid_rows(term.index, call)
        found = _where(xp, valid, gather_scalars(term.table, rows))
        bias = found if bias is None else bias + found
    return position, bias


def _wide(xp: Any, x: Any) -> Any:
    if x is None or not xp.isdtype(x.dtype, "real floating") or xp.finfo(x.dtype).bits != 16:
        return x
    return xp.astype(x, xp.float32)


def form_attention(form: DistanceForm, *, return_weights: bool = False) -> Any:
    r"""Attention of a call in the distance form, evaluated on the whole grid.

    .. math:: \text{out} = \operatorname{softmax}_\text{allowed}(s\,(q' k'^\top + P) + B)\, v
              + \sum_t \sum_j w_{ij} V_t[\text{row}_t(i, j)]

    Parameters
    ----------
    form : DistanceForm
    return_weights : bool, optional
        Also return the weights ``w``.

    Returns
    -------
    out : array, shape ``(..., t_q, d_v)``, the dtype of ``v``
        16-bit calls are computed in float32.

    Examples
    --------
    >>> import numpy as np
    >>> import relpos_ref as rp
    >>> q, k, v = np.eye(3), np.eye(3), np.arange(9.0).reshape(3, 3)
    >>> table = np.linspace(-1, 1, 5)
    >>> out = form_attention(lower("bias", q, k, v, table, causal=True))
    >>> bool(np.allclose(out, rp.bias_attention(q, k, v, table, causal=True)))
    True
    """
    call, xp = form.call, form.call.xp
    position, bias = (_wide(xp, t) for t in form_terms(form))
    q, k, v = (_wide(xp, a) for a in (form.q, form.k, form.v))
    dtype = q.dtype
    position = None if position is None else xp.astype(position, dtype)
    bias = None if bias is None else xp.astype(bias, dtype)
    out, weights = attention(q, k, v, scale=call.scale, mask=form.mask, causal=call.causal,
                             q_offset=call.q_offset, position=position, bias=bias,
                             return_weights=True)
    if form.values:
        allowed = allowed_keys(call.t_q, call.t_k, mask=form.mask, causal=call.causal,
                               q_offset=call.q_offset, xp=xp, device=_xp.device(q))
        for term in form.values:
            rows, valid = _valid_rows(term.index, call)
            used = valid if allowed is None else allowed & valid
            table = xp.astype(_wide(xp, term.table), dtype)
            out = out + weighted_rows(weights, gather_rows(table, rows), used=used)
    out = xp.astype(out, form.v.dtype)
    if check_bool("return_weights", return_weights):
        return out, xp.astype(weights, form.v.dtype)
    return out


def lower(scheme: str, q: Any, k: Any, v: Any, /, *tables: Any, scale: float | None = None,
          mask: Any = None, causal: bool | None = None, q_offset: int | None = None,
          bias: Any = None, position: Any = None, **options: Any) -> DistanceForm:
    """The distance form of a call of `scheme`, validated by the scheme's own checks.

    Parameters
    ----------
    scheme : str
        A name of `relpos_ref.catalog` (``"plain"`` for `relpos_ref.attention`).
    q, k, v, *tables
        As the scheme's ``*_attention`` takes them.
    scale, mask, causal, q_offset, **options
        As the scheme's ``*_attention`` takes them (``None``: its defaults);
        ``bias`` and ``position`` for ``"plain"`` only.

    Returns
    -------
    DistanceForm

    Examples
    --------
    >>> import numpy as np
    >>> x = np.zeros((4, 2))
    >>> form = lower("t5", x, x, x, np.zeros(8), bidirectional=False, max_distance=6)
    >>> form.call.scale, form.biases[0].index.rows  # T5 is unscaled; r = -3 .. 3
    (1.0, array([3, 2, 1, 0, 0, 0, 0]))
    """
    from . import catalog  # the catalog reads this module's types

    entry = catalog.get(scheme)
    named = catalog.tables_by_name(entry, tables)
    dense = {n: a for n, a in (("bias", bias), ("position", position)) if a is not None}
    if dense and scheme != "plain":
        msg = f"`bias` and `position` are arguments of plain attention, not of {scheme!r}"
        raise TypeError(msg)
    call, options = entry.check_call(q, k, v, named, scale=scale, mask=mask, causal=causal,
                                     q_offset=q_offset, options=options)
    if dense:
        check_terms(q, call, **dense)
    return entry.lower(q, k, v, named, call=call, mask=mask, options={**options, **dense})
