"""Triton kernels: every scheme fused on the GPU, for CuPy arrays and torch CUDA tensors.

Each scheme's kernel lowers its call to the distance form
(`relpos_ref.lowering.lower`, the scheme's own checks first, so bad input
gets the specification's message) and runs one fused kernel
(`relpos_ref.kernels._triton_forward`): an online softmax over tiles of
keys with every term read from the form's small arrays, memory
``O((t_q + t_k) d)`` beside the inputs, no ``(t_q, t_k)`` array.

Which arrays it takes (`accepts`): CuPy arrays; torch tensors on a CUDA
device; and torch CPU tensors when the interpreter is switched on
(``RELPOS_TRITON=interpret`` in the environment, or `interpreted`), which
runs the very same kernel source through Triton's interpreter, slowly, so
that a machine without a GPU proves it against the specification. With
``RELPOS_TRITON=0`` no Triton kernel runs.

A kernel returns ``NotImplemented`` (the next kernel, or the specification,
takes the call) where triton cannot build its variant for the GPU (with a
`RuntimeWarning`, once: a compiler pass that fails, shared memory the GPU
lacks), and for ``return_weights=True``, ``method="definition"``, an
empty grid or feature axis, a dtype other than float16, bfloat16, float32
and float64, features wider than 256, a non-finite value in any floating
argument (a masked pair's NaN must stay out of the output, which a fused
``P v`` cannot promise), a call whose logits might overflow (bounded from the
largest magnitudes of the inputs, as the NumPy and torch kernels do:
`relpos_ref.kernels._overflow`; the specification makes an overflow NaN),
and calls under tracing (``torch.compile``, a CUDA
graph's capture). Results are fresh arrays in the dtype of ``v``.

Precision (`PRECISION`): float32 operands multiply with ``input_precision``
``"ieee"`` by default (``"tf32x3"``, about float32's accuracy on tensor
cores, and ``"tf32"`` may be chosen); 16-bit operands on tensor cores with
float32 accumulation and the weights split in two 16-bit parts; the bound is
stated on the backends page.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

#: ``interpret``: CPU torch tensors run the Triton kernels in Triton's interpreter (and
#: ``TRITON_INTERPRET=1`` is set if triton is not imported yet); ``0``: no Triton kernel
#: runs; unset or anything else: CUDA tensors and CuPy arrays.
ENV_VAR = "RELPOS_TRITON"

if os.environ.get(ENV_VAR, "").strip() == "interpret" and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read by triton when it is imported

from triton.compiler.errors import CompilationError  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from .. import _xp, catalog  # noqa: E402
from ..gradients import check_d_output  # noqa: E402
from ..lowering import lower  # noqa: E402
from ._blocked_rows import blocked_arguments, check_blocked_arguments  # noqa: E402
from ._overflow import limit, logit_bound  # noqa: E402
from ._triton_forward import attention_forward  # noqa: E402
from ._triton_launch import build_failure, fits, launch_forward  # noqa: E402
from ._triton_vjp import covers, form_gradients  # noqa: E402

__all__ = [
    "BLOCKED_KERNELS", "ENV_VAR", "INTERPRETER", "KERNELS", "PRECISION", "VJP_KERNELS", "accepts",
    "interpreted",
]

#: ``input_precision`` of float32 products: "tf32x3" (default: three tensor-core products,
#: about float32's accuracy), "ieee" (no tensor cores) or "tf32" (10-bit operands).
PRECISION = os.environ.get("RELPOS_TRITON_FP32", "tf32x3")

#: Scheme name (as in `relpos_ref.catalog`) -> its Triton kernel.
KERNELS: dict[str, Callable[..., Any]] = {}

#: Scheme name -> its backward pass on torch tensors: the fused backward kernels for the
#: forms without window terms (`relpos_ref.kernels._triton_vjp.covers`), autograd through
#: the lowering for the arguments' gradients.
VJP_KERNELS: dict[str, Callable[..., Any]] = {}

#: Scheme name -> `relpos_ref.blocked.blocked_attention` of that scheme: the fused kernel
#: itself, whose tiles already bound its memory (the block size is checked, then unused).
BLOCKED_KERNELS: dict[str, Callable[..., Any]] = {}

_INTERPRETED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "relpos_triton_interpreted", default=False)

_KERNEL = attention_forward

_DTYPES = ("float16", "bfloat16", "float32", "float64")

#: Whether triton runs its interpreter (``TRITON_INTERPRET=1`` when it was imported): the
#: kernels then run on CPU torch tensors, and only there.
INTERPRETER = isinstance(_KERNEL, InterpretedFunction)


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    """Route CPU torch tensors through the Triton kernels, run by Triton's interpreter.

    A `RuntimeError` when triton was imported without ``TRITON_INTERPRET=1``
    (its functions are then compiled for a GPU, and cannot be interpreted).

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref import kernels
    >>> q = k = v = torch.eye(4, dtype=torch.float64)
    >>> with interpreted():
    ...     kernels.kernel_for("alibi", (q, k, v)).__name__
    'alibi_attention_triton'
    """
    if not INTERPRETER:
        msg = ("Triton's interpreter is off: set TRITON_INTERPRET=1 (or RELPOS_TRITON=interpret) "
               "in the environment before triton is imported")
        raise RuntimeError(msg)
    token = _INTERPRETED.set(True)
    try:
        yield
    finally:
        _INTERPRETED.reset(token)


def _interpreting() -> bool:
    return _INTERPRETED.get() or os.environ.get(ENV_VAR, "").strip() == "interpret"


def accepts(arrays: tuple[Any, ...]) -> bool:
    """Whether the Triton kernels take these arrays (one library; see the module docstring).

    Examples
    --------
    >>> import torch
    >>> accepts((torch.zeros(2),))  # a CPU tensor, no interpreter
    False
    """
    if os.environ.get(ENV_VAR, "").strip() == "0":
        return False
    found = [a for a in arrays if hasattr(a, "shape") and hasattr(a, "dtype")]
    if not found:
        return False
    library = _xp.library_name(found[0])
    if library == "cupy":
        return True
    if library != "torch":
        return False
    devices = {a.device.type for a in found}
    if INTERPRETER:
        return devices == {"cpu"} and _interpreting()
    return devices == {"cuda"} and not _traced()


def _traced() -> bool:
    import torch

    return torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing()


def _bounded(xp: Any, scheme: str, call: Any, named: dict[str, Any]) -> bool:
    """Whether every floating argument is finite and no logit of the call can overflow.

    The NumPy and torch kernels' rule (`relpos_ref.kernels._overflow`): the
    largest magnitude of each argument, one read back, bounds the logits
    below half an ulp of the compute dtype's largest value (float32 for
    16-bit calls); a call beyond it, or with a non-finite value, runs the
    specification, which makes an overflow NaN. Biases are checked for
    finiteness only (any finite bias is safe below that bound; a ``-inf``
    one is a mask the specification applies).
    """
    present = [(n, a) for n, a in named.items()
               if _is_array(a) and xp.isdtype(a.dtype, "real floating") and _xp.size(a)]
    if not present:
        return True
    wide = xp.float64 if any(a.dtype == xp.float64 for _, a in present) else xp.float32
    largest = xp.stack([xp.max(xp.abs(xp.astype(a, wide))) for _, a in present]).tolist()
    if not all(math.isfinite(x) for x in largest):
        return False
    magnitude = {n: x for (n, _), x in zip(present, largest, strict=True) if n != "bias"}
    w_r = named.get("w_r")
    bound = logit_bound(scheme, {"q": 0.0, "k": 0.0, **magnitude}, d=call.d, scale=call.scale,
                        d_model=0 if w_r is None else w_r.shape[-2])
    info = xp.finfo(wide)
    return bound <= limit(float(info.max), float(info.eps))


def _kernel(name: str) -> Callable[..., Any]:
    entry = catalog.get(name)
    signature = inspect.signature(entry.attention)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            given = dict(signature.bind(*args, **kwargs).arguments)
        except TypeError:
            return NotImplemented  # the specification says what is wrong
        if (given.pop("return_weights", False) is not False
                or given.pop("method", "efficient") != "efficient"):
            return NotImplemented
        q, k, v = given.pop("q"), given.pop("k"), given.pop("v")
        named = {"q": q, "k": k, "v": v, **{t.name: given.get(t.name) for t in entry.tables},
                 **{n: a for n, a in given.items() if _is_array(a)}}
        tables = [given.pop(t.name, None) for t in entry.tables]
        arrays = [a for a in named.values() if _is_array(a)]
        if not accepts(tuple(arrays)) or len({str(a.device) for a in arrays}) != 1:
            return NotImplemented
        if str(v.dtype).rsplit(".", 1)[-1] not in _DTYPES:
            return NotImplemented
        while tables and tables[-1] is None:
            tables.pop()
        form = lower(name, q, k, v, *tables, **given)
        call = form.call
        xp = call.xp
        if (0 in (call.t_q, call.t_k, q.shape[-1], v.shape[-1]) or not fits(form)
                or not _bounded(xp, name, call, named)):
            return NotImplemented
        try:
            return launch_forward(form, _KERNEL, interpret=INTERPRETER, precision=PRECISION)
        except _BUILD_ERRORS as exc:
            return _handed_back(name, exc)

    kernel.__name__ = kernel.__qualname__ = f"{name}_attention_triton"
    kernel.__doc__ = f"`{entry.attention.__name__}` fused in Triton (see the module docstring)."
    return kernel


def _vjp_kernel(name: str) -> Callable[..., Any]:
    entry = catalog.get(name)
    signature = inspect.signature(entry.vjp)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        try:
            given = dict(signature.bind(*args, **kwargs).arguments)
        except TypeError:
            return NotImplemented  # the specification says what is wrong
        d_output = given.pop("d_output")
        q, k, v = given["q"], given["k"], given["v"]
        tables = {t.name: given[t.name] for t in entry.tables if given.get(t.name) is not None}
        arrays = [a for a in (*given.values(), d_output) if _is_array(a)]
        if (_xp.library_name(v) != "torch" or not accepts(tuple(arrays))
                or len({str(a.device) for a in arrays}) != 1
                or str(v.dtype).rsplit(".", 1)[-1] not in _DTYPES):
            return NotImplemented  # CuPy's gradients: the specification (no autograd there)
        import torch

        if torch.is_grad_enabled() and any(a.requires_grad for a in arrays):
            return NotImplemented  # the specification's gradients are differentiable
        # the specification's checks, in its order: the call, then the cotangent
        options = {n: a for n, a in given.items() if n not in ("q", "k", "v", *tables)}
        call, completed = entry.check_call(
            q, k, v, tables, scale=options.pop("scale", None), mask=options.pop("mask", None),
            causal=options.pop("causal", None), q_offset=options.pop("q_offset", None),
            options={o.name: options.pop(o.name) for o in entry.options if o.name in options})
        check_d_output(d_output, q, call, v.shape[-1], mask=given.get("mask"))
        form = lower(name, q, k, v, *_table_args(entry, tables), **_call_options(entry, given))
        named = {"q": q, "k": k, "v": v, **tables,
                 **{n: a for n, a in {**options, **completed}.items() if _is_array(a)}}
        if (0 in (call.t_q, call.t_k, q.shape[-1], v.shape[-1]) or not fits(form)
                or not covers(form) or not _bounded(form.call.xp, name, call, named)
                or not _bounded(form.call.xp, "plain", call, {"q": d_output})):
            return NotImplemented
        leaves = {n: a.detach().requires_grad_(True) for n, a in named.items()
                  if a.dtype.is_floating_point}
        with torch.enable_grad():
            form = lower(name, leaves["q"], leaves["k"], leaves["v"],
                         *_table_args(entry, {n: leaves[n] for n in tables}),
                         **_call_options(entry, {**given, **{n: leaves[n] for n in leaves
                                                      if n not in ("q", "k", "v", *tables)}}))
            try:
                _, targets, gradients = form_gradients(
                    form, d_output, _KERNEL, interpret=INTERPRETER, precision=PRECISION)
            except _BUILD_ERRORS as exc:  # as the forward: a variant triton cannot build
                return _handed_back(name, exc)
            # a term built from constants alone (Sandwich's bias) has no gradient to pass on
            pairs = [(t, g) for t, g in zip(targets, gradients, strict=True) if t.requires_grad]
            found = (torch.autograd.grad([t for t, _ in pairs], list(leaves.values()),
                                         [g for _, g in pairs], allow_unused=True)
                     if pairs else [None] * len(leaves))
        return {n: (torch.zeros_like(a) if g is None else g.to(a.dtype))
                for (n, a), g in zip(leaves.items(), found, strict=True)}

    kernel.__name__ = kernel.__qualname__ = f"{name}_attention_vjp_triton"
    kernel.__doc__ = (f"`{entry.vjp.__name__}` by the fused backward kernels and autograd through "
                      "the lowering (see the module docstring).")
    return kernel


def _table_args(entry: Any, tables: dict[str, Any]) -> list[Any]:
    found = [tables.get(t.name) for t in entry.tables]
    while found and found[-1] is None:
        found.pop()
    return found


def _call_options(entry: Any, given: dict[str, Any]) -> dict[str, Any]:
    # the keywords of `lower` from a call's arguments by name (q, k, v and the catalog's
    # tables left out: they go positionally)
    tables = {t.name for t in entry.tables}
    return {n: a for n, a in given.items()
            if n not in ("q", "k", "v", "d_output") and n not in tables}


def _blocked_kernel(name: str) -> Callable[..., Any]:
    forward = KERNELS[name]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        arguments = blocked_arguments(args, kwargs, scheme=name)
        if arguments is None:
            return NotImplemented  # the specification says what is wrong
        given, arrays = arguments
        if not accepts(tuple(arrays)):
            return NotImplemented
        check_blocked_arguments(given)  # the specification's checks, block size included
        return forward(given["q"], given["k"], given["v"], *given["tables"],
                       scale=given["scale"], mask=given["mask"], causal=given["causal"],
                       q_offset=given["q_offset"], **given["params"])

    kernel.__name__ = kernel.__qualname__ = f"{name}_blocked_attention_triton"
    kernel.__doc__ = (f"`blocked_attention(..., scheme={name!r})` by the fused kernel, whose "
                      "memory is O((t_q + t_k) d) whatever the block (see the module docstring).")
    return kernel


#: What a launch raises when triton cannot build a variant (`build_failure` tells which).
_BUILD_ERRORS = (CompilationError, OutOfResources, RuntimeError)

_UNBUILT: set[tuple[str, str]] = set()


def _handed_back(name: str, exc: BaseException) -> Any:
    """``NotImplemented`` for a variant triton could not build (said once), else `exc` again."""
    if not build_failure(exc):
        raise exc
    _warn_unbuilt(name, exc)
    return NotImplemented


def _warn_unbuilt(name: str, exc: BaseException) -> None:
    """Say once per scheme and failure that a variant could not be built (the call goes on)."""
    key = (name, str(exc)[:200])
    if key not in _UNBUILT:
        _UNBUILT.add(key)
        msg = (f"the Triton kernel of {name!r} could not be built for this call on this GPU "
               f"({type(exc).__name__}: {str(exc)[:200]}); the call runs the next kernel or "
               "the specification")
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _is_array(x: Any) -> bool:
    return x is not None and hasattr(x, "shape") and hasattr(x, "dtype")


for _name in catalog.names(plain=True):
    KERNELS[_name] = _kernel(_name)
    VJP_KERNELS[_name] = _vjp_kernel(_name)
    BLOCKED_KERNELS[_name] = _blocked_kernel(_name)
del _name
