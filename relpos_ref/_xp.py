"""The one place that talks to ``array_api_compat``.

Everything else in the core asks this module for a namespace, a device or the
index dtype, so that backend detection stays lazy (no array library is
imported until an array of it is seen) and is done the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import array_api_compat

__all__ = [
    "array_namespace",
    "check_floating",
    "check_namespace",
    "check_same_dtype",
    "device",
    "has_float64",
    "index_dtype",
    "is_lazy",
    "library_name",
    "named_namespace",
    "readable",
    "size",
]


#: Modules whose arrays belong to another library's name: JAX's concrete arrays live
#: in ``jaxlib``, its tracers (under ``jax.jit``, ``grad``, ``vmap``) in ``jax``.
_LIBRARY_ALIASES = {"jaxlib": "jax"}


def library_name(x: Any) -> str:
    """Name of the library an array belongs to (``"jax"`` for a tracer too), for messages.

    Read from the array type's top-level module (a ``torch.nn.Parameter`` is
    torch), so that it costs nothing under tracing compilers.

    Examples
    --------
    >>> import numpy as np
    >>> library_name(np.zeros(2)), library_name(np.float32(1.0))
    ('numpy', 'numpy')
    """
    module = type(x).__module__ or ""
    top = module.split(".", 1)[0] or type(x).__name__
    return _LIBRARY_ALIASES.get(top, top)


def array_namespace(*arrays: Any) -> Any:
    """Array API namespace shared by `arrays`, ignoring ``None`` entries.

    Parameters
    ----------
    *arrays
        Arrays of one library (``None`` entries are skipped).

    Returns
    -------
    namespace
        The array API compatible namespace, e.g. ``array_api_compat.numpy``.

    Raises
    ------
    TypeError
        If no array is given, an argument is not an array, or the arrays
        come from different libraries (the message names them).
    """
    present = [a for a in arrays if a is not None]
    if not present:
        msg = "expected at least one array, got none"
        raise TypeError(msg)
    for a in present:
        if not array_api_compat.is_array_api_obj(a):
            msg = f"expected an array, got an object of type {type(a).__name__!r}"
            raise TypeError(msg)
    names = sorted({library_name(a) for a in present})
    if len(names) > 1:
        msg = (
            "arrays come from different libraries "
            f"({', '.join(names)}); convert them to one library first"
        )
        raise TypeError(msg)
    return array_api_compat.array_namespace(*present)


def named_namespace(named: Mapping[str, Any]) -> Any:
    """`array_namespace` of arrays by argument name; a refusal names the argument.

    ``None`` entries are skipped. An argument that is not an array, or arrays
    of several libraries, raise a `TypeError` that names each argument.

    Examples
    --------
    >>> import numpy as np
    >>> named_namespace({"q": np.zeros(2), "r1": 1.0})
    Traceback (most recent call last):
    ...
    TypeError: `r1` must be an array of the call's library, got 1.0 of type float
    """
    present = {n: a for n, a in named.items() if a is not None}
    for name, a in present.items():
        if not array_api_compat.is_array_api_obj(a):
            shown = repr(a) if len(repr(a)) <= 40 else repr(a)[:37] + "..."
            msg = (f"`{name}` must be an array of the call's library, got {shown} of type "
                   f"{type(a).__name__}")
            raise TypeError(msg)
    libraries = {n: library_name(a) for n, a in present.items()}
    if len(set(libraries.values())) > 1:
        listing = ", ".join(f"`{n}` ({lib})" for n, lib in libraries.items())
        msg = (f"arrays come from different libraries: {listing}; convert them to one "
               "library first")
        raise TypeError(msg)
    return array_namespace(*present.values())


def device(x: Any) -> Any:
    """Device on which array `x` lives (``None``-free, per the standard)."""
    return array_api_compat.device(x)


def check_namespace(xp: Any) -> Any:
    """`xp` if it is an array API namespace; a `TypeError` naming ``xp`` otherwise.

    Functions that take no array (`relpos_ref.relative_positions`, say) are
    told the library by ``xp=``: a module such as ``array_api_strict`` or
    ``numpy``, or the namespace of an array (``array_api_compat.array_namespace(x)``).

    Examples
    --------
    >>> check_namespace(None)
    Traceback (most recent call last):
    ...
    TypeError: `xp` must be an array API namespace (array_api_strict, numpy, torch, ...), got None
    """
    if not all(callable(getattr(xp, name, None)) for name in ("asarray", "arange")):
        shown = repr(xp) if xp is None or isinstance(xp, (str, int, float)) else (
            f"an object of type {type(xp).__name__}")
        msg = ("`xp` must be an array API namespace (array_api_strict, numpy, torch, ...), "
               f"got {shown}")
        raise TypeError(msg)
    return xp


def has_float64(xp: Any, device: Any = None) -> bool:
    """Whether namespace `xp` has float64 arrays on `device`.

    From ``__array_namespace_info__().dtypes`` where the namespace has it
    (JAX without ``jax_enable_x64``, array-api-strict's ``"no_float64"``
    device and some GPUs have none); otherwise whether it names ``float64``.
    Host-side: no array is made.

    Examples
    --------
    >>> import array_api_strict as xp
    >>> has_float64(xp)
    True
    >>> import array_api_strict as strict
    >>> has_float64(strict, strict.Device("no_float64"))
    False
    """
    info = getattr(xp, "__array_namespace_info__", None)
    if info is None:
        return hasattr(xp, "float64")
    try:
        return "float64" in info().dtypes(device=device, kind="real floating")
    except (TypeError, ValueError):
        return hasattr(xp, "float64")


def index_dtype(xp: Any, device: Any = None) -> Any:
    """Default indexing dtype of namespace `xp` on `device`.

    Uses ``__array_namespace_info__().default_dtypes`` where the namespace
    has it (array API 2023.12 and later) and falls back to ``xp.int64``.
    Every function that builds positions asks it, so a `xp` that is not a
    namespace is refused here by name (`check_namespace`).
    """
    info = getattr(check_namespace(xp), "__array_namespace_info__", None)
    if info is not None:
        return info().default_dtypes(device=device)["indexing"]
    return xp.int64


def check_floating(xp: Any, name: str, x: Any) -> None:
    """Raise a `TypeError` naming `name` unless `x` has a real floating dtype.

    A dtype the namespace does not know (NumPy's ``ml_dtypes.bfloat16``, which
    the array API of NumPy has not) is refused with the same kind of message.
    """
    try:
        floating = xp.isdtype(x.dtype, "real floating")
    except (TypeError, ValueError):
        msg = (f"`{name}` has dtype {x.dtype}, which this array library's array API does "
               "not support; convert it (to float32, say), or use a library that has it "
               "(torch and JAX have bfloat16)")
        raise TypeError(msg) from None
    if not floating:
        msg = f"`{name}` must have a real floating dtype, got {x.dtype}"
        raise TypeError(msg)


def check_same_dtype(**named: Any) -> None:
    """Raise a `TypeError` unless all given arrays share one dtype.

    The core never promotes silently: mixing float32 and float64 would upcast
    the result, so it is refused and the message names each array's dtype.
    """
    present = {k: v for k, v in named.items() if v is not None}
    dtypes = {v.dtype for v in present.values()}
    if len(dtypes) > 1:
        listing = ", ".join(f"`{k}` is {v.dtype}" for k, v in present.items())
        msg = f"arrays must share one floating dtype (no silent upcast): {listing}"
        raise TypeError(msg)


def is_lazy(x: Any) -> bool:
    """Whether `x`'s values cannot be read on the host now (jit tracers, dask, JAX)."""
    return array_api_compat.is_lazy_array(x)


def readable(x: Any) -> bool:
    """Whether `x`'s values can be read on the host now without breaking a trace.

    Not for lazy arrays (`is_lazy`: JAX, dask), nor for torch under
    ``torch.compile``, a CUDA graph's capture, or a ``torch.func`` transform
    (``vmap``, ``grad``), where a branch on values would split or break the
    trace.

    Examples
    --------
    >>> import numpy as np
    >>> readable(np.zeros(2))
    True
    """
    if is_lazy(x):
        return False
    if library_name(x) == "torch":
        import torch

        if torch.compiler.is_compiling() or (
                torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
            return False
        return not torch._C._functorch.is_functorch_wrapped_tensor(x)
    return True


def size(x: Any) -> int | None:
    """Number of elements of `x` from its shape (``None`` if a dimension is unknown)."""
    return array_api_compat.size(x)
