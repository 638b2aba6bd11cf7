r"""Multi-axis RoPE: an integer position per axis, each rotated pair turning with its axes.

A token carries ``n`` integer positions :math:`p_0 .. p_{n-1}` (time, height,
width, ...): the option ``positions``, an integer array of shape
``(n, ..., L)`` whose entry ``[a, ..., j]`` is axis ``a``'s position of token
``j``. Key ``j`` is token ``j`` and query ``i`` is token ``i + q_offset``, as
in 1-D RoPE; the ``...`` broadcast against the leading axes of ``q`` and
``k``. Pair ``c`` of the rotated features turns by

.. math:: \varphi_c = \sum_a F_{ca}\, p_a

with the frequency matrix :math:`F` that the option ``axes`` names by its
``"axes_type"``:

- ``"mrope"`` (Qwen2-VL, Qwen3-VL): the 1-D frequencies :math:`\theta'_c` of
  the rotated width (scaled by ``scaling``), each pair on one axis:
  contiguous sections ``mrope_section = [s_0, s_1, ...]`` (pairs
  ``0 .. s_0 - 1`` on axis 0, the next ``s_1`` on axis 1, ...; the sum is
  ``rotary_dim / 2``), or, with ``mrope_interleaved`` (Qwen3-VL), pair ``c``
  on axis ``a >= 1`` where ``c mod n = a`` and ``c < n s_a``, on axis 0
  otherwise;
- ``"axial"`` (Qwen2-VL's vision tower, EVA-02, FLUX's three axes): axis ``a``
  owns ``axes_dims[a] = d_a`` features, ``d_a / 2`` pairs turning by
  :math:`\theta^{(a)}_c = \sigma_a\,\text{base}^{-2c/d_a}`, the axes' pairs in
  axis order (the sum of ``d_a`` is ``rotary_dim``); :math:`\sigma_a` is
  ``position_scale`` (default 1; EVA-02's interpolated grid of ``ft`` patches
  trained at ``pt``: :math:`\sigma = pt / ft`);
- ``"mixed"`` (RoPE-Mixed, Heo et al. 2024): :math:`F` itself, learned,
  ``frequencies`` of shape ``(..., rotary_dim / 2, n)`` (``(h, R/2, n)``: per
  head), the angle :math:`f^x_c x + f^y_c y` of two axes.

Which features form pair ``c`` is ``layout`` as in 1-D RoPE ("half":
Qwen2-VL and its vision tower; "interleaved": EVA-02, FLUX, RoPE-Mixed).
``positions=None`` puts every axis at the token index (M-RoPE's text tokens),
where ``"mrope"`` is 1-D RoPE. Without ``axes``, ``positions`` of one axis,
``(1, ..., L)``, place 1-D RoPE's tokens anywhere (packed sequences).

Angles are formed in float64 (``angles="float64"``) or as float32 arithmetic
forms them, ``fl32(fl32(p) fl32(F))`` summed in float32 (``"float32"``). A
positions array is not read on the host, so its values are not checked
against :math:`2^{53}` (:math:`2^{24}` on a device without float64); a rule
that reads the call's length (``dynamic``, ``longrope`` per call) is refused
with positions, whose largest value the host does not know.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import array_api_compat

from .. import _xp
from .._validate import as_float, broadcast_shapes, check_bool, check_choice
from .rope_angles import angle_dtype, frequencies
from .rope_float32 import f32, float32_frequencies
from .rope_scaling import check_scaling, reads_length

__all__ = ["AXES_TYPES", "axes_cos_sin", "axes_count", "check_axes", "check_positions",
           "rope_axes_frequencies"]

#: The multi-axis rules: contiguous or interleaved M-RoPE, axial (N axes), learned mixed.
AXES_TYPES = ("mrope", "axial", "mixed")

_FIELDS = {"mrope": ("mrope_section", "mrope_interleaved"),
           "axial": ("axes_dims", "position_scale"),
           "mixed": ("frequencies",)}


def _int_list(name: str, value: Any, *, even: bool) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        msg = f"`{name}` must be a non-empty list of integers, got {value!r}"
        raise ValueError(msg)
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0 or (
                even and (v <= 0 or v % 2)):
            what = "even integers > 0" if even else "integers >= 0"
            msg = f"`{name}` must hold {what}, got {list(value)!r}"
            raise ValueError(msg)
    return tuple(int(v) for v in value)


def _nested_shape(name: str, value: Any) -> tuple[int, ...]:
    if array_api_compat.is_array_api_obj(value):
        return tuple(value.shape)
    return _walked_shape(name, value)


def _walked_shape(name: str, value: Any) -> tuple[int, ...]:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        msg = f"`{name}` must be an array or nested lists of numbers, got {value!r}"
        raise ValueError(msg)
    shapes = {_walked_shape(name, v) for v in value}
    if len(shapes) != 1:
        msg = f"`{name}` must be rectangular, got rows of shapes {sorted(shapes)}"
        raise ValueError(msg)
    return (len(value), *shapes.pop())


def check_axes(axes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Validate an `axes` option and complete it with its defaults (``None``: 1-D RoPE).

    Raises
    ------
    ValueError
        Naming the field and the value received.

    Examples
    --------
    >>> check_axes({"axes_type": "mrope", "mrope_section": [2, 1, 1]})
    {'axes_type': 'mrope', 'mrope_section': (2, 1, 1), 'mrope_interleaved': False}
    >>> check_axes({"axes_type": "axial", "axes_dims": [4, 3]})
    Traceback (most recent call last):
    ...
    ValueError: `axes["axes_dims"]` must hold even integers > 0, got [4, 3]
    """
    if axes is None:
        return None
    if not isinstance(axes, Mapping):
        msg = f"`axes` must be a mapping with an 'axes_type' (or None), got {axes!r}"
        raise ValueError(msg)
    kind = check_choice('axes["axes_type"]', axes.get("axes_type"), AXES_TYPES)
    extra = sorted(set(axes) - set(_FIELDS[kind]) - {"axes_type"}, key=str)
    if extra:
        msg = (f"`axes` of axes_type {kind!r} takes the fields {', '.join(_FIELDS[kind])}; "
               f"got {', '.join(repr(e) for e in extra)}")
        raise ValueError(msg)
    out: dict[str, Any] = {"axes_type": kind}
    if kind == "mrope":
        out["mrope_section"] = _int_list('axes["mrope_section"]', axes.get("mrope_section"),
                                         even=False)
        out["mrope_interleaved"] = check_bool('axes["mrope_interleaved"]',
                                              axes.get("mrope_interleaved", False))
    elif kind == "axial":
        dims = _int_list('axes["axes_dims"]', axes.get("axes_dims"), even=True)
        scale = axes.get("position_scale")
        scales = [1.0] * len(dims) if scale is None else (
            [scale] * len(dims) if isinstance(scale, numbers.Real) else scale)
        if isinstance(scales, (str, bytes)) or not isinstance(scales, Sequence) or len(
                scales) != len(dims):
            msg = (f'`axes["position_scale"]` must be a number or one per axis '
                   f"({len(dims)}), got {scale!r}")
            raise ValueError(msg)
        scales = [as_float('axes["position_scale"]', s) for s in scales]
        if not all(s > 0 for s in scales):
            msg = f'`axes["position_scale"]` must be > 0, got {scale!r}'
            raise ValueError(msg)
        out.update(axes_dims=dims, position_scale=tuple(scales))
    else:
        shape = _nested_shape('axes["frequencies"]', axes.get("frequencies"))
        if len(shape) < 2 or shape[-1] < 1:
            msg = (f'`axes["frequencies"]` must have shape (..., rotary_dim / 2, n_axes), '
                   f"got shape {shape}")
            raise ValueError(msg)
        out["frequencies"] = axes["frequencies"]
    return out


def axes_count(rule: Mapping[str, Any] | None) -> int:
    """The number of position axes of a checked `axes` (1 for ``None``).

    Examples
    --------
    >>> axes_count(check_axes({"axes_type": "axial", "axes_dims": [4, 4]}))
    2
    """
    if rule is None:
        return 1
    if rule["axes_type"] == "mrope":
        return len(rule["mrope_section"])
    if rule["axes_type"] == "axial":
        return len(rule["axes_dims"])
    return _nested_shape('axes["frequencies"]', rule["frequencies"])[-1]


def _pair_axes(rule: Mapping[str, Any], pairs: int) -> list[int]:
    section = rule["mrope_section"]
    if sum(section) != pairs:
        msg = (f'`axes["mrope_section"]` must sum to rotary_dim / 2 = {pairs}, got '
               f"{list(section)} (sum {sum(section)})")
        raise ValueError(msg)
    n = len(section)
    if rule["mrope_interleaved"]:
        return [c % n if c % n and c < n * section[c % n] else 0 for c in range(pairs)]
    return [a for a, s in enumerate(section) for _ in range(s)]


def rope_axes_frequencies(
    rotary_dim: int,
    /,
    *,
    axes: Mapping[str, Any] | None,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    length: int | None = None,
    angles: str = "float64",
) -> tuple[tuple[int, float], ...]:
    r"""Each rotated pair's axis and frequency, for the mrope and axial rules.

    ``(a_c, θ_c)``: the row of :math:`F` with its one nonzero entry (module docstring);
    ``"mixed"`` has no fixed frequencies (they are learned) and is refused.

    Parameters
    ----------
    rotary_dim : int
        Rotated features ``R``, even.
    axes : mapping or None
        As in `relpos_ref.rope_rotate` (``None``: every pair on axis 0).
    base, scaling, length, angles
        As in `relpos_ref.rope_rotate`; ``scaling`` applies to ``"mrope"``
        only (its frequencies are 1-D RoPE's).

    Returns
    -------
    tuple of (int, float)
        ``rotary_dim / 2`` pairs, pair 0 first.

    Examples
    --------
    >>> rope_axes_frequencies(8, axes={"axes_type": "axial", "axes_dims": [4, 4]}, base=100.0)
    ((0, 1.0), (0, 0.1), (1, 1.0), (1, 0.1))
    >>> rope_axes_frequencies(8, axes={"axes_type": "mrope", "mrope_section": [2, 1, 1],
    ...                                "mrope_interleaved": True}, base=100.0)[:3]
    ((0, 1.0), (1, 0.31622776601683794), (2, 0.1))
    """
    rule = check_axes(axes)
    pairs = rotary_dim // 2
    if rule is None or rule["axes_type"] == "mrope":
        thetas = frequencies(rotary_dim, base=base, scaling=scaling, length=length or 0,
                             angles=angles)
        owners = [0] * pairs if rule is None else _pair_axes(rule, pairs)
        return tuple(zip(owners, thetas, strict=True))
    if rule["axes_type"] == "mixed":
        msg = "`axes` of axes_type 'mixed' has learned frequencies, `axes[\"frequencies\"]`"
        raise ValueError(msg)
    dims = rule["axes_dims"]
    if sum(dims) != rotary_dim:
        msg = (f'`axes["axes_dims"]` must sum to rotary_dim = {rotary_dim}, got {list(dims)} '
               f"(sum {sum(dims)})")
        raise ValueError(msg)
    if check_scaling(scaling)["rope_type"] != "default":
        msg = (f"`scaling` applies to 1-D and 'mrope' frequencies; axes_type 'axial' takes "
               f"`axes[\"position_scale\"]`, got scaling {dict(scaling or {})!r}")
        raise ValueError(msg)
    out = []
    for a, (d_a, sigma) in enumerate(zip(dims, rule["position_scale"], strict=True)):
        if angles == "float32":
            thetas = float32_frequencies(d_a, base=base, scaling={"rope_type": "default"},
                                         length=0)
            out += [(a, f32(t * f32(sigma))) for t in thetas]
        else:
            out += [(a, sigma * base ** (-2.0 * c / d_a)) for c in range(d_a // 2)]
    return tuple(out)


def _check_learned(x: Any, table: Any) -> None:
    # learned frequencies given as an array: `x`'s library, a real floating dtype (any
    # width: float32 frequencies of a 16-bit model are the common case, and the angles are
    # computed wide); a nested list of numbers is made an array of `x`'s namespace
    if not array_api_compat.is_array_api_obj(table):
        return
    name = 'axes["frequencies"]'
    try:
        xp = _xp.array_namespace(x, table)
    except TypeError:
        msg = (f"`{name}` must be an array of the call's library ({type(x).__module__}) or a "
               f"nested list of numbers, got a {type(table).__module__}.{type(table).__name__}")
        raise TypeError(msg) from None
    _xp.check_floating(xp, name, table)


def check_positions(x: Any, positions: Any, rule: Mapping[str, Any] | None, *, rotary_dim: int,
                    scaling: Mapping[str, Any] | None, needed: int, offset: int = 0,
                    offset_name: str = "offset", name: str = "x") -> Any:
    """`positions` as an integer array of `x`'s namespace, checked against the call.

    ``(n, ..., L)``: ``n`` the axes of `rule`, ``L >= needed`` (the call's
    tokens), ``...`` broadcasting with ``x.shape[:-2]``. Also checks the
    pairs against `rotary_dim` (sections, axis widths, learned frequencies).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> check_positions(xp.zeros((3, 2)), [[0, 1, 2]], None, rotary_dim=2, scaling=None,
    ...                 needed=3).shape
    (1, 3)
    """
    xp = _xp.array_namespace(x)
    pairs = rotary_dim // 2
    if rule is not None and rule["axes_type"] == "mixed":
        shape = _nested_shape('axes["frequencies"]', rule["frequencies"])
        if shape[-2] != pairs:
            msg = (f'`axes["frequencies"]` must have shape (..., rotary_dim / 2 = {pairs}, '
                   f"n_axes), got shape {shape}")
            raise ValueError(msg)
        broadcast_shapes(**{name: x.shape[:-1], 'axes["frequencies"]': (*shape[:-2], 1)})
        _check_learned(x, rule["frequencies"])
        if check_scaling(scaling)["rope_type"] != "default":
            msg = (f"`scaling` applies to 1-D and 'mrope' frequencies, not to learned ones; "
                   f"got scaling {dict(scaling or {})!r}")
            raise ValueError(msg)
    elif rule is not None:
        rope_axes_frequencies(rotary_dim, axes=rule, scaling=scaling, length=needed)
    if positions is None:
        return None
    if reads_length(check_scaling(scaling)):
        msg = (f"`positions` leave the call's length (largest position + 1) unknown on the "
               f"host; rope_type {check_scaling(scaling)['rope_type']!r} with policy "
               f"'per_call' reads it: use policy 'fixed'")
        raise ValueError(msg)
    if not array_api_compat.is_array_api_obj(positions):
        positions = xp.asarray(positions, dtype=_xp.index_dtype(xp, _xp.device(x)),
                               device=_xp.device(x))
    _xp.array_namespace(x, positions)
    if not xp.isdtype(positions.dtype, "integral"):
        msg = f"`positions` must have an integer dtype, got {positions.dtype}"
        raise TypeError(msg)
    n = axes_count(rule)
    shape = tuple(positions.shape)
    if len(shape) < 2 or shape[0] != n or shape[-1] < needed:
        msg = (f"`positions` must have shape ({n}, ..., L) with L >= {needed} (one row per "
               f"axis, one column per token), got shape {shape}")
        raise ValueError(msg)
    if offset < 0:
        msg = f"`{offset_name}` must be >= 0 with `positions` (a token index), got {offset}"
        raise ValueError(msg)
    broadcast_shapes(**{name: x.shape[:-2], "positions": shape[1:-1]})
    return positions


def axes_cos_sin(x: Any, *, positions: Any, rule: Mapping[str, Any] | None, offset: int,
                 rotary_dim: int, base: float, scaling: Mapping[str, Any] | None, length: int,
                 angles: str, factor: float) -> tuple[Any, Any]:
    """``a cos φ`` and ``a sin φ`` of rows ``offset ..`` of `x`, ``(..., t, R/2)``, in its dtype.

    `positions` checked (`check_positions`) or ``None`` (every axis at the
    token index); `rule` checked (`check_axes`); `factor` the attention factor.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.zeros((2, 4))
    >>> rule = check_axes({"axes_type": "axial", "axes_dims": [2, 2]})
    >>> c, s = axes_cos_sin(x, positions=xp.asarray([[0, 0], [0, 1]]), rule=rule, offset=0,
    ...                     rotary_dim=4, base=1.0, scaling=None, length=2, angles="float64",
    ...                     factor=1.0)
    >>> s  # row 1 turns its second pair (axis 1) by one radian
    Array([[0.        , 0.        ],
           [0.        , 0.84147098]], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x)
    dev, t = _xp.device(x), x.shape[-2]
    n = axes_count(rule)
    if positions is None:
        wide = angle_dtype(xp, x.dtype, dev, offset=offset, t=t, name="offset")
        token = xp.arange(offset, offset + t, dtype=_xp.index_dtype(xp, dev), device=dev)
        axis_positions = [token] * n
    else:
        wide = xp.float64 if _xp.has_float64(xp, dev) else x.dtype
        axis_positions = [positions[a, ..., offset:offset + t] for a in range(n)]
    work = xp.float32 if angles == "float32" else wide
    if rule is not None and rule["axes_type"] == "mixed":
        table = rule["frequencies"]
        table = (xp.astype(table, work) if array_api_compat.is_array_api_obj(table)
                 else xp.asarray(table, dtype=work, device=dev))
        columns = [table[..., a] for a in range(n)]
    else:
        pairs = rope_axes_frequencies(rotary_dim, axes=rule, base=base, scaling=scaling,
                                      length=length, angles=angles)
        columns = [xp.asarray([th if owner == a else 0.0 for owner, th in pairs], dtype=work,
                              device=dev) for a in range(n)]
    angle = None
    for p, column in zip(axis_positions, columns, strict=True):
        term = xp.astype(p, work)[..., :, None] * column[..., None, :]
        angle = term if angle is None else angle + term
    angle = xp.astype(angle, wide)
    cos, sin = xp.cos(angle), xp.sin(angle)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return xp.astype(cos, x.dtype), xp.astype(sin, x.dtype)
