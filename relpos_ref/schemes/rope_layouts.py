r"""Where RoPE's rotated features sit, how they pair, and the weight permutation between pairings.

Of a head of ``d`` features, ``R = rotary_dim`` turn and ``d - R`` pass
through. ``rotary_at`` says which:

- ``"front"`` (GPT-NeoX, Phi, Gemma's partial rotary): features ``0 .. R - 1``;
- ``"tail"`` (DeepSeek MLA's ``cat(q_pass, q_rot)``): features ``d - R .. d - 1``.

Within the rotated features, ``layout`` pairs them: ``"half"`` pairs ``c``
and ``c + R/2``, ``"interleaved"`` ``2c`` and ``2c + 1``. A model trained in
one pairing runs in the other once the rows of its ``W_q`` and ``W_k`` (and
biases) are permuted per head: llama.cpp's converter turns transformers'
half pairs into interleaved ones (``reshape(h, 2, R/2, ...).swapaxes(1, 2)``),
transformers' Llama converter Meta's interleaved ones into half. Then
:math:`q' = P q`, :math:`k' = P k` for a permutation :math:`P` that maps pair
``c`` of one layout to pair ``c`` of the other, both turn by the same angle,
and :math:`q' \cdot k' = q \cdot k`: the logits are the same
(`rope_permutation`, `convert_rope_weights`).
"""

from __future__ import annotations

from typing import Any

from .. import _xp
from .._validate import as_int, check_choice, positive_int
from .rope_angles import rotary_width

__all__ = ["ROPE_LAYOUTS", "ROTARY_AT", "convert_rope_weights", "rope_permutation",
           "rotated_span", "turn"]

ROPE_LAYOUTS = ("half", "interleaved")

#: Where the rotated features sit in the head: first (the common case) or last (DeepSeek MLA).
ROTARY_AT = ("front", "tail")


def rotated_span(d: int, rotary_dim: int, rotary_at: str) -> tuple[int, int]:
    """First and one-past-last rotated feature of a head of `d`.

    Examples
    --------
    >>> rotated_span(10, 4, "front"), rotated_span(10, 4, "tail")
    ((0, 4), (6, 10))
    """
    check_choice("rotary_at", rotary_at, ROTARY_AT)
    return (0, rotary_dim) if rotary_at == "front" else (d - rotary_dim, d)


def turn(x: Any, cos: Any, sin: Any, *, rotary_dim: int, layout: str,
         rotary_at: str) -> Any:
    """Turn the pairs of `x`'s rotated features by ``(cos, sin)``, ``(..., t, R/2)``.

    A pair ``(a, b)`` becomes ``(a cos - b sin, b cos + a sin)``; the other
    features pass through, in place.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[5.0, 1.0, 0.0]])
    >>> turn(x, xp.asarray([[0.0]]), xp.asarray([[1.0]]), rotary_dim=2, layout="half",
    ...      rotary_at="tail")  # a quarter turn of (1, 0), feature 0 passes
    Array([[5., 0., 1.]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x)
    d = x.shape[-1]
    lo, hi = rotated_span(d, rotary_dim, rotary_at)
    half = rotary_dim // 2
    if layout == "half":
        a, b = x[..., lo:lo + half], x[..., lo + half:hi]
        turned = [a * cos - b * sin, b * cos + a * sin]
    else:
        a, b = x[..., lo:hi:2], x[..., lo + 1:hi:2]
        pairs = xp.stack([a * cos - b * sin, b * cos + a * sin], axis=-1)
        turned = [xp.reshape(pairs, (*pairs.shape[:-2], rotary_dim))]
    parts = ([x[..., :lo]] if lo else []) + turned + ([x[..., hi:]] if hi < d else [])
    return xp.concat(parts, axis=-1) if len(parts) > 1 else parts[0]


def rope_permutation(
    d: int,
    /,
    *,
    source: str,
    target: str,
    rotary_dim: int | None = None,
    rotary_at: str = "front",
) -> tuple[int, ...]:
    """Feature order taking one head from one pairing to the other.

    From `source` to `target`.

    ``x_target = x_source[..., perm]``: feature ``f`` of the target layout
    is feature ``perm[f]`` of the source, so that pair ``c`` of one is pair
    ``c`` of the other; pass-through features stay.

    Parameters
    ----------
    d : int
        Head width.
    source, target : {"half", "interleaved"}
    rotary_dim : int, optional
        Rotated features (even, ``<= d``); default ``d``.
    rotary_at : {"front", "tail"}, optional

    Returns
    -------
    tuple of int
        A permutation of ``0 .. d - 1``.

    Examples
    --------
    >>> rope_permutation(6, source="half", target="interleaved")
    (0, 3, 1, 4, 2, 5)
    >>> rope_permutation(6, source="interleaved", target="half", rotary_dim=4, rotary_at="tail")
    (0, 1, 2, 4, 3, 5)
    """
    d = positive_int("d", d)
    check_choice("source", source, ROPE_LAYOUTS)
    check_choice("target", target, ROPE_LAYOUTS)
    rd = rotary_width(d, rotary_dim)
    lo, hi = rotated_span(d, rd, rotary_at)
    half = rd // 2
    if source == target:
        inner = list(range(rd))
    elif source == "half":  # interleaved 2c <- half c, 2c + 1 <- half c + R/2
        inner = [c + s * half for c in range(half) for s in (0, 1)]
    else:  # half c <- interleaved 2c, half c + R/2 <- interleaved 2c + 1
        inner = [2 * c + s for s in (0, 1) for c in range(half)]
    return (*range(lo), *(lo + f for f in inner), *range(hi, d))


def convert_rope_weights(
    w: Any,
    /,
    *,
    head_dim: int,
    source: str,
    target: str,
    rotary_dim: int | None = None,
    rotary_at: str = "front",
    axis: int = 0,
) -> Any:
    r"""Permute the per-head rows of a query or key projection to another pairing.

    The output rows of ``W_q`` or ``W_k`` (or their bias), head by head:

    .. math:: W'[h\,d + f] = W[h\,d + \pi(f)], \qquad \pi = \texttt{rope\_permutation}

    Queries and keys projected with the result and rotated with the
    `target` layout give the same logits as the original weights with the
    `source` layout (the rotated features are the same numbers, reordered).

    Parameters
    ----------
    w : array
        Heads stacked along `axis`, ``head_dim`` features each (``W_q`` of
        shape ``(h * head_dim, d_model)`` with ``axis=0``, a bias ``(h * head_dim,)``).
    head_dim : int
    source, target : {"half", "interleaved"}
    rotary_dim, rotary_at
        As in `rope_permutation`.
    axis : int, optional
        The axis of the heads' features.

    Returns
    -------
    array
        Same shape, dtype and device as `w`, a fresh array.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> w = xp.reshape(xp.arange(8.0), (8, 1))  # two heads of four
    >>> xp.reshape(convert_rope_weights(w, head_dim=4, source="half", target="interleaved"),
    ...            (8,))
    Array([0., 2., 1., 3., 4., 6., 5., 7.], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(w)
    head_dim = positive_int("head_dim", head_dim)
    axis = as_int("axis", axis)
    if not -w.ndim <= axis < w.ndim:
        msg = (f"`axis` must be in -{w.ndim} .. {w.ndim - 1} for `w` of shape "
               f"{tuple(w.shape)}, got {axis}")
        raise ValueError(msg)
    size = w.shape[axis]
    if size is None or size % head_dim:
        msg = (f"`w` must have a multiple of `head_dim` = {head_dim} features along axis "
               f"{axis}, got shape {tuple(w.shape)}")
        raise ValueError(msg)
    perm = rope_permutation(head_dim, source=source, target=target, rotary_dim=rotary_dim,
                            rotary_at=rotary_at)
    index = [h * head_dim + f for h in range(size // head_dim) for f in perm]
    dev = _xp.device(w)
    return xp.take(w, xp.asarray(index, dtype=_xp.index_dtype(xp, dev), device=dev),
                   axis=axis % w.ndim)
