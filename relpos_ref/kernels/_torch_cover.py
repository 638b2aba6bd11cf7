"""What a torch kernel covers: the checks that hand a call back to the specification.

Every torch kernel (`relpos_ref.kernels.torch`) runs a call only where its
arrays are torch tensors of one device, not traced (``torch.compile``, a
CUDA graph's capture, a ``torch.func`` transform: the checks read values
back), finite, and bounded so that no logit can overflow
(`relpos_ref.kernels._overflow`); and it tells the calls autograd records
from those it may run in place.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.autograd.forward_ad import unpack_dual

from .. import _xp
from ..calls import Call
from ._overflow import limit, logit_bound

__all__ = ["all_tensors", "bounded", "differentiated", "finite", "is_array", "one_device",
           "traced"]


def all_tensors(*arrays: Any) -> bool:
    """Whether every array given (``None`` skipped) is a torch tensor."""
    return all(a is None or isinstance(a, torch.Tensor) for a in arrays)


def traced(*arrays: Any) -> bool:
    """Whether the call is traced: no value of it may be read back (`relpos_ref._xp.readable`).

    Under ``torch.compile``, a CUDA graph's capture, or a tensor wrapped by a
    ``torch.func`` transform (``vmap``, ``grad``).
    """
    return any(a is not None and not _xp.readable(a) for a in arrays)


def is_array(x: Any) -> bool:
    """Whether `x` is an array (a shape and a dtype), not a number."""
    return hasattr(x, "shape") and hasattr(x, "dtype")


def bounded(name: str, call: Call, named: dict[str, Any]) -> bool:
    """Whether every floating array of `named` is finite and no logit of scheme `name` overflows.

    From the arrays' largest magnitudes, by argument name
    (`relpos_ref.kernels._overflow`): one ``aminmax`` per array (1.6 times a
    sum's time on the CPU), one read back.
    """
    present = [(n, a) for n, a in named.items()
               if a is not None and a.dtype.is_floating_point and a.numel()]
    if not present:
        return True
    with torch.no_grad():
        extremes = torch.stack([torch.stack(torch.aminmax(a)).to(present[0][1].dtype)
                                for _, a in present])
        values = extremes.abs().amax(dim=-1).tolist()
    magnitude = dict(zip((n for n, _ in present), values, strict=True))
    if not all(math.isfinite(x) for x in values):
        return False
    w_r = named.get("w_r")
    bound = logit_bound(name, {"q": 0.0, "k": 0.0, **magnitude}, d=call.d, scale=call.scale,
                        d_model=0 if w_r is None else w_r.shape[-2])
    info = torch.finfo(present[0][1].dtype)
    return bound <= limit(info.max, info.eps)


def finite(arrays: list[Any]) -> bool:
    """Whether every entry of `arrays` is finite (``False`` too, rarely, where a sum overflows).

    A sum is finite only when every entry is, and a sum is 100 times faster
    than ``torch.isfinite(a).all()`` on the CPU; a false "no" only hands the
    call to the specification. One read back.
    """
    with torch.no_grad():
        sums = [a.sum() for a in arrays if a is not None and a.numel()]
        return not sums or bool(torch.isfinite(torch.stack(sums)).all())


def one_device(arrays: list[Any]) -> bool:
    """Whether the arrays given (``None`` skipped) are all on one device."""
    return len({a.device for a in arrays if a is not None}) <= 1


def differentiated(arrays: list[Any]) -> bool:
    """Whether autograd records the call (a gradient may be taken twice) or a tangent is on it."""
    recorded = torch.is_grad_enabled() and any(a.requires_grad for a in arrays)
    return recorded or any(unpack_dual(a).tangent is not None for a in arrays)
