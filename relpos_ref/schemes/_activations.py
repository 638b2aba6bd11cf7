"""The ReLU of the schemes' MLPs (FIRE's, Swin v2's), with their references' gradient rule.

``relu(x) = x`` where ``x > 0``, else ``0``; NaN stays NaN. Under autograd
(torch, JAX) it passes no gradient at ``x = 0``, as ``torch.relu`` does in
both references and as the specifications' VJPs (``pre > 0``) do;
``maximum(x, 0)`` would pass half there (torch's rule at a tie), which a
unit's pre-activation reaches exactly when, say, ``b1 = 0`` at the input 0.
"""

from __future__ import annotations

from typing import Any

from .. import _xp

__all__ = ["relu"]


def relu(x: Any, /) -> Any:
    """``max(x, 0)``, NaN kept, no gradient at 0 under autograd.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> relu(xp.asarray([-1.0, 0.0, 2.0, xp.nan, -xp.inf]))
    Array([ 0.,  0.,  2., nan,  0.], dtype=array_api_strict.float64)
    """
    xp = _xp.array_namespace(x)
    zero = xp.zeros((), dtype=x.dtype, device=_xp.device(x))
    # one selection: NaN fails `x <= 0` and is kept, -inf and 0 get 0 (no gradient)
    return xp.where(x <= 0, zero, x)
