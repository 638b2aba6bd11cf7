"""Tolerances derived from the naive pipeline's measured error.

For every float golden array ``g`` of a case in dtype ``T``, with ``n`` the
same array from the naive pipeline (`relpos_ref.golden.pipeline`):

.. math::

    e_\\max = \\max |n - g|, \\qquad e_\\text{mean} = \\operatorname{mean} |n - g|,

    \\text{atol} = \\max\\bigl(k\\, e_\\max,\\; m\\,\\operatorname{ulp}_T(\\max |g|)\\bigr),
    \\qquad k = 3 \\text{ for 16-bit } T, \\quad k = 10 \\text{ for float32 and float64},

with :math:`m = 2`, except for the gradients (``dq``, ``dk``, ``dv``,
``d_<table>``): :math:`m = 8` in a 16-bit ``T`` and :math:`m = 64` in
float64. An obtained array ``o`` matches when ``|o - g| <= atol``
everywhere (``rtol`` is 0).

Why 64 for float64 gradients: the naive backward in float64 is the golden's
own computation, so its error is 0 and the floor is all there is; two
float64 evaluations of a backward pass in different summation orders (a
kernel's, another library's) differ by a few ulps of ``max |g|``, and 64
ulps is the agreement `relpos_ref.golden.verify` already asks of float64
goldens recomputed on another backend.

Why 8 for 16-bit gradients: the naive backward rounds only its results to 16
bits, while a backward pass written with 16-bit operations rounds after each
one. Over the default suite, PyTorch autograd through every scheme with
every operation in float16 or bfloat16 lands at most 2.0 times
``max(2 e_max, 2 ulp)`` from the goldens (Transformer-XL's ``d_position_bias``
in float16, ``d_w_r`` in bfloat16); ``m = 8`` passes it with a factor of 2 to
spare (Swin v2's ``dk`` in bfloat16, whose bias in ``(0, 16)`` rounds more
coarsely than the logits, leaves 1.8: 0.551 of the tolerance; FIRE's MLP
weights, whose gradients are sums over every pair of the grid that largely
cancel, reach 0.8 of it on grids of 4 x 12 with 16 hidden units, so the
suite's FIRE cases are smaller grids), while a
gradient from a convention bug is off by a sizeable fraction
of ``max |g|`` (``tests/test_golden_gradients.py``). CoPE is the exception:
its position gradient jumps at every integer position, and a gate that
rounds to 1 in 16 bits puts a position on one, so such a backward pass
misses ``dq`` and ``dk`` by up to 12.7 times the tolerance; the
specification (float32 inside for 16-bit inputs) passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import SIXTEEN_BIT, ulp

__all__ = [
    "E_MAX_FACTOR",
    "E_MAX_ULPS",
    "RULE",
    "derive_tolerance",
    "e_max_agrees",
    "naive_environment",
    "safety_factor",
    "ulp_multiple",
]

#: Across environments (another NumPy build or CPU), a stored ``e_max`` must lie within
#: this factor, and this many ulps of max|golden|, of the naive pipeline's here.
E_MAX_FACTOR = 4.0
E_MAX_ULPS = 4.0

RULE = (
    "atol = max(k * e_max, m * ulp(max|golden|)); k = 3 for 16-bit dtypes, 10 otherwise; "
    "m = 8 for gradients in 16-bit dtypes, 64 for gradients in float64, 2 otherwise"
)


def safety_factor(dtype: str) -> float:
    """``k`` of the rule: 3 for float16 and bfloat16, 10 for float32 and float64.

    Why 3 in 16 bits: over the default suite, legitimate 16-bit forward
    passes (PyTorch eager with 16-bit matmuls and ``torch.softmax``, PyTorch
    ``scaled_dot_product_attention`` with the bias as a float mask, every
    operation of the specification in 16 bits on PyTorch and on JAX) reach
    at most 2.2 times the naive pipeline's ``e_max``, while the convention
    mistakes that change a case's output at all reach at least 5.1 times it
    (``tests/test_golden_tolerance.py``).
    """
    return 3.0 if dtype in SIXTEEN_BIT else 10.0


def ulp_multiple(dtype: str, *, gradient: bool = False) -> float:
    """``m`` of the rule: for a gradient 8 in float16 and bfloat16, 64 in float64; else 2.

    Examples
    --------
    >>> ulp_multiple("bfloat16", gradient=True), ulp_multiple("bfloat16")
    (8.0, 2.0)
    >>> ulp_multiple("float64", gradient=True), ulp_multiple("float32", gradient=True)
    (64.0, 2.0)
    """
    if not gradient:
        return 2.0
    if dtype in SIXTEEN_BIT:
        return 8.0
    return 64.0 if dtype == "float64" else 2.0


def derive_tolerance(
    golden: np.ndarray, naive: np.ndarray, dtype: str, *, gradient: bool = False
) -> dict[str, Any]:
    """The tolerance of one array, with its inputs and provenance.

    Parameters
    ----------
    golden : ndarray
        The float64 golden.
    naive : ndarray
        The naive pipeline's result, same shape.
    dtype : str
        The dtype under test.
    gradient : bool
        Whether the array is a gradient (``dq``, ``dk``, ``dv``, ``d_<table>``).

    Returns
    -------
    dict
        ``atol``, ``rtol`` (0), ``k``, ``e_max``, ``e_mean``,
        ``max_abs_golden``, ``ulp_floor`` (``m ulp(max|golden|)``) and ``rule``.

    Examples
    --------
    >>> import numpy as np
    >>> tol = derive_tolerance(np.array([1.0, 2.0]), np.array([1.0, 2.001]), "float32")
    >>> round(tol["atol"], 6), tol["k"]
    (0.01, 10.0)
    """
    err = np.abs(np.asarray(naive, dtype=np.float64) - np.asarray(golden, dtype=np.float64))
    e_max = float(err.max()) if err.size else 0.0
    e_mean = float(err.mean()) if err.size else 0.0
    top = float(np.abs(golden).max()) if golden.size else 0.0
    k = safety_factor(dtype)
    floor = ulp_multiple(dtype, gradient=gradient) * ulp(top, dtype)
    return {
        "atol": max(k * e_max, floor),
        "rtol": 0.0,
        "k": k,
        "e_max": e_max,
        "e_mean": e_mean,
        "max_abs_golden": top,
        "ulp_floor": floor,
        "rule": RULE,
    }


def naive_environment() -> str:
    """Where the naive pipeline runs: the versions and CPU dispatch its rounding depends on.

    NumPy picks ``exp``, ``sum`` and friends by CPU (AVX-512, AVX2, SSE,
    NEON), and their last bits differ between those builds: with NumPy 2.4
    limited to SSE4.2 (``NPY_DISABLE_CPU_FEATURES``), the naive ``e_max`` of
    the default suite's arrays is up to 2.61 times (13.9 ulps) away from the
    AVX-512 run. In one environment the pipeline is deterministic, so equal
    strings mean a bit-for-bit equal ``e_max`` (`e_max_agrees`).

    Examples
    --------
    >>> naive_environment().startswith("relpos-ref ")
    True
    """
    import platform

    import ml_dtypes

    from .. import __version__

    simd = []
    for where in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            module = __import__(where, fromlist=["__cpu_features__"])
        except ImportError:
            continue
        found = module.__cpu_features__
        simd = [*module.__cpu_baseline__,
                *(name for name in module.__cpu_dispatch__ if found.get(name))]
        break
    return (f"relpos-ref {__version__}, numpy {np.__version__}, ml_dtypes "
            f"{ml_dtypes.__version__}, {platform.machine()} {' '.join(simd) or 'unknown'}")


def e_max_agrees(stored: float, here: float, top: float, dtype: str, *,
                 same_environment: bool) -> bool:
    """Whether a stored ``e_max`` is the naive pipeline's, run `here` again.

    In the environment that generated the suite (`naive_environment`), bit
    for bit. Elsewhere, within `E_MAX_FACTOR` times and `E_MAX_ULPS` ulps of
    ``max|golden|`` either way. That window is no slack a forger can use:
    `relpos_ref.golden.Suite.load` compares results within the smaller of the
    stored tolerance and the one derived here (see ``docs/golden.md``).

    Examples
    --------
    >>> e_max_agrees(1e-7, 1e-7, 1.0, "float32", same_environment=True)
    True
    >>> e_max_agrees(2e-7, 1e-7, 1.0, "float32", same_environment=True)
    False
    >>> e_max_agrees(2e-7, 1e-7, 1.0, "float32", same_environment=False)
    True
    """
    if same_environment:
        return stored == here
    slack = E_MAX_ULPS * ulp(top, dtype)
    return stored <= E_MAX_FACTOR * here + slack and here <= E_MAX_FACTOR * stored + slack
