r"""RoPE's planted mistakes: the field's errors in scaling, pairing and angles.

`relpos_ref.golden.diagnose.variants` adds these to a RoPE case's variants,
where they apply (each changes only the case's RoPE options):

- ``attention-factor-once``: the attention factor :math:`a` of YaRN or
  LongRoPE applied once to the logits (to ``q`` only, or to the logits
  instead of to cos and sin of both), so the rotated part of every logit is
  multiplied by :math:`a` instead of :math:`a^2`; planted as the factor
  :math:`\sqrt a` on cos and sin;
- ``attention-factor-squared-twice``: :math:`a^2` on cos and sin (logits by
  :math:`a^4`), the factor squared before it multiplies them;
- ``yarn-mscale-missing``: YaRN's attention factor left out (1);
  ``softmax-mscale-missing``: DeepSeek's :math:`m^2` on the softmax scale
  left out (``softmax_mscale=True`` cases);
- ``partial-rotary-whole-head``: the whole head rotated, the rotary width
  ignored (cases with ``rotary_dim < d``);
- ``pairing-swapped``: NeoX's half-split pairs for GPT-J's interleaved ones,
  or the other way round;
- ``longrope-wrong-switch``: LongRoPE's short factors where the long ones
  apply and the other way round (the switch taken at the wrong length);
- ``float32-angles``: the angles formed in float32 (``angles="float32"``)
  where the case's are exact, or ``float64-angles`` the other way round;
  only where a position reaches `ANGLE_POSITIONS`, beyond which a float32
  angle is off by up to :math:`2^{-8}` rad per unit of frequency (below it,
  by less than 16-bit rounding moves an output).

xPos's cases (`xpos_variants`) try ``pairing-swapped`` and
``partial-rotary-whole-head`` as RoPE's do, and the decay's own mistakes:

- ``xpos-decay-missing``: the rotation without xPos's scales (plain RoPE
  with xPos's pairing); planted as ``scale_base = 1e300``, whose scales are 1;
- ``xpos-decay-inverted``: queries scaled by :math:`\zeta^{-(n - o)/\gamma}`
  and keys by :math:`\zeta^{(m - o)/\gamma}` (the two sides swapped), so a
  past key is amplified instead of damped; planted as the operands so scaled,
  through plain attention (no argument of `xpos_attention` expresses it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..schemes import xpos
from ..schemes.rope_scaling import attention_factor, call_length, check_scaling

if TYPE_CHECKING:
    from .diagnose import Call

__all__ = ["ANGLE_POSITIONS", "rope_variants", "xpos_variants"]

#: xPos's rotation arguments, as `relpos_ref.schemes.xpos.xpos_rotate` takes them.
_XPOS_ROTATION = xpos.ROTATION

#: The largest position from which the angle variants are tried: ``2**16``.
ANGLE_POSITIONS = 2**16


def _with(call: Call, **changes: Any) -> Call:
    return call.replace(kwargs={**call.kwargs, **changes})


def _rotation_variants(call: Call, params: Mapping[str, Any], *,
                       default_layout: str) -> Iterator[tuple[str, Call]]:
    # the rotation's own mistakes, RoPE's and xPos's: the rotary width, the pairing
    rotary_dim = params.get("rotary_dim")
    if rotary_dim is not None and rotary_dim < params["d"]:
        yield "partial-rotary-whole-head", _with(call, rotary_dim=None)
    layout = call.kwargs.get("layout", default_layout)
    yield "pairing-swapped", _with(
        call, layout="interleaved" if layout == "half" else "half")


def rope_variants(call: Call, params: Mapping[str, Any]) -> Iterator[tuple[str, Call]]:
    """RoPE's planted-mistake calls that apply to a case, as ``(name, call)``.

    Parameters
    ----------
    call : Call
        The case's call (`relpos_ref.golden.diagnose.Call`).
    params : mapping
        The case's parameters.

    Examples
    --------
    >>> from relpos_ref.golden.diagnose import Call
    >>> call = Call(None, None, None, {}, None, {"scale": 0.25, "layout": "half",
    ...             "scaling": {"rope_type": "yarn", "factor": 8.0,
    ...                         "original_max_position_embeddings": 64}})
    >>> params = {"d": 16, "rotary_dim": None, "t_q": 4, "t_k": 8, "q_offset": 4}
    >>> [name for name, _ in rope_variants(call, params)]  # doctest: +NORMALIZE_WHITESPACE
    ['attention-factor-once', 'attention-factor-squared-twice', 'yarn-mscale-missing',
     'pairing-swapped']
    """
    given = call.kwargs.get("scaling")
    rule = check_scaling(given)
    kind = rule["rope_type"]
    factor = attention_factor(rule)
    if factor != 1.0:
        for name, value in (("attention-factor-once", math.sqrt(factor)),
                            ("attention-factor-squared-twice", factor**2)):
            yield name, _with(call, scaling={**given, "attention_factor": value})
        if kind == "yarn":
            yield "yarn-mscale-missing", _with(call, scaling={**given, "attention_factor": 1.0})
    if kind == "yarn" and rule["softmax_mscale"]:
        yield "softmax-mscale-missing", _with(call, scaling={**given, "softmax_mscale": False})
    yield from _rotation_variants(call, params, default_layout="half")
    if kind == "longrope":
        yield "longrope-wrong-switch", _with(
            call, scaling={**given, "short_factor": given["long_factor"],
                           "long_factor": given["short_factor"]})
    if max(params["t_k"], params["q_offset"] + params["t_q"]) - 1 < ANGLE_POSITIONS:
        return
    if call.kwargs.get("angles", "float64") == "float64":
        yield "float32-angles", _with(call, angles="float32")
    else:
        yield "float64-angles", _with(call, angles="float64")


def xpos_variants(call: Call, params: Mapping[str, Any]) -> Iterator[tuple[str, Call]]:
    """xPos's planted-mistake calls that apply to a case, as ``(name, call)``.

    Parameters
    ----------
    call : Call
        The case's call (`relpos_ref.golden.diagnose.Call`), float64 NumPy arrays.
    params : mapping
        The case's parameters.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.golden.diagnose import Call
    >>> q = k = v = np.ones((3, 4))
    >>> call = Call(q, k, v, {}, None, {"scale": 0.5, "q_offset": 0})
    >>> params = {"d": 4, "rotary_dim": None, "t_q": 3, "t_k": 3}
    >>> [name for name, _ in xpos_variants(call, params)]
    ['pairing-swapped', 'xpos-decay-missing', 'xpos-decay-inverted']
    """
    yield from _rotation_variants(call, params, default_layout="interleaved")
    yield "xpos-decay-missing", _with(call, scale_base=1e300)
    yield "xpos-decay-inverted", _decay_inverted(call)


def _decay_inverted(call: Call) -> Call:
    # queries scaled as keys are and keys as queries are, about the call's centre; then
    # plain attention on them (a decode plan slices these rows and keys per step)
    import numpy as np

    rotation = {n: call.kwargs[n] for n in _XPOS_ROTATION if n in call.kwargs}
    t_q, t_k = call.q.shape[-2], call.k.shape[-2]
    q_offset = call.kwargs.get("q_offset")
    q_offset = 0 if q_offset is None else q_offset
    length = call_length(t_q, t_k, q_offset)
    q = xpos.xpos_rotate(call.q, offset=q_offset, key=True, length=length, **rotation)
    k = xpos.xpos_rotate(call.k, offset=0, key=False, length=length, **rotation)
    plain = {n: value for n, value in call.kwargs.items() if n not in _XPOS_ROTATION}
    return call.replace(q=q, k=k, kwargs=plain, bias=np.zeros((t_q, t_k)))
