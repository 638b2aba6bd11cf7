"""The kernels wing: fast implementations per array library, and the one dispatcher.

The specification (`relpos_ref.schemes`, `relpos_ref.attention`,
`relpos_ref.gradients`) is array-API code only. Beside it, each array library
may have a module here, ``relpos_ref.kernels.<library>``, loaded the first
time an array of that library arrives, with two mappings from a scheme of
`relpos_ref.catalog` (``"plain"`` for `relpos_ref.attention`) to a function:

- ``KERNELS``: forward passes, each with the signature of the scheme's
  ``*_attention``;
- ``VJP_KERNELS`` (optional): backward passes, each with the signature of the
  scheme's ``*_attention_vjp`` (`relpos_ref.attention_vjp` for ``"plain"``),
  returning the same dict of gradients;
- ``BLOCKED_KERNELS`` (optional): long sequences in bounded memory, each with
  the signature of `relpos_ref.blocked.blocked_attention`, for calls whose
  ``scheme`` is its key.

A kernel computes what the specification computes (the tests prove it, up to
the rounding of a reordered sum) or returns ``NotImplemented``, which hands
the call to the specification: an option it does not cover
(``method="definition"``, say), an array type it does not know, non-finite
values the specification has rules for. A kernel validates its arguments
with the specification's own checks first, so bad input gets the same error
either way.

The public functions of `relpos_ref`, forward (``dispatched(scheme, spec)``),
backward (``dispatched(scheme, spec, vjp=True)``) and blocked
(``dispatched_blocked(spec)``, `relpos_ref.blocked_attention`), are the
specification's behind the dispatcher; this is the only place that knows
both.
``RELPOS_KERNELS=0`` in the environment, or the context manager `disabled`,
makes every call run the specification.

Before a library's own module, the fused GPU kernels (`FUSED`:
``relpos_ref.kernels.triton`` for torch and CuPy) are asked, where Triton is
installed and the module's ``accepts(arrays)`` takes the call's arrays
(CUDA tensors, CuPy arrays; CPU tensors under Triton's interpreter when
switched on). A kernel that hands a call back passes it down the chain: the
fused kernel, the library's kernel, the specification. `kernel_for` names
the first kernel of the chain.

Examples
--------
>>> import numpy as np
>>> import relpos_ref as rp
>>> from relpos_ref import kernels
>>> q = k = v = np.eye(3)
>>> fast = rp.attention(q, k, v)
>>> with kernels.disabled():
...     spec = rp.attention(q, k, v)
>>> bool(np.allclose(fast, spec))
True
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import importlib.util
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .. import _xp

__all__ = [
    "ENV_VAR",
    "FUSED",
    "LIBRARIES",
    "available_memory",
    "blocked_kernels",
    "check_host_memory",
    "disabled",
    "dispatched",
    "dispatched_blocked",
    "enabled",
    "kernel_for",
    "kernels",
    "vjp_kernels",
]

#: ``RELPOS_KERNELS=0`` runs the specification everywhere.
ENV_VAR = "RELPOS_KERNELS"

#: Array library (the top-level module of its array type) -> its kernels module here.
LIBRARIES: Mapping[str, str] = {"numpy": "numpy", "torch": "torch"}

#: Array library -> the module of fused GPU kernels tried before its own (when installed and
#: its ``accepts`` takes the arrays).
FUSED: Mapping[str, str] = {"torch": "triton", "cupy": "triton"}

#: A fused module -> the package it needs; without it the module is not loaded.
_NEEDS: Mapping[str, str] = {"triton": "triton"}

_DISABLED: contextvars.ContextVar[int] = contextvars.ContextVar("relpos_kernels_off", default=0)


def enabled() -> bool:
    """Whether calls may use a kernel: outside `disabled`, and the variable `ENV_VAR` not 0.

    Examples
    --------
    >>> with disabled():
    ...     enabled()
    False
    """
    return _DISABLED.get() == 0 and os.environ.get(ENV_VAR, "1").strip() != "0"


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run every call inside the block on the specification (nests; thread and task local).

    Examples
    --------
    >>> with disabled():
    ...     print(enabled())
    False
    """
    token = _DISABLED.set(_DISABLED.get() + 1)
    try:
        yield
    finally:
        _DISABLED.reset(token)


@functools.cache
def _fused_module(library: str) -> Any:
    # the library's fused-kernel module, or None (none, or its package not installed)
    module = FUSED.get(library)
    if module is None or importlib.util.find_spec(_NEEDS[module]) is None:
        return None
    return importlib.import_module(f"{__name__}.{module}")


@functools.cache
def kernels(library: str) -> Mapping[str, Callable[..., Any]]:
    """The kernels of an array library by scheme name (empty when it has none).

    Examples
    --------
    >>> sorted(kernels("numpy"))[:3]
    ['absolute', 'alibi', 'bias']
    >>> dict(kernels("array_api_strict"))
    {}
    """
    module = LIBRARIES.get(library)
    if module is None:
        return {}
    return importlib.import_module(f"{__name__}.{module}").KERNELS


@functools.cache
def vjp_kernels(library: str) -> Mapping[str, Callable[..., Any]]:
    """The backward-pass kernels of an array library by scheme name (empty when none).

    Examples
    --------
    >>> "shaw" in vjp_kernels("numpy")
    True
    >>> dict(vjp_kernels("array_api_strict"))
    {}
    """
    module = LIBRARIES.get(library)
    if module is None:
        return {}
    return getattr(importlib.import_module(f"{__name__}.{module}"), "VJP_KERNELS", {})


@functools.cache
def blocked_kernels(library: str) -> Mapping[str, Callable[..., Any]]:
    """The blocked kernels of an array library by scheme name (empty when none).

    Examples
    --------
    >>> dict(blocked_kernels("array_api_strict"))
    {}
    """
    module = LIBRARIES.get(library)
    if module is None:
        return {}
    return getattr(importlib.import_module(f"{__name__}.{module}"), "BLOCKED_KERNELS", {})


def kernel_for(
    scheme: str, arrays: tuple[Any, ...], *, vjp: bool = False, blocked: bool = False
) -> Callable[..., Any] | None:
    """The kernel for `scheme` on the library of `arrays`, or ``None``.

    ``None`` when kernels are disabled, when the arrays come from several
    libraries (the specification then says so) or when the library has no
    kernel for the scheme. Non-array arguments are ignored. With `vjp`, the
    scheme's backward-pass kernel (`vjp_kernels`); with `blocked`, its
    blocked kernel (`blocked_kernels`).

    Examples
    --------
    >>> import numpy as np
    >>> kernel_for("shaw", (np.zeros(2), 3, None)) is not None
    True
    >>> with disabled():
    ...     kernel_for("shaw", (np.zeros(2),)) is None
    True
    """
    chain = _chain(scheme, arrays, vjp=vjp, blocked=blocked)
    return chain[0] if chain else None


def _chain(scheme: str, arrays: tuple[Any, ...], *, vjp: bool = False,
           blocked: bool = False) -> list[Callable[..., Any]]:
    # the kernels to try in order: the fused GPU kernel if its module takes the arrays, then
    # the library's own
    if not enabled():
        return []
    libraries = {_xp.library_name(a) for a in arrays if _is_array(a)}
    if len(libraries) != 1:
        return []
    library = libraries.pop()
    name = "BLOCKED_KERNELS" if blocked else "VJP_KERNELS" if vjp else "KERNELS"
    found = []
    fused = _fused_module(library)
    if fused is not None and fused.accepts(arrays):
        found.append(getattr(fused, name, {}).get(scheme))
    table = blocked_kernels if blocked else vjp_kernels if vjp else kernels
    found.append(table(library).get(scheme))
    return [k for k in found if k is not None]


def available_memory() -> int | None:
    """Bytes of memory this machine can still give a process (Linux), or ``None``."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_host_memory(q: Any = None, k: Any = None) -> None:
    """A `MemoryError` before NumPy scores ``(..., t_q, t_k)`` are allocated beyond the machine.

    The estimate is a lower bound, two float32 (or wider) arrays of the
    scores' shape; the message says how much that is and points to
    `relpos_ref.blocked.blocked_attention`, whose memory grows with the
    block, not with ``t_q t_k``. Other libraries (device memory) are not
    checked here.
    """
    if not (type(q).__module__ == "numpy" and type(k).__module__ == "numpy"):
        return
    if q.ndim < 2 or k.ndim < 2:
        return  # the specification refuses these itself
    import numpy as np  # already imported: q is a NumPy array

    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except ValueError:
        return
    t_q, t_k = q.shape[-2], k.shape[-2]
    need = 2 * math.prod(batch) * t_q * t_k * max(q.dtype.itemsize, 4)
    have = available_memory()
    if have is not None and need > have:
        msg = (
            f"attention over {t_q} queries and {t_k} keys (batch {tuple(batch)}) needs at "
            f"least {need / 2**30:.1f} GiB for its scores, and this machine has "
            f"{have / 2**30:.1f} GiB available; relpos_ref.blocked.blocked_attention computes "
            "it in memory that grows with its block size instead"
        )
        raise MemoryError(msg)


def _is_array(x: Any) -> bool:
    return x is not None and hasattr(x, "shape") and hasattr(x, "dtype")


def dispatched(
    scheme: str, spec: Callable[..., Any], *, vjp: bool = False
) -> Callable[..., Any]:
    """`spec` behind the dispatcher: a kernel for the arrays' library if one applies.

    The result has the specification's name, signature and docstring; its
    ``__wrapped__`` is `spec`. With `vjp`, `spec` is the scheme's backward
    pass and the kernels are the library's ``VJP_KERNELS``.

    Examples
    --------
    >>> from relpos_ref.schemes import bias_attention
    >>> public = dispatched("bias", bias_attention)
    >>> public.__wrapped__ is bias_attention, public.__name__
    (True, 'bias_attention')
    """

    @functools.wraps(spec)
    def public(*args: Any, **kwargs: Any) -> Any:
        check_host_memory(*args[:2])
        chain = _chain(scheme, (*args, *kwargs.values()), vjp=vjp)
        return _kernel_or_spec(chain, spec, args, kwargs)

    return public


def _kernel_or_spec(chain: list[Callable[..., Any]], spec: Callable[..., Any],
                    args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # the first kernel's result that is not handed back, or the specification's
    for kernel in chain:
        out = kernel(*args, **kwargs)
        if out is not NotImplemented:
            return out
    return spec(*args, **kwargs)


def dispatched_blocked(spec: Callable[..., Any]) -> Callable[..., Any]:
    """`relpos_ref.blocked.blocked_attention` behind the dispatcher, keyed by the call's scheme.

    The kernel is the arrays' library's blocked kernel for the call's
    ``scheme`` keyword (``"plain"`` when not given), if one applies. No
    check of host memory: a blocked call never holds the ``(t_q, t_k)``
    scores.

    Examples
    --------
    >>> from relpos_ref.blocked import blocked_attention
    >>> dispatched_blocked(blocked_attention).__wrapped__ is blocked_attention
    True
    """

    @functools.wraps(spec)
    def public(*args: Any, **kwargs: Any) -> Any:
        scheme = kwargs.get("scheme", "plain")
        chain = (_chain(scheme, (*args, *kwargs.values()), blocked=True)
                 if isinstance(scheme, str) else [])
        return _kernel_or_spec(chain, spec, args, kwargs)

    return public
