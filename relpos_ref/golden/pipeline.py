"""Computing a case: the float64 goldens and the naive pipeline behind the tolerances.

Both run the same stages, built from the library's public functions:

1. the scheme's integer intermediates (``distance``, ``index``, ``valid``, ...)
   and its ``position`` term (scaled with ``q . k``) and/or ``bias`` term
   (added after scaling); schemes that transform the queries and keys (RoPE,
   xPos, Swin v2's cosine attention) return ``q_rotated`` and ``k_rotated``,
   which replace ``q`` and ``k``;
2. ``logits = scale * (q k^T + position) + bias``, before masking;
3. ``weights = masked_softmax(logits)`` under the mask and causality;
4. ``output = weights v`` plus the scheme's relative-value term, if any;
5. given the output's cotangent ``d_output`` (the gradient of a scalar loss
   with respect to ``output``), the gradients of that loss with respect to
   ``q``, ``k``, ``v`` and every table, from the scheme's specified backward
   pass (`relpos_ref.catalog.Scheme.vjp`): ``dq``, ``dk``, ``dv`` and
   ``d_<table>`` (`gradient_name`).

**Goldens** run these stages in float64 on the inputs as stored (rounded to
the dtype under test), with ``method="definition"``; the gradients in float64 too.

**The naive pipeline** is what a straightforward implementation in the dtype
under test computes: NumPy, ``method="efficient"`` where the scheme has one,
the products ``q k^T`` and ``w v`` as elementwise products summed over the
contracted axis (the textbook order, not a BLAS kernel's), and the result of
every stage stored in the dtype under test. For float32 and
float64 all arithmetic is in that dtype; for float16 and bfloat16 it is
float32 arithmetic with every stage's result rounded to 16 bits (the mixed
precision 16-bit kernels use). Its gradients are the backward pass run in
that arithmetic (float32 for the 16-bit dtypes) on the stored inputs and
cotangent, each gradient stored in the dtype under test. Its error against the goldens sets the
tolerances (`relpos_ref.golden.tolerance`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .._xp import device
from ..attention import allowed_keys, compose_logits, masked_softmax
from .cases import Case
from .dtypes import SIXTEEN_BIT, numpy_dtype

__all__ = [
    "FLOAT_STAGES",
    "attention_of",
    "call_keywords",
    "evaluate",
    "golden_arrays",
    "gradient_name",
    "gradients_of",
    "is_gradient",
    "naive_arrays",
]

#: The float intermediates and results every scheme may have, in pipeline order.
FLOAT_STAGES = ("q_rotated", "k_rotated", "position", "bias", "logits", "weights", "output")


def evaluate(
    case: Case,
    xp: Any,
    arrays: Mapping[str, Any],
    *,
    method: str,
    store: Callable[[Any], Any] = lambda x: x,
    matmul: Callable[[Any, Any], Any] | None = None,
) -> dict[str, Any]:
    """Run the stages of `case` on arrays of namespace `xp`.

    Parameters
    ----------
    case : Case
    xp : namespace
        Namespace of `arrays`.
    arrays : mapping
        The case's inputs (``q``, ``k``, ``v``, tables, optional ``mask``).
    method : {"efficient", "definition"}
        Passed to the scheme's functions that take it.
    store : callable, optional
        Applied to every float stage's result (rounding to a storage dtype).
    matmul : callable, optional
        ``(a, b) -> a @ b`` for ``q k^T`` and ``w v``; default ``xp.matmul``.

    Returns
    -------
    dict
        Integer intermediates, then `FLOAT_STAGES` that the scheme has; a
        decode case's ``weights`` and ``output`` (`relpos_ref.golden.decode`).
    """
    if case.kind == "decode":
        from .decode import evaluate_decode

        return evaluate_decode(case, xp, arrays, evaluate, method=method, store=store,
                               matmul=matmul)
    p = case.parameters
    entry = case.entry
    tables = {t.name: arrays[t.name] for t in entry.tables if t.name in arrays}
    call, options = entry.check_call(
        arrays["q"], arrays["k"], arrays["v"], tables, scale=p["scale"],
        mask=arrays.get("mask"), causal=p["causal"], q_offset=p["q_offset"],
        options=entry.options_from(p),
    )
    out = entry.indices(
        xp, device(arrays["q"]), t_q=p["t_q"], t_k=p["t_k"], q_offset=call.q_offset,
        sizes=entry.sizes_from(p), options=options,
    )
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    rotated = (None if entry.rotate is None
               else entry.rotate(q, k, q_offset=call.q_offset, options=options))
    if rotated is not None and (rotated[0] is not q or rotated[1] is not k):  # not Swin v2's q.k
        q, k = (store(x) for x in rotated)
        out["q_rotated"], out["k_rotated"] = q, k
    terms = entry.terms(q, k, tables, q_offset=call.q_offset, i0=0, j0=0, options=options,
                        method=method)
    for name, term in zip(("position", "bias"), terms, strict=True):
        if term is not None:
            out[name] = store(term)
    matmul = xp.matmul if matmul is None else matmul
    content = matmul(q, xp.matrix_transpose(k))
    out["logits"] = store(
        compose_logits(content, scale=call.scale, position=out.get("position"),
                       bias=out.get("bias"))
    )
    allowed = allowed_keys(
        p["t_q"], p["t_k"], mask=arrays.get("mask"), causal=call.causal,
        q_offset=call.q_offset, xp=xp, device=device(q),
    )
    out["weights"] = store(masked_softmax(out["logits"], allowed=allowed))
    output = matmul(out["weights"], v)
    if entry.values is not None:
        extra = entry.values(out["weights"], tables, q_offset=call.q_offset, options=options,
                             method=method, allowed=allowed)
        if extra is not None:
            output = output + extra
    out["output"] = store(output)
    return out


def call_keywords(entry: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments a case's parameters give the scheme's public functions.

    ``scale`` always; ``causal`` and ``q_offset`` where ``*_attention`` takes
    them (grid schemes take neither, or only ``causal``); then the scheme's
    options (`relpos_ref.catalog.Scheme.options_from`). The forward and the
    backward pass of a scheme take the same ones.

    Examples
    --------
    >>> from relpos_ref import catalog
    >>> call_keywords(catalog.get("swin"), Case.make("swin", "x").parameters)
    {'scale': 0.35355339059327373, 'window_height': 2, 'window_width': 2}
    """
    accepts = inspect.signature(entry.attention).parameters
    out = {"scale": params["scale"]}
    out.update({name: params[name] for name in ("causal", "q_offset") if name in accepts})
    out.update(entry.options_from(params))
    return out


def attention_of(case: Case, arrays: Mapping[str, Any], *, method: str) -> tuple[Any, Any]:
    """``(output, weights)`` of the scheme's public ``*_attention`` on the case's arrays.

    The call a user's own code makes: the tables positionally, the case's
    options, scale, causality and offset as keywords.
    """
    import relpos_ref

    p = case.parameters
    entry = case.entry
    tables = {t.name: arrays[t.name] for t in entry.tables if t.name in arrays}
    function = getattr(relpos_ref, f"{entry.name}_attention")
    kwargs = {**call_keywords(entry, p), "mask": arrays.get("mask"), "return_weights": True}
    if entry.methods:
        kwargs["method"] = method
    return function(arrays["q"], arrays["k"], arrays["v"], *entry.table_args(tables), **kwargs)


def gradient_name(argument: str) -> str:
    """The golden name of the gradient with respect to an argument.

    Examples
    --------
    >>> gradient_name("q"), gradient_name("key_table")
    ('dq', 'd_key_table')
    """
    return f"d{argument}" if argument in ("q", "k", "v") else f"d_{argument}"


def is_gradient(name: str) -> bool:
    """Whether `name` is a gradient golden's name (`gradient_name`).

    Examples
    --------
    >>> is_gradient("dq"), is_gradient("d_table"), is_gradient("distance")
    (True, True, False)
    """
    return name in ("dq", "dk", "dv") or name.startswith("d_")


def gradients_of(case: Case, arrays: Mapping[str, Any], d_output: Any) -> dict[str, Any]:
    """The gradients of `case` for the cotangent `d_output`, by golden name.

    The scheme's specified backward pass (`relpos_ref.catalog.Scheme.vjp`)
    called as a user calls the public ``*_attention_vjp``: the tables
    positionally, the case's options, scale, causality and offset as keywords.
    """
    p = case.parameters
    entry = case.entry
    tables = {t.name: arrays[t.name] for t in entry.tables if t.name in arrays}
    grads = entry.vjp(arrays["q"], arrays["k"], arrays["v"], *entry.table_args(tables),
                      d_output=d_output, mask=arrays.get("mask"), **call_keywords(entry, p))
    return {gradient_name(name): g for name, g in grads.items()}


def golden_arrays(
    case: Case,
    inputs: Mapping[str, np.ndarray],
    *,
    d_output: np.ndarray | None = None,
    namespace: Any = None,
    from_numpy: Callable[[np.ndarray], Any] | None = None,
    to_numpy: Callable[[Any], np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The float64 goldens and integer intermediates of `case`, as NumPy arrays.

    With `d_output` (the case's cotangent, `Case.d_output`) the gradients
    follow the stages (`gradients_of`). `namespace`, `from_numpy` and
    `to_numpy` select another array library (a backend adapter's); the
    default is NumPy.
    """
    if namespace is None:
        import array_api_compat.numpy as namespace

        def from_numpy(a):
            return a

        def to_numpy(x):
            return np.asarray(x)

    arrays = {
        name: from_numpy(a if a.dtype == np.bool_ else a.astype(np.float64))
        for name, a in inputs.items()
    }
    result = evaluate(case, namespace, arrays, method="definition")
    if d_output is not None:
        result.update(gradients_of(case, arrays, from_numpy(d_output.astype(np.float64))))
    return {name: _host(to_numpy(x)) for name, x in result.items()}


def _host(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    return a


def elementwise_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` as ``sum_k a[..., i, k] * b[..., k, j]``, summed by ``numpy.sum``."""
    return np.sum(a[..., :, :, None] * b[..., None, :, :], axis=-2)


def naive_method(case: Case) -> str:
    """``"efficient"`` where the scheme has that path."""
    return "efficient" if case.entry.methods else "definition"


def naive_arrays(
    case: Case, inputs: Mapping[str, np.ndarray], *, d_output: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The float stages of the naive pipeline, as float64 copies of their stored values.

    With `d_output`, the gradients too, computed in the pipeline's arithmetic
    and each stored in the dtype under test.
    """
    import array_api_compat.numpy as xp

    storage = numpy_dtype(case.dtype)
    compute = np.dtype(np.float32) if case.dtype in SIXTEEN_BIT else storage

    def store(x: Any) -> Any:
        return np.asarray(x).astype(storage).astype(compute)

    arrays = {
        name: a if a.dtype == np.bool_ else a.astype(compute) for name, a in inputs.items()
    }
    result = evaluate(
        case, xp, arrays, method=naive_method(case), store=store, matmul=elementwise_matmul
    )
    if d_output is not None:
        grads = gradients_of(case, {n: xp.asarray(a) for n, a in arrays.items()},
                             xp.asarray(d_output.astype(compute)))
        result.update({name: store(g) for name, g in grads.items()})
    return {
        name: np.asarray(x, dtype=np.float64)
        for name, x in result.items()
        if np.asarray(x).dtype.kind == "f"
    }
