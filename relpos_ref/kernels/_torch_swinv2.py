"""Swin v2's torch kernels decline an additive mask (``mask_penalty`` with a ``mask``).

The penalty lowers to a dense bias that the block engine does not read, so
such a call goes to the specification, after the specification's checks:
bad input gets its error from the kernel too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..gradients import check_d_output
from ..schemes import swinv2

__all__ = ["without_penalty"]


def without_penalty(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """`kernel`, handing a call with ``mask_penalty`` and a ``mask`` back (after the checks).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.zeros((2, 1))
    >>> declining = without_penalty(lambda *a, **kw: "kernel")
    >>> declining(x, x, x, np.zeros((1, 2)), np.zeros(1), np.zeros(1), window_height=1,
    ...           window_width=2, mask=np.ones((2, 2), dtype=bool), mask_penalty=-100.0)
    NotImplemented
    """
    @functools.wraps(kernel)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("mask_penalty") is None or kwargs.get("mask") is None:
            return kernel(*args, **kwargs)
        options = {"pretrained_window": None, "logit_scale": None, "scale": None, **kwargs}
        d_output = options.pop("d_output", None)
        options.pop("return_weights", None)
        call = swinv2.swinv2_call(*args, **options)
        if "d_output" in kwargs:
            check_d_output(d_output, args[0], call, args[2].shape[-1], mask=options["mask"])
        return NotImplemented

    return wrapper
