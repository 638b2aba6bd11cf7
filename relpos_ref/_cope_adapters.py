"""The catalog's adapters (`relpos_ref._adapters`) of CoPE, the contextual positions.

CoPE's term is read from ``q`` and ``k`` themselves (the gates), and it
depends on which pairs are allowed (a masked key's gate is 0): ``check``
records the call's mask and causality among the options it returns, under
the private names ``_mask`` and ``_causal``, so that ``terms`` of the whole
grid (the golden intermediates) are the ones `cope_attention` adds. A tile
of keys cannot be evaluated on its own (a position sums the gates of every
later key of the row): `relpos_ref.blocked` refuses CoPE, and ``terms`` of a
tile that is not the whole grid is an error naming it.
"""

from __future__ import annotations

import numpy as np

from ._adapters import Terms
from .schemes import cope


def cope_check(q, k, v, tables, *, scale, mask, causal, q_offset, options):
    call = cope.cope_call(q, k, v, tables["table"], scale=scale, mask=mask, causal=causal,
                          q_offset=q_offset)
    return call, {**options, "_mask": mask, "_causal": call.causal, "_scale": call.scale}


def cope_terms(q, k, tables, *, q_offset, i0, j0, options, method):
    if i0 or j0:
        msg = (f"CoPE's term is the whole grid's (a position sums the gates of every later key "
               f"of its row): a tile at i0={i0}, j0={j0} cannot be evaluated on its own")
        raise ValueError(msg)
    if "_scale" not in options:
        msg = ("CoPE's term reads the call's scale, mask and causality: pass the options "
               "`relpos_ref.catalog.Scheme.check_call` returns")
        raise ValueError(msg)
    term = cope.cope_term(q, k, tables["table"], scale=options["_scale"],
                          mask=options["_mask"], causal=options["_causal"], q_offset=q_offset)
    return Terms(bias=term)


def cope_show(*, t_q, t_k, q_offset, options):
    """Lines of ``relpos-ref show cope``: the positions for constant gates, and the rule."""
    lines = ["p_ij = sum_(t >= j, allowed) sigmoid(s q_i . k_t) (a reverse cumulative sum), "
             "clamped to max_pos - 1; term = (p - floor p) q.e[ceil p] + (1 - p + floor p) "
             "q.e[floor p], unscaled"]
    for logit in (0.0, 2.0):
        gates = np.zeros((t_q, t_k))
        for i in range(t_q):
            gates[i, : max(0, min(t_k, i + q_offset + 1))] = 1.0 / (1.0 + np.exp(-logit))
        p = np.asarray(cope.cope_positions(gates)) if t_q and t_k else gates
        lines.append(f"causal positions for every s q.k = {logit:g} (rows: queries at "
                     f"{q_offset} ..)")
        lines += ["  " + " ".join(f"{x + 0.0:8.4f}" for x in row) for row in p]
    return lines
