"""NumPy kernels read from the distance form: the schemes whose terms need no table product.

Plain attention, absolute embeddings, RoPE, xPos, and the scalar biases of the
distance (bias, T5, ALiBi) lower to content operands and biases by distance
(`relpos_ref.lowering`): ``q'`` and ``k'`` (rotated, or with the key
embeddings added), and one row of values per distance. One kernel serves
them all: the bias row is laid out as a read-only Toeplitz view of the
grid (`relpos_ref.kernels._numpy_blocks.distance_view`, no ``(t_q, t_k)``
array), and the softmax is the NumPy kernels' own (`_attend`). No scheme is
re-derived here: what a scheme adds is what its lowering says.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import catalog
from .._validate import check_bool
from ..lowering import bias_by_difference, lower
from ._numpy_blocks import distance_view, kernel_arrays
from ._overflow import bounded

__all__ = ["FORM_SCHEMES", "form_kernel"]

#: The schemes whose NumPy kernel is `form_kernel`: their forms have content operands,
#: biases by distance and plain attention's dense terms only.
FORM_SCHEMES = ("plain", "absolute", "rope", "bias", "t5", "alibi", "kerple", "sandwich",
                "xpos", "cope")


def form_kernel(name: str, attend: Callable[..., Any]) -> Callable[..., Any]:
    """The NumPy kernel of scheme `name` from its distance form; `attend` is the softmax's.

    ``attend(q, k, v, call, *, mask, return_weights, position, bias)``
    (`relpos_ref.kernels.numpy`'s ``_attend``). The call is validated by the
    scheme's own checks (`relpos_ref.lowering.lower`), so bad input gets the
    specification's message; a call whose logits might overflow, or with
    arrays that are not plain ``numpy.ndarray``, hands back.
    """
    entry = catalog.get(name)
    signature = inspect.signature(entry.attention)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            given = dict(signature.bind(*args, **kwargs).arguments)
        except TypeError:
            return NotImplemented  # the specification says what is wrong
        return_weights = given.pop("return_weights", False)
        arrays = {n: a for n, a in given.items() if hasattr(a, "shape")}
        if not kernel_arrays(*arrays.values()):
            return NotImplemented
        q, k, v = given.pop("q"), given.pop("k"), given.pop("v")
        tables = [given.pop(t.name, None) for t in entry.tables]
        while tables and tables[-1] is None:
            tables.pop()
        form = lower(name, q, k, v, *tables, **given)
        call = form.call
        return_weights = check_bool("return_weights", return_weights)
        position, bias = form.dense
        # the logits' bound from the operands the kernel multiplies (RoPE's attention factor
        # scales its rotated ones, absolute embeddings join the keys); biases need none
        if not bounded("plain", call, form.q, form.k, position=position):
            return NotImplemented
        for term in form.biases:  # one row per distance, laid out as the grid's view
            row = bias_by_difference(term)
            if call.t_q and call.t_k:
                term_view = distance_view(row, call.t_q, call.t_k)
            else:
                term_view = np.zeros((*row.shape[:-1], call.t_q, call.t_k), dtype=row.dtype)
            bias = term_view if bias is None else bias + term_view
        return attend(form.q, form.k, form.v, call, mask=form.mask,
                      return_weights=return_weights, position=position, bias=bias)

    kernel.__name__ = kernel.__qualname__ = f"{name}_attention"
    kernel.__doc__ = f"`{entry.attention.__name__}` from its distance form (see the module)."
    return kernel
