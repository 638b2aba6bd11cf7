"""Which tiles a Triton kernel's program takes: the choice by a form's window terms and dtype.

The forward kernel's tiles (`TILES`, read by `tile_sizes`) and the two
backward kernels' (`BACKWARD_TILES`, `backward_tile_sizes`), keyed by the
bytes of the operands (`operand_width`) and, forward, by the form's window
terms (`window_kind`), whose products and indices need the most registers.
The launches read them (`relpos_ref.kernels._triton_launch`,
`relpos_ref.kernels._triton_vjp`); the builds that chose them are
`relpos_ref.kernels._triton_variants`'.
"""

from __future__ import annotations

from typing import Any

from ..lowering import DistanceForm

__all__ = ["BACKWARD_TILES", "TILES", "backward_tile_sizes", "operand_width", "tile_sizes",
           "window_kind"]

#: ``(queries, keys, warps)`` of a program by the call's window terms (`window_kind`) and the
#: bytes of its operands (2: float16 and bfloat16, 4, 8). Without window terms: chosen on an
#: H200 (benchmarks/gpu_check.py's ``tiles``). With them: the largest whose builds for sm_90
#: spill nothing, triton 3.9 and 3.6, not yet timed (at 64 x 64, 16-bit Shaw spilled 40 to 56
#: bytes; float32 DeBERTa 128 to 220 at 32 x 16 and 16 x 32, triton 3.6). Shaw's 16-bit tiles
#: of 32 queries do not use Hopper's warp-group products (``wgmma``); those of 64 do.
TILES = {
    (None, 2): (64, 64, 4), (None, 4): (128, 64, 8), (None, 8): (32, 32, 4),
    ("terms", 2): (64, 64, 8), ("terms", 4): (32, 32, 8), ("terms", 8): (32, 32, 8),
    ("both", 2): (64, 32, 8), ("both", 4): (16, 16, 2), ("both", 8): (16, 32, 8),
    ("values", 2): (32, 64, 8), ("values", 4): (32, 16, 8), ("values", 8): (32, 16, 8),
}

#: ``((queries, keys) of the dQ kernel, (queries, keys) of the dK/dV kernel, warps)`` by the bytes
#: of an operand. Chosen by their builds for sm_90 as the largest tiles at which no variant
#: spills (triton 3.9; 16-bit, triton 3.6 too), not yet timed on a GPU: 16-bit, the dQ kernel's
#: 64 queries walk the keys 32 at a time and the dK/dV kernel's 64 keys the queries 32 at a
#: time (at 64 x 64 for both, dQ spilled up to 240 bytes); float32's products in three tf32
#: parts need more registers, so its tiles are smaller (at 64 x 64, dK/dV spilled 1.3 to 1.7
#: KB, and 400 to 700 bytes at 32 x 32 with 4 warps), and float64's (36 to 252 bytes at 32 x 32).
BACKWARD_TILES = {2: ((64, 32), (32, 64), 8), 4: ((16, 64), (16, 32), 8),
                  8: ((16, 32), (16, 32), 4)}


def _power_of_two(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


def _itemsize(x: Any) -> int:
    return int(x.itemsize) if hasattr(x, "itemsize") else x.element_size()


def operand_width(form: DistanceForm) -> int:
    """The bytes of the form's operands as the tile tables key them: 2, 4 or 8.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.lowering import lower
    >>> q = k = v = np.ones((4, 8), dtype=np.float32)
    >>> operand_width(lower("plain", q, k, v))
    4
    """
    return min(8, max(2, _itemsize(form.v)))


def window_kind(form: DistanceForm) -> str | None:
    """The window terms a form has, which set its tiles (`TILES`): the registers grow with them.

    ``"values"``: relative values (Shaw, Music); ``"both"``: terms by
    distance on the queries' and the keys' side (DeBERTa); ``"terms"``: on
    one side (general, Transformer-XL); ``None``: no window term.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.lowering import lower
    >>> q = k = v = np.ones((4, 8))
    >>> window_kind(lower("shaw", q, k, v, np.ones((5, 8)), np.ones((5, 8))))
    'values'
    >>> window_kind(lower("shaw", q, k, v, np.ones((5, 8)))), window_kind(lower("plain", q, k, v))
    ('terms', None)
    """
    if any(t.index.by_distance for t in form.values):
        return "values"
    sides = (any(t.index.by_distance for t in form.query_terms),
             any(t.index.by_distance for t in form.key_terms))
    return "both" if all(sides) else "terms" if any(sides) else None


def tile_sizes(form: DistanceForm) -> tuple[int, int, int, int]:
    """``(BM, BN, BW, warps)``: queries and keys per tile, the window of their distances, warps."""
    kind = window_kind(form)
    bm, bn, warps = TILES[kind, operand_width(form)]
    return bm, bn, _power_of_two(bm + bn - 1) if kind else 16, warps


def backward_tile_sizes(form: DistanceForm) -> tuple[tuple[int, int], tuple[int, int], int]:
    """``((BM, BN) of the dQ kernel, (BM, BN) of the dK/dV kernel, warps)`` for a form's VJP."""
    return BACKWARD_TILES[operand_width(form)]
