"""The arguments of an attention call: validation, and what ``None`` means.

Every attention function (`relpos_ref.attention`, each ``<scheme>_attention``)
and every kernel standing in for one starts with `resolve_call`, so they
refuse the same input with the same message and read ``None`` the same way:
``scale``, ``causal`` and ``q_offset`` left at ``None`` take the scheme's
`Defaults`, recorded once next to the scheme's function (``DEFAULTS``).
Nothing here reads array values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from . import _xp
from ._validate import as_float, as_int, broadcast_shapes, check_bool, check_choice

__all__ = [
    "PLAIN",
    "Call",
    "Defaults",
    "check_mask",
    "check_qkv",
    "check_terms",
    "computes_in_float32",
    "default_scale",
    "inverse_sqrt_width",
    "resolve_call",
]


def default_scale(d: int, scale: float | None = None) -> float:
    r"""The logit scale: `scale` if given, else ``1 / sqrt(d)``.

    .. math:: s = \begin{cases} \text{scale} & \text{if given} \\
                                 1/\sqrt{d} & \text{otherwise} \end{cases}

    Parameters
    ----------
    d : int
        Feature size of queries and keys.
    scale : float, optional
        An explicit scale (``1.0`` for T5); must be finite.

    Returns
    -------
    float

    Examples
    --------
    >>> default_scale(64)
    0.125
    >>> default_scale(64, 1.0)
    1.0
    """
    d = as_int("d", d)
    if d < 0:
        msg = f"`d` must be >= 0 (a feature width), got {d}"
        raise ValueError(msg)
    if scale is None:
        return 1.0 / math.sqrt(d) if d > 0 else 1.0
    return as_float("scale", scale)


def check_qkv(q: Any, k: Any, v: Any) -> tuple[Any, tuple[int, ...]]:
    """Validate ``q (..., t_q, d)``, ``k (..., t_k, d)``, ``v (..., t_k, d_v)``.

    Returns the namespace and the broadcast leading shape. Raises a
    `TypeError` for mixed libraries, non-floating or mixed dtypes, and a
    `ValueError` naming the shapes when they do not fit together.
    """
    xp = _xp.named_namespace({"q": q, "k": k, "v": v})
    for name, a in (("q", q), ("k", k), ("v", v)):
        _xp.check_floating(xp, name, a)
        if a.ndim < 2:
            msg = f"`{name}` must have at least 2 dimensions, got shape {tuple(a.shape)}"
            raise ValueError(msg)
    _xp.check_same_dtype(q=q, k=k, v=v)
    if q.shape[-1] != k.shape[-1]:
        msg = (
            f"`q` and `k` must share the feature size d, got shapes "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
        raise ValueError(msg)
    if k.shape[-2] != v.shape[-2]:
        msg = (
            f"`k` and `v` must have the same number of keys, got shapes "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
        raise ValueError(msg)
    try:
        batch = broadcast_shapes(q=q.shape[:-2], k=k.shape[:-2], v=v.shape[:-2])
    except ValueError:
        msg = (f"shapes do not broadcast: `q` {tuple(q.shape)}, `k` {tuple(k.shape)}, `v` "
               f"{tuple(v.shape)} (their leading axes {tuple(q.shape[:-2])}, "
               f"{tuple(k.shape[:-2])} and {tuple(v.shape[:-2])} must broadcast)")
        raise ValueError(msg) from None
    return xp, batch


def inverse_sqrt_width(d: int, tables: Sequence[Any] = ()) -> float:
    r"""The conventions' default scale, :math:`1/\sqrt{d}` (`tables` is not used).

    The scale rule of every scheme but T5 (unscaled) and DeBERTa (which
    counts its tables); `Defaults.scale` has this signature.

    Examples
    --------
    >>> inverse_sqrt_width(16)
    0.25
    """
    return default_scale(d)


@dataclass(frozen=True)
class Defaults:
    """What ``None`` means for `scale`, `causal` and `q_offset` in one scheme.

    Every attention entry point (the scheme's function, `relpos_ref.blocked`,
    the golden cases) reads ``None`` the same way: as the scheme's default,
    recorded here once, next to the scheme's function.

    Attributes
    ----------
    scale : callable
        ``(d, tables) -> float``: the default scale from the feature width and
        the tables passed (``None`` for an omitted optional table).
    causal : bool
        Whether the scheme attends causally unless told otherwise.
    q_offset : {"start", "end"}
        ``"start"``: ``q_offset = 0``; ``"end"``: ``q_offset = t_k - t_q``
        (queries after a memory).

    Examples
    --------
    >>> Defaults(causal=True).causal
    True
    """

    scale: Callable[[int, Sequence[Any]], float] = inverse_sqrt_width
    causal: bool = False
    q_offset: str = "start"

    def __post_init__(self) -> None:
        check_choice("q_offset", self.q_offset, ("start", "end"))

    def resolve_scale(self, scale: float | None, d: int, tables: Sequence[Any] = ()) -> float:
        """`scale` as a float, or the scheme's rule for ``None``."""
        return self.scale(d, tuple(tables)) if scale is None else as_float("scale", scale)

    def resolve_causal(self, causal: bool | None) -> bool:
        """`causal` as a bool, or the scheme's for ``None``."""
        return self.causal if causal is None else check_bool("causal", causal)

    def resolve_q_offset(self, q_offset: int | None, t_q: int, t_k: int) -> int:
        """`q_offset` as an int, or the scheme's alignment for ``None`` (0 or ``t_k - t_q``)."""
        if q_offset is not None:
            return as_int("q_offset", q_offset)
        return 0 if self.q_offset == "start" else t_k - t_q


#: The defaults of plain attention and of most schemes.
PLAIN = Defaults()


class Call(NamedTuple):
    """The validated arguments of one attention call, with every default resolved.

    Attributes
    ----------
    xp : namespace
        The arrays' namespace.
    batch : tuple of int
        The broadcast leading shape of ``q``, ``k`` and ``v``.
    t_q, t_k, d : int
        Queries, keys and their feature width.
    scale : float
    causal : bool
    q_offset : int
    """

    xp: Any
    batch: tuple[int, ...]
    t_q: int
    t_k: int
    d: int
    scale: float
    causal: bool
    q_offset: int


def resolve_call(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    scale: float | None,
    mask: Any,
    causal: bool | None,
    q_offset: int | None,
    defaults: Defaults = PLAIN,
    tables: Sequence[Any] | Mapping[str, Any] = (),
) -> Call:
    """Validate an attention call's common arguments and resolve ``None`` defaults.

    The first step of every ``*_attention`` function and of every kernel
    that stands in for one, so both refuse the same input with the same
    message. Nothing here reads array values.

    Parameters
    ----------
    q, k, v : arrays
        As in `attention`.
    scale, mask, causal, q_offset
        As passed by the caller; ``None`` takes the scheme's default.
    defaults : Defaults, optional
        The scheme's defaults.
    tables : mapping or sequence, optional
        The scheme's tables (``None`` for omitted ones), by argument name (a
        sequence: by position), in order, for a scale rule that depends on
        them and for the one-library check, whose refusal names them.

    Returns
    -------
    Call

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 3, 4))
    >>> call = resolve_call(q, k, v, scale=None, mask=None, causal=None, q_offset=None,
    ...                     defaults=Defaults(causal=True, q_offset="end"))
    >>> call.scale, call.causal, call.q_offset
    (0.5, True, 0)
    """
    xp, batch = check_qkv(q, k, v)
    named = tables if isinstance(tables, Mapping) else {
        f"table {n}": t for n, t in enumerate(tables)}
    _xp.named_namespace({"q": q, "mask": mask, **named})  # one library (q, k, v: checked)
    *_, t_q, d = q.shape
    t_k = k.shape[-2]
    check_mask(xp, mask, (*batch, t_q, t_k))
    return Call(
        xp,
        batch,
        t_q,
        t_k,
        d,
        defaults.resolve_scale(scale, d, list(named.values())),
        defaults.resolve_causal(causal),
        defaults.resolve_q_offset(q_offset, t_q, t_k),
    )


def check_mask(xp: Any, mask: Any, logits: tuple[int, ...]) -> None:
    """A `TypeError` unless `mask` is boolean, a `ValueError` unless it broadcasts to `logits`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> check_mask(xp, xp.ones((3, 4), dtype=xp.bool), (2, 3, 4))
    >>> check_mask(xp, xp.ones((3, 4), dtype=xp.bool), (2, 5, 4))
    Traceback (most recent call last):
    ...
    ValueError: shapes do not broadcast: `mask` (3, 4), `logits` (2, 5, 4)
    """
    if mask is None:
        return
    if not xp.isdtype(mask.dtype, "bool"):
        msg = f"`mask` must be a bool array (True = may attend), got dtype {mask.dtype}"
        raise TypeError(msg)
    broadcast_shapes(mask=tuple(mask.shape), logits=logits)


def check_terms(q: Any, call: Call, /, **terms: Any) -> None:
    """Validate score terms (``bias=...``, ``position=...``) against the call, on the host.

    Each given term is a floating array of `q`'s library and dtype that
    broadcasts with the logits, ``(*batch, t_q, t_k)``; a `TypeError` or
    `ValueError` names it.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((2, 3))
    >>> call = resolve_call(q, k, v, scale=None, mask=None, causal=None, q_offset=None)
    >>> check_terms(q, call, bias=xp.zeros((3, 2)))
    Traceback (most recent call last):
    ...
    ValueError: shapes do not broadcast: `bias` (3, 2), `logits` (2, 2)
    """
    for name, term in terms.items():
        if term is None:
            continue
        _xp.array_namespace(q, term)
        _xp.check_floating(call.xp, name, term)
        _xp.check_same_dtype(q=q, **{name: term})
        broadcast_shapes(**{name: tuple(term.shape)}, logits=(*call.batch, call.t_q, call.t_k))


F = TypeVar("F", bound=Callable[..., Any])


def computes_in_float32(function: F) -> F:
    """Run `function` in float32 when its floating arrays are all of one 16-bit dtype.

    The conventions' rule for float16 and bfloat16, as fused kernels apply
    it: the inputs are taken as they are (already rounded), every product,
    logit and softmax is computed in float32, and each floating result is
    returned in the inputs' dtype. So a 16-bit call never overflows where a
    float32 accumulation would not (``q . k`` of 255s in float16, say). Calls
    whose floating arrays mix dtypes or libraries go through unchanged, to be
    refused by the function's own checks.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.attention import attention
    >>> q = k = v = np.full((3, 4), 255.0, dtype=np.float16)
    >>> attention(q, k, v)  # q . k = 260100 overflows float16; float32 does not
    array([[255., 255., 255., 255.],
           [255., 255., 255., 255.],
           [255., 255., 255., 255.]], dtype=float16)
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        floating = [a for a in (*args, *kwargs.values()) if _is_floating_array(a)]
        if not floating:
            return function(*args, **kwargs)
        try:
            xp = _xp.array_namespace(*floating)
        except TypeError:
            return function(*args, **kwargs)
        # Compare dtypes only within one library (a strict dtype warns when
        # compared with a NumPy one).
        dtype = floating[0].dtype
        if any(a.dtype != dtype for a in floating[1:]):
            return function(*args, **kwargs)
        if not xp.isdtype(dtype, "real floating") or xp.finfo(dtype).bits != 16:
            return function(*args, **kwargs)

        def widen(a: Any) -> Any:
            return xp.astype(a, xp.float32) if _is_floating_array(a) else a

        out = function(*map(widen, args), **{k: widen(a) for k, a in kwargs.items()})
        if isinstance(out, tuple):
            return tuple(_narrow(xp, x, dtype) for x in out)
        if isinstance(out, dict):  # gradients by argument name
            return {name: _narrow(xp, x, dtype) for name, x in out.items()}
        return _narrow(xp, out, dtype)

    return wrapper  # type: ignore[return-value]


def _is_floating_array(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    if dtype is None or not hasattr(x, "shape"):
        return False
    try:
        return _xp.array_namespace(x).isdtype(dtype, "real floating")
    except TypeError:
        return False


def _narrow(xp: Any, x: Any, dtype: Any) -> Any:
    return xp.astype(x, dtype) if _is_floating_array(x) else x
