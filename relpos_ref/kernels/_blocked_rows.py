"""The loop of a blocked kernel: the specification's tiles of queries, each against its keys.

`relpos_ref.blocked.blocked_attention` walks tiles of ``block`` queries and,
for each, the key tiles it visits (`relpos_ref.blocked.key_blocks`: all of
them, or under ``causal`` those up to the tile's last query). A blocked
kernel computes each tile of queries in one pass against keys
``0 .. j1 - 1``, ``j1`` the end of the last key tile the specification
visits, so that its terms see the distances the specification's do (a
distance beyond a table under ``beyond="error"`` is found in the same tiles)
and the online softmax over key tiles is not needed: the library's own
softmax runs over the whole row. A tile may be cut into calls of fewer
queries (`rows_per_call`) so that each holds no more than the
specification's tiles hold.

The kernels modules (`relpos_ref.kernels.numpy`, `relpos_ref.kernels.torch`)
supply how one call is computed (``attend``); the rest is here, once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .. import _xp
from .._progress import Progress
from ..blocked import BlockedCall, blocked_attention, check_blocked_call, key_blocks

__all__ = [
    "MIN_ROWS", "blocked_arguments", "blocked_rows", "check_blocked_arguments", "rows_per_call",
]

_SIGNATURE = inspect.signature(blocked_attention)

#: Fewest queries in a call of a blocked kernel that holds ``(rows, t_k)`` arrays (`rows_per_call`).
MIN_ROWS = 128


def blocked_arguments(args: tuple[Any, ...], kwargs: dict[str, Any], *, scheme: str
                      ) -> tuple[dict[str, Any], list[Any]] | None:
    """A `blocked_attention` call of `scheme`: its arguments by name (defaults filled), its arrays.

    ``None`` where the signature refuses the call (the specification then
    says what is wrong) or the call is of another scheme. The arrays are
    ``q, k, v``, the tables, the mask and array options (ALiBi's slopes),
    those given.

    Examples
    --------
    >>> import numpy as np
    >>> given, arrays = blocked_arguments((np.eye(2),) * 3, {"scheme": "alibi"},
    ...                                   scheme="alibi")
    >>> given["block_size"], len(arrays)
    (1024, 3)
    >>> blocked_arguments((np.eye(2),), {}, scheme="plain") is None
    True
    """
    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    given = dict(bound.arguments)
    if given["scheme"] != scheme:
        return None
    candidates = (given["q"], given["k"], given["v"], *given["tables"], given["mask"],
                  *given["params"].values())
    arrays = [a for a in candidates
              if a is not None and hasattr(a, "shape") and hasattr(a, "dtype")]
    return given, arrays


def check_blocked_arguments(given: dict[str, Any]) -> BlockedCall:
    """`relpos_ref.blocked.check_blocked_call` of arguments from `blocked_arguments`."""
    return check_blocked_call(
        given["q"], given["k"], given["v"], given["tables"], scheme=given["scheme"],
        block_size=given["block_size"], scale=given["scale"], mask=given["mask"],
        causal=given["causal"], q_offset=given["q_offset"], progress=given["progress"],
        params=given["params"])


def rows_per_call(block: int, t_k: int, *, lean: bool) -> int:
    """Queries per call of a blocked kernel: `block`, fewer where a call holds ``(rows, t_k)``.

    A `lean` call holds ``O(rows + t_k)`` per head (torch: one row of
    distances read through a view, no mask); any other holds ``(rows, t_k)``
    arrays (scores, terms, an additive mask), so its rows are cut to
    ``rows t_k <= 4 block^2`` (about what the specification's loop holds per
    tile: its logits, mask, weights and terms, each ``(block, block)``), but
    to no fewer than `MIN_ROWS` (or `block`): a call also does work over all
    its keys whatever its rows (DeBERTa's ``Q^r k^T``, Transformer-XL's
    distance rows), and GEMMs of few rows are slow. Either way a call holds
    at most ``block t_k`` scores per head, the bound `blocked_attention`
    states.

    Measured (NumPy, one head, d = 64): plain attention at t = 32768, block
    1024, 5.9 s with ``block^2`` scores a call against 3.3 s with 4 times
    that; DeBERTa at t = 16384, block 256, 15.7 s with 16 rows a call, 6.8 s
    with 64, 4.5 s with 128, against 7.0 s for the loop.

    Examples
    --------
    >>> rows_per_call(1024, 65536, lean=True), rows_per_call(1024, 65536, lean=False)
    (1024, 128)
    >>> rows_per_call(1024, 2048, lean=False), rows_per_call(64, 10**6, lean=False)
    (1024, 64)
    """
    if lean:
        return block
    return min(block, max(MIN_ROWS, 4 * block * block // t_k))


def blocked_rows(
    checked: BlockedCall, q: Any, v: Any, /, *, name: str, lean: bool,
    attend: Callable[[int, int, int], Any],
) -> Any:
    """A validated blocked call, one ``attend(i0, i1, j1)`` per call of queries i0..i1 - 1.

    ``attend`` returns the output rows ``(..., i1 - i0, d_v)`` of queries
    ``i0 .. i1 - 1`` against keys ``0 .. j1 - 1``, or ``NotImplemented``
    (the whole call then goes back, after the work done so far).
    A tile of queries none of which has a key (``causal``) is zeros, as in
    the specification; the others are cut into calls of
    ``rows_per_call(block, j1, lean=lean)`` queries. Returns the output
    ``(..., t_q, d_v)``, or ``NotImplemented`` when a call hands back, or
    raises `ValueError` under an option set to ``"error"`` (a distance beyond
    a table under ``beyond="error"``: the specification then says so, naming
    the first of its tiles that has one; any other `ValueError` propagates).

    Examples
    --------
    >>> import numpy as np
    >>> import relpos_ref as rp
    >>> from relpos_ref.blocked import check_blocked_call
    >>> q = k = v = np.eye(4)
    >>> checked = check_blocked_call(q, k, v, (), scheme="plain", block_size=2, scale=None,
    ...                              mask=None, causal=True, q_offset=-1, progress=False,
    ...                              params={})
    >>> def attend(i0, i1, j1):
    ...     return rp.attention(q[i0:i1], k[:j1], v[:j1], causal=True, q_offset=i0 - 1)
    >>> out = blocked_rows(checked, q, v, name="plain", lean=False, attend=attend)
    >>> bool(np.allclose(out, rp.attention(q, k, v, causal=True, q_offset=-1)))
    True
    """
    call, block = checked.call, checked.block
    pieces: list[Any] = []  # output rows, or a number of rows of zeros
    with Progress(-(-call.t_q // block), f"blocked {name}", enabled=checked.progress) as bar:
        for b0 in range(0, call.t_q, block):
            b1 = min(b0 + block, call.t_q)
            tiles = list(key_blocks(b1 - 1, call.t_k, block=block, causal=call.causal,
                                    q_offset=call.q_offset))
            if not tiles:  # no query of the tile has a key
                pieces.append(b1 - b0)
                bar.advance(f"queries {b0}..{b1 - 1}")
                continue
            j1 = tiles[-1][1]
            rows = rows_per_call(block, j1, lean=lean)
            for i0 in range(b0, b1, rows):
                try:
                    out = attend(i0, min(i0 + rows, b1), j1)
                except ValueError:
                    if "error" in _strings(checked.options):
                        return NotImplemented
                    raise
                if out is NotImplemented:
                    return NotImplemented
                pieces.append(out)
            bar.advance(f"queries {b0}..{b1 - 1}")
    return _joined(pieces, checked.lead, q, v)


def _strings(options: dict[str, Any]) -> set[str]:
    return {value for value in options.values() if isinstance(value, str)}


def _joined(pieces: list[Any], lead: tuple[int, ...], q: Any, v: Any) -> Any:
    # the output rows along the query axis, a number of rows standing for as many zeros
    xp = _xp.array_namespace(q)
    blocks = [p for p in pieces if not isinstance(p, int)]
    batch = tuple(blocks[0].shape[:-2]) if blocks else lead
    arrays = [xp.zeros((*batch, p, v.shape[-1]), dtype=q.dtype, device=_xp.device(q))
              if isinstance(p, int) else p for p in pieces]
    return arrays[0] if len(arrays) == 1 else xp.concat(arrays, axis=-2)
