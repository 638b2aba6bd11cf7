r"""Rotary position embedding, RoPE (Su et al. 2021).

Queries and keys are rotated by an angle proportional to their position, so
that ``q . k`` depends on positions only through ``r``:

.. math:: \langle R_{p_q} q,\, R_{p_k} k \rangle = \langle q,\, R_{p_k - p_q} k \rangle
          = \langle q,\, R_{r} k \rangle

The first ``rotary_dim`` features form ``rotary_dim / 2`` pairs; pair ``c``
turns by ``p θ_c`` with ``θ_c = base^{-2c / rotary_dim}``; features beyond
``rotary_dim`` pass through. Two pairings are in use:

- ``"interleaved"`` (the paper, GPT-J, Mesh-TF): pair ``c`` is features
  ``(2c, 2c + 1)``;
- ``"half"`` (GPT-NeoX, LLaMA in HF transformers): pair ``c`` is features
  ``(c, c + rotary_dim / 2)``.

A pair ``(a, b)`` becomes ``(a cos φ - b sin φ, b cos φ + a sin φ)``.
Positions are ``p_q = i + q_offset`` and ``p_k = j``.

The angles ``p θ_c`` and their cosines and sines are computed in float64
wherever the arrays' device has it, and rounded once to the arrays' dtype:
in float32 the position ``2**24 + 1`` would be ``2**24``, and ``p θ`` would
carry the rounding of ``θ`` times ``p``. Positions beyond ``2**53`` (or, on
a device without float64, beyond what the dtype holds exactly: ``2**24`` in
float32) are refused (`relpos_ref._exact`).

Multi-axis positions (``positions``, an integer array per axis, and ``axes``:
M-RoPE's contiguous or interleaved sections, axial RoPE of N axes, RoPE-Mixed's
learned frequencies) are `relpos_ref.schemes.rope_axes`; the rotated part at
the tail of the head (``rotary_at="tail"``, DeepSeek MLA) and the weight
permutation between pairings are `relpos_ref.schemes.rope_layouts`.

Frequency scaling (``scaling``: linear, dynamic NTK, YaRN, LongRoPE, Llama 3,
proportional) changes ``θ_c`` and may multiply the cosines and sines by an
attention factor (`relpos_ref.schemes.rope_scaling`); ``angles="float32"``
forms the angles as float32 arithmetic does (`relpos_ref.schemes.rope_angles`).
Both reach every fast path through `rope_rotate`, which the kernels and the
distance form (`relpos_ref.lowering`) call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _xp
from .._validate import as_int, broadcast_shapes, check_bool, check_choice, nonnegative_int
from ..attention import attention
from ..calls import PLAIN, Call, computes_in_float32, resolve_call
from ..gradients import (
    check_d_output,
    core_vjp,
    forward,
    sum_to_shape,
)
from .rope_angles import (
    ANGLES,
    angle_dtype,
    cos_sin,
    frequencies,
    rope_cos_sin,
    rope_frequencies,
    rotary_width,
)
from .rope_axes import axes_cos_sin, check_axes, check_positions, rope_axes_frequencies
from .rope_layouts import ROPE_LAYOUTS, ROTARY_AT, turn
from .rope_learned import call_frequency_gradient, learned_frequencies
from .rope_scaling import attention_factor, call_length, check_scaling, softmax_factor

__all__ = [
    "ANGLES",
    "DEFAULTS",
    "ROPE_LAYOUTS",
    "ROTARY_AT",
    "ROTATION",
    "angle_dtype",
    "rope_attention",
    "rope_attention_vjp",
    "rope_axes_frequencies",
    "rope_call",
    "rope_cos_sin",
    "rope_frequencies",
    "rope_pair",
    "rope_rotate",
]

#: RoPE's defaults: ``scale = 1/sqrt(d)``, not causal, start-aligned queries.
DEFAULTS = PLAIN

#: `rope_attention`'s options that `rope_rotate` takes too: what the kernels pass on.
ROTATION = ("base", "rotary_dim", "layout", "scaling", "angles", "rotary_at", "axes",
            "positions")


@computes_in_float32
def rope_rotate(
    x: Any,
    /,
    *,
    offset: int = 0,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    scaling: Mapping[str, Any] | None = None,
    angles: str = "float64",
    length: int | None = None,
    inverse: bool = False,
    rotary_at: str = "front",
    axes: Mapping[str, Any] | None = None,
    positions: Any = None,
) -> Any:
    r"""Rotate each row of `x` by its position ``offset + t`` (`inverse`: the transpose).

    .. math:: (x_a, x_b) \mapsto a\,(x_a \cos\varphi - x_b \sin\varphi,\;
              x_b \cos\varphi + x_a \sin\varphi), \qquad \varphi = (\text{offset} + t)\,\theta'_c

    for each pair ``c`` of the first `rotary_dim` features; :math:`\theta'`
    is `rope_frequencies` (scaled by `scaling`), :math:`a` the attention
    factor of `scaling` (1 unless YaRN or LongRoPE). The other features pass
    through, not multiplied by :math:`a`.

    Parameters
    ----------
    x : floating array, shape ``(..., t, d)``
    offset : int, optional
        Position of row 0 (``q_offset`` for queries, 0 for keys).
    base : float, optional
        Frequency base.
    rotary_dim : int, optional
        Rotated features (even, ``<= d``); default all ``d``.
    layout : {"half", "interleaved"}, optional
        Which features form a pair.
    scaling : mapping, optional
        The frequency rule, named as transformers' ``rope_parameters``
        (`relpos_ref.schemes.rope_scaling`): ``{"rope_type": "yarn",
        "factor": 4.0, "original_max_position_embeddings": 4096}``, say.
    angles : {"float64", "float32"}, optional
        Exact angles (the golden), or the common float32 computation
        (`relpos_ref.schemes.rope_angles`).
    length : int, optional
        The call's length (largest position + 1), for the rules that read it
        (``dynamic``, ``longrope`` per call); default ``offset + t``.
        `rope_attention` passes the length of the whole call to both rotations.
    inverse : bool, optional
        Apply the transpose :math:`a R^\top` (the backward pass's): turn the
        other way; the inverse when :math:`a = 1`.
    rotary_at : {"front", "tail"}, optional
        Whether the rotated features are the first `rotary_dim` or the last
        (DeepSeek MLA's ``cat(q_pass, q_rot)``; `relpos_ref.schemes.rope_layouts`).
    axes : mapping, optional
        Multi-axis RoPE (`relpos_ref.schemes.rope_axes`): ``{"axes_type":
        "mrope", "mrope_section": [16, 24, 24]}`` (Qwen2-VL; with
        ``"mrope_interleaved": True`` Qwen3-VL), ``{"axes_type": "axial",
        "axes_dims": [16, 56, 56]}`` (FLUX), ``{"axes_type": "mixed",
        "frequencies": F}`` (RoPE-Mixed, ``F`` of shape ``(..., rotary_dim / 2, n)``).
    positions : integer array, optional
        ``(n_axes, ..., L)``: each token's position per axis; row ``t`` of
        `x` is token ``offset + t``. ``None``: every axis at the token index.

    Returns
    -------
    array
        Same shape, dtype and device as `x`.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> x = xp.asarray([[1.0, 0.0], [1.0, 0.0]])  # positions 0 and 1
    >>> rope_rotate(x, base=1.0)  # θ = 1: turn by 0 and 1 radian
    Array([[1.        , 0.        ],
           [0.54030231, 0.84147098]], dtype=array_api_strict.float64)
    >>> rope_rotate(x, base=1.0, scaling={"rope_type": "linear", "factor": 2.0})[1, ...]  # θ = 1/2
    Array([0.87758256, 0.47942554], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x)
    _xp.check_floating(xp, "x", x)
    check_choice("layout", layout, ROPE_LAYOUTS)
    check_choice("angles", angles, ANGLES)
    check_choice("rotary_at", rotary_at, ROTARY_AT)
    offset = as_int("offset", offset)
    if x.ndim < 2:
        msg = f"`x` must have shape (..., t, d), got shape {tuple(x.shape)}"
        raise ValueError(msg)
    *_, t, d = x.shape
    rd = rotary_width(d, rotary_dim)
    rule = check_axes(axes)
    positions = check_positions(x, positions, rule, rotary_dim=rd, scaling=scaling,
                                needed=offset + t, offset=offset)
    length = max(offset + t, 0) if length is None else nonnegative_int("length", length)
    freqs = frequencies(rd, base=base, scaling=scaling, length=length, angles=angles)
    inverse = check_bool("inverse", inverse)
    if rd == 0:
        return xp.reshape(x, tuple(x.shape), copy=True)  # fresh, bit for bit, autograd-quiet
    factor = attention_factor(check_scaling(scaling))
    if rule is None and positions is None:
        cos, sin = cos_sin(xp, x.dtype, _xp.device(x), offset=offset, t=t, freqs=freqs,
                           angles=angles, factor=factor)
    else:
        cos, sin = axes_cos_sin(x, positions=positions, rule=rule, offset=offset,
                                rotary_dim=rd, base=base, scaling=scaling, length=length,
                                angles=angles, factor=factor)
    if inverse:
        sin = -sin
    return turn(x, cos, sin, rotary_dim=rd, layout=layout, rotary_at=rotary_at)


def rope_call(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    scaling: Mapping[str, Any] | None = None,
    angles: str = "float64",
    rotary_at: str = "front",
    axes: Mapping[str, Any] | None = None,
    positions: Any = None,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> Call:
    """Validate a `rope_attention` call and resolve its defaults (shared with the kernels).

    The call's scale is `scale` (default ``1/sqrt(d)``) times the softmax
    factor of `scaling` (DeepSeek's ``mscale**2``; 1 for every other rule,
    `relpos_ref.schemes.rope_scaling.softmax_factor`).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.zeros((3, 4))
    >>> rope_call(q, k, v, q_offset=2).q_offset
    2
    """
    call = resolve_call(
        q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset, defaults=DEFAULTS
    )
    check_choice("layout", layout, ROPE_LAYOUTS)
    check_choice("angles", angles, ANGLES)
    check_choice("rotary_at", rotary_at, ROTARY_AT)
    rule = check_scaling(scaling)
    length = call_length(call.t_q, call.t_k, call.q_offset)
    rd = rotary_width(q.shape[-1], rotary_dim)
    rope_frequencies(rd, base=base, scaling=rule, length=length)
    for name, x, offset in (("q", q, call.q_offset), ("k", k, 0)):
        given = check_positions(x, positions, check_axes(axes), rotary_dim=rd, scaling=rule,
                                needed=length, offset=offset, offset_name="q_offset",
                                name=name)
    angle_dtype(call.xp, q.dtype, _xp.device(q), offset=call.q_offset, t=call.t_q,
                name="q_offset", t_other=call.t_k)
    # the output's batch: learned frequencies (..., R/2, n) and positions (n, ..., L) may
    # carry batch axes that q, k and v lack
    rotation_batch = {}
    table = learned_frequencies(axes)
    if table is not None:
        rotation_batch['axes["frequencies"]'] = tuple(table.shape[:-2])
    if given is not None:
        rotation_batch["positions"] = tuple(given.shape[1:-1])
    if rotation_batch:
        call = call._replace(batch=broadcast_shapes(q=tuple(call.batch), **rotation_batch))
    factor = softmax_factor(rule)
    return call if factor == 1.0 else call._replace(scale=call.scale * factor)


def rope_pair(q: Any, k: Any, call: Call, /, *, inverse: bool = False,
              **rotation: Any) -> tuple[Any, Any]:
    """`q` rotated at ``call.q_offset`` and `k` at 0, both for the call's length.

    `rotation` holds `rope_rotate`'s ``base``, ``rotary_dim``, ``layout``,
    ``scaling`` and ``angles``; the length is the whole call's
    (`relpos_ref.schemes.rope_scaling.call_length`), so the rules that read
    it give queries and keys the same frequencies. `rope_attention`, its
    backward pass and the kernels rotate through here.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.ones((1, 2))
    >>> call = rope_call(q, k, v, q_offset=1)
    >>> rope_pair(q, k, call, base=1.0)[0]  # one radian
    Array([[-0.30116868,  1.38177329]], dtype=array_api_strict.float64)
    """
    length = call_length(call.t_q, call.t_k, call.q_offset)
    return (rope_rotate(q, offset=call.q_offset, length=length, inverse=inverse, **rotation),
            rope_rotate(k, offset=0, length=length, inverse=inverse, **rotation))


@computes_in_float32
def rope_attention(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    scaling: Mapping[str, Any] | None = None,
    angles: str = "float64",
    rotary_at: str = "front",
    axes: Mapping[str, Any] | None = None,
    positions: Any = None,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    return_weights: bool = False,
) -> Any:
    r"""Attention on rotated queries and keys.

    .. math:: w = \operatorname{softmax}\bigl(s\, (R_{i + q_\text{offset}} q_i)
              \cdot (R_j k_j)\bigr)

    Parameters
    ----------
    q, k, v : floating arrays ``(..., t_q, d)``, ``(..., t_k, d)``, ``(..., t_k, d_v)``
    base, rotary_dim, layout, scaling, angles, rotary_at, axes
        As in `rope_rotate`; a rule that reads the length reads the call's,
        ``max(t_k, q_offset + t_q)``, for queries and keys alike.
    positions : integer array, optional
        ``(n_axes, ..., L)``, ``L >= max(t_k, q_offset + t_q)``: the position
        per axis of each token of the call; key ``j`` is token ``j``, query
        ``i`` token ``i + q_offset`` (`relpos_ref.schemes.rope_axes`).
    scale, mask, causal, q_offset, return_weights
        As in `relpos_ref.attention` (defaults `DEFAULTS`); `q_offset` also
        sets the queries' rotation (``t_k - t_q`` when decoding with a cache).
        With YaRN's ``softmax_mscale`` the scale (given or default) is
        multiplied by DeepSeek's ``mscale**2``.

    Returns
    -------
    out : array ``(..., t_q, d_v)``, and the weights with ``return_weights=True``.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(4)
    >>> rope_attention(q, k, v, causal=True).shape
    (4, 4)
    """
    rotation = {"base": base, "rotary_dim": rotary_dim, "layout": layout, "scaling": scaling,
                "angles": angles, "rotary_at": rotary_at, "axes": axes, "positions": positions}
    call = rope_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                     **rotation)
    q_rot, k_rot = rope_pair(q, k, call, **rotation)
    return attention(
        q_rot, k_rot, v, scale=call.scale, mask=mask, causal=call.causal,
        q_offset=call.q_offset, return_weights=return_weights,
    )


@computes_in_float32
def rope_attention_vjp(
    q: Any,
    k: Any,
    v: Any,
    /,
    *,
    d_output: Any,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    layout: str = "half",
    scaling: Mapping[str, Any] | None = None,
    angles: str = "float64",
    rotary_at: str = "front",
    axes: Mapping[str, Any] | None = None,
    positions: Any = None,
    scale: float | None = None,
    mask: Any = None,
    causal: bool | None = None,
    q_offset: int | None = None,
) -> dict[str, Any]:
    r"""Gradients of `rope_attention` for the output's cotangent `d_output` (a VJP).

    .. math:: \bar{q}_i = R_{i + q_\text{offset}}^\top\, \bar{\tilde{q}}_i, \qquad
              \bar{k}_j = R_j^\top\, \bar{\tilde{k}}_j

    where :math:`\bar{\tilde{q}}, \bar{\tilde{k}}` are plain attention's
    gradients at the rotated queries and keys, and :math:`R^\top` is the
    rotation's transpose (``rope_rotate(..., inverse=True)``; with an
    attention factor :math:`a`, :math:`a` times the opposite turn).

    Parameters
    ----------
    q, k, v, base, rotary_dim, layout, scaling, angles, rotary_at, axes, positions
        As in `rope_attention`.
    scale, mask, causal, q_offset
        As in `rope_attention`.
    d_output : floating array, shape ``(..., t_q, d_v)``
        :math:`\partial L / \partial\,\text{out}`; same dtype as `q`.

    Returns
    -------
    dict
        The gradient with respect to each of ``q``, ``k`` and ``v``, of its shape and
        dtype, and ``"frequencies"``, that of RoPE-Mixed's learned ``axes["frequencies"]``
        where they are an array (`relpos_ref.schemes.rope_learned`).

    Examples
    --------
    >>> import array_api_strict as xp
    >>> q = k = v = xp.eye(2)
    >>> rope_attention_vjp(q, k, v, d_output=xp.zeros((2, 2)))["q"]
    Array([[0., 0.],
           [0., 0.]], dtype=array_api_strict.float64)
    """
    rotation = {"base": base, "rotary_dim": rotary_dim, "layout": layout, "scaling": scaling,
                "angles": angles, "rotary_at": rotary_at, "axes": axes, "positions": positions}
    call = rope_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                     **rotation)
    check_d_output(d_output, q, call, v.shape[-1], mask=mask)
    q_rot, k_rot = rope_pair(q, k, call, **rotation)
    fwd = forward(q_rot, k_rot, call, mask=mask)
    core = core_vjp(q_rot, k_rot, v, d_output, call, fwd)
    # turned back, then summed over the axes broadcast: the rotations may differ along
    # them (batched positions or learned frequencies)
    dq, dk = rope_pair(core.dq, core.dk, call, inverse=True, **rotation)
    dq, dk = sum_to_shape(dq, q.shape), sum_to_shape(dk, k.shape)
    grads = {"q": dq, "k": dk, "v": sum_to_shape(core.dv, v.shape)}
    learned = call_frequency_gradient(  # RoPE-Mixed's learned frequencies, given as an array
        q, call, [(core.dq, q_rot, call.q_offset), (core.dk, k_rot, 0)], rotation)
    if learned is not None:
        grads["frequencies"] = learned
    return grads
