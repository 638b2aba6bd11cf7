"""The catalog's adapters (`relpos_ref._adapters`) of xPos: check, rotate, show, parse.

``rotate`` gives the scaled, rotated queries and keys about the whole call's
centre (the kernels and the distance form read them); ``show`` prints each
pair's decay base and its scale at the call's first and last positions.
"""

from __future__ import annotations

import math

from .schemes import xpos
from .schemes.rope_angles import rope_frequencies
from .schemes.rope_scaling import call_length

#: `xpos_rotate`'s options besides the offset: the catalog's, and the call's length.
XPOS_ROTATION = (*xpos.ROTATION, "length")


def xpos_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = xpos.xpos_call(q, k, v, scale=scale, mask=mask, causal=causal, q_offset=q_offset,
                          **options)
    # the whole call's length: a tile, a chunk of queries or the keys alone share its centre
    return call, {**options, "length": call_length(call.t_q, call.t_k, call.q_offset)}


def xpos_rotate(q, k, *, q_offset, options):
    rotation = {n: options[n] for n in XPOS_ROTATION if n in options}
    rotation.setdefault("length", call_length(q.shape[-2], k.shape[-2], q_offset))
    return (xpos.xpos_rotate(q, offset=q_offset, **rotation),
            xpos.xpos_rotate(k, key=True, **rotation))


def parse_center(text: str) -> int | str:
    """A `center` option from the command line: an integer, ``middle`` or ``middle_up``.

    Examples
    --------
    >>> parse_center("middle_up"), parse_center("-3")
    ('middle_up', -3)
    """
    try:
        return int(text)
    except ValueError:
        pass
    xpos.xpos_center(text, 0)  # the message names the choices
    return text


def xpos_show(*, t_q, t_k, q_offset, options):
    """Lines of ``relpos-ref show xpos``: each pair's frequency, decay base and scales."""
    rotary_dim = 8 if options.get("rotary_dim") is None else options["rotary_dim"]
    base = options.get("base", 10000.0)
    gamma = options.get("scale_base", 512.0)
    offset = options.get("scale_offset", 0.4)
    length = call_length(t_q, t_k, q_offset)
    o = xpos.xpos_center(options.get("center", "middle"), length)
    thetas = rope_frequencies(rotary_dim, base=base)
    zetas = xpos.xpos_zeta(rotary_dim, scale_offset=offset)
    first, last = min(q_offset, 0), max(q_offset + t_q, t_k) - 1
    lines = [f"zeta_c = (2c/{rotary_dim} + {offset:g}) / (1 + {offset:g}); query at n scaled "
             f"by zeta^((n - o)/{gamma:g}), key at m by zeta^(-(m - o)/{gamma:g})",
             f"call length L={length}, centre o={o}; a product decays as zeta^((n - m)/{gamma:g})",
             f"{'pair c':>6} {'theta_c':>12} {'zeta_c':>10} {'half-life':>12} "
             f"{f'q at p={first}':>14} {f'q at p={last}':>14}"]
    for c, (theta, z) in enumerate(zip(thetas, zetas, strict=True)):
        half = gamma * math.log(0.5) / math.log(z)
        lines.append(f"{c:6d} {theta:12.6g} {z:10.6f} {half:12.6g} "
                     f"{z ** ((first - o) / gamma):14.6g} {z ** ((last - o) / gamma):14.6g}")
    lines.append("half-life: the distance n - m at which a pair's product is halved; "
                 "a key's scale is the inverse of a query's")
    return lines
