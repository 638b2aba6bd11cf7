"""The catalog's adapters of RoPE (`relpos_ref._adapters` describes the signatures).

``check`` completes the options with the call's length (a tile, a chunk of
queries or the keys alone rotate with the whole call's), ``rotate`` is the
rotation every fast path reads, ``show`` prints each pair's frequency, and
the ``parse_*`` read the command line's JSON options.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .schemes import rope, rope_axes, rope_scaling

__all__: list[str] = []


#: `rope_rotate`'s options besides the offset: the catalog's, and the call's length.
ROPE_ROTATION = (*rope.ROTATION, "length")


def rope_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = rope.rope_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                          **options)
    # the whole call's length: a tile, a chunk of queries or the keys alone rotate with it
    length = rope_scaling.call_length(call.t_q, call.t_k, call.q_offset)
    return call, {**options, "length": length}


def rope_rotate(q, k, *, q_offset, options):
    rotation = {n: options[n] for n in ROPE_ROTATION if n in options}
    rotation.setdefault("length", rope_scaling.call_length(q.shape[-2], k.shape[-2], q_offset))
    return (rope.rope_rotate(q, offset=q_offset, **rotation),
            rope.rope_rotate(k, **rotation))


def parse_scaling(text: str) -> dict[str, Any]:
    """A `scaling` option from JSON text (the command line's ``--scaling``), checked.

    Examples
    --------
    >>> parse_scaling('{"rope_type": "linear", "factor": 2}')
    {'rope_type': 'linear', 'factor': 2}
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"`scaling` must be a JSON object, got {text!r} ({exc})"
        raise ValueError(msg) from None
    rope_scaling.check_scaling(value)
    return value


def parse_axes(text: str) -> dict[str, Any]:
    """An `axes` option from JSON text (the command line's ``--axes``), checked.

    Examples
    --------
    >>> parse_axes('{"axes_type": "axial", "axes_dims": [4, 4]}')
    {'axes_type': 'axial', 'axes_dims': [4, 4]}
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"`axes` must be a JSON object, got {text!r} ({exc})"
        raise ValueError(msg) from None
    rope_axes.check_axes(value)
    return value


def rope_show(*, t_q, t_k, q_offset, options):
    """Lines of ``relpos-ref show rope``: each pair's frequency, scaled, and the factors."""
    rotary_dim = 8 if options.get("rotary_dim") is None else options["rotary_dim"]
    if rotary_dim < 0 or rotary_dim % 2:
        msg = f"`rotary_dim` must be even and >= 0, got {rotary_dim}"
        raise ValueError(msg)
    base = options.get("base", 10000.0)
    rule = rope_scaling.check_scaling(options.get("scaling"))
    length = rope_scaling.call_length(t_q, t_k, q_offset)
    plain = rope.rope_frequencies(rotary_dim, base=base)
    scaled = rope.rope_frequencies(rotary_dim, base=base, scaling=rule, length=length)
    fields = " ".join(f"{k}={v}" for k, v in rule.items() if k != "rope_type")
    last = q_offset + t_q - 1
    lines = [f"frequencies of rope_type {rule['rope_type']!r} {fields}".rstrip()
             + f"   rotary_dim={rotary_dim} base={base} call length L={length}",
             f"{'pair c':>6} {'theta_c':>12} {'scaled':>12} {'ratio':>9} "
             f"{'wavelength':>12} {f'angle at p={last}':>18}"]
    for c, (t, u) in enumerate(zip(plain, scaled, strict=True)):
        wavelength = f"{2 * math.pi / u:12.6g}" if u else f"{'inf':>12}"
        lines.append(f"{c:6d} {t:12.6g} {u:12.6g} {u / t:9.4g} {wavelength} {last * u:18.10g}")
    a = rope_scaling.attention_factor(rule)
    lines.append(f"attention factor a = {a:.10g}: cos and sin times a, the rotated features "
                 f"of q and k times a, their logits times a^2 = {a * a:.10g}")
    softmax = rope_scaling.softmax_factor(rule)
    if softmax != 1.0:
        lines.append(f"softmax scale times mscale^2 = {softmax:.10g} (DeepSeek), on every feature")
    if options.get("angles", "float64") == "float32":
        lines.append("angles float32: fl32(fl32(p) * fl32(scaled)), then cos and sin")
    if options.get("rotary_at", "front") == "tail":
        lines.append(f"rotated features at the tail of the head: the last {rotary_dim} "
                     "(DeepSeek MLA's cat(q_pass, q_rot))")
    return lines + _axes_show(rotary_dim, base, rule, length, options.get("axes"))


def _axes_show(rotary_dim, base, rule, length, axes):
    # the multi-axis view: which axis each pair turns with, at which frequency
    axes = rope_axes.check_axes(axes)
    if axes is None:
        return []
    kind = axes["axes_type"]
    head = (f"axes_type {kind!r}: pair c turns by phi_c = sum_a F[c, a] p_a, "
            f"{rope_axes.axes_count(axes)} axes")
    if kind == "mixed":
        return [head, "F: the learned frequencies axes['frequencies'] (RoPE-Mixed)"]
    pairs = rope.rope_axes_frequencies(rotary_dim, axes=axes, base=base, scaling=rule,
                                       length=length)
    return [head, f"{'pair c':>6} {'axis a':>6} {'F[c, a]':>12}",
            *(f"{c:6d} {a:6d} {theta:12.6g}" for c, (a, theta) in enumerate(pairs))]
