"""Every scheme under every transform: ``jax.jit`` (tables passed or closed over),
``jax.grad``, ``jax.vmap``, torch autograd (``gradcheck`` in float64) and
``torch.compile``; and bfloat16 between NumPy and torch in both directions.

Each transform runs the scheme's public ``*_attention`` on a small masked,
per-head case with a query offset and is compared with the plain call (or, for
gradients, with the specification's own backward pass, ``*_attention_vjp``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_gradients import SCHEMES, _call, _small, forward_of, vjp_of

from relpos_ref import backends


def _jax() -> Any:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


def _setup(scheme: str) -> tuple[Any, list[str], list[np.ndarray], dict, Any, np.ndarray]:
    case = _small(scheme)
    names, values, kwargs, mask = _call(case)
    return case, names, values, kwargs, mask, forward_of(case, names, values, kwargs, mask)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_jax_jit_with_tables_passed(scheme):
    jax = _jax()
    case, names, values, kwargs, mask, want = _setup(scheme)
    jmask = jax.numpy.asarray(mask)
    got = jax.jit(lambda *xs: forward_of(case, names, list(xs), kwargs, jmask))(
        *(jax.numpy.asarray(a) for a in values))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_jax_jit_with_tables_closed_over(scheme):
    jax = _jax()
    case, names, values, kwargs, mask, want = _setup(scheme)
    jnp = jax.numpy
    tables = [jnp.asarray(a) for a in values[3:]]
    jmask = jnp.asarray(mask)
    got = jax.jit(lambda q, k, v: forward_of(case, names, [q, k, v, *tables], kwargs, jmask))(
        *(jnp.asarray(a) for a in values[:3]))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_jax_grad_equals_the_specified_backward(scheme):
    jax = _jax()
    case, names, values, kwargs, mask, out = _setup(scheme)
    jnp = jax.numpy
    d_output = np.random.default_rng(3).standard_normal(out.shape)
    jmask = jnp.asarray(mask)

    def loss(*xs):
        return jnp.sum(forward_of(case, names, list(xs), kwargs, jmask) * d_output)

    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(values)))))(
        *(jnp.asarray(a) for a in values))
    want = vjp_of(case, d_output, names, values, kwargs, mask)
    for name, g in zip(names, grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), want[name], rtol=1e-10, atol=1e-12,
                                   err_msg=name)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_jax_vmap_over_a_batch(scheme):
    jax = _jax()
    case, names, values, kwargs, mask, _ = _setup(scheme)
    jnp = jax.numpy
    rng = np.random.default_rng(4)
    stacked = [np.stack([a, a + rng.standard_normal(a.shape)]) for a in values[:3]]
    tables = [jnp.asarray(a) for a in values[3:]]
    jmask = jnp.asarray(mask)
    got = jax.jit(jax.vmap(
        lambda q, k, v: forward_of(case, names, [q, k, v, *tables], kwargs, jmask)
    ))(*(jnp.asarray(a) for a in stacked))
    for i in range(2):
        want = forward_of(case, names, [a[i] for a in stacked] + values[3:], kwargs, mask)
        np.testing.assert_allclose(np.asarray(got[i]), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_torch_gradcheck(scheme):
    torch = pytest.importorskip("torch")
    case, names, values, kwargs, mask, _ = _setup(scheme)
    tensors = [torch.from_numpy(a.copy()).requires_grad_(True) for a in values]
    tmask = torch.from_numpy(mask)
    assert torch.autograd.gradcheck(
        lambda *xs: forward_of(case, names, list(xs), kwargs, tmask), tensors)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`")
def test_torch_compile(scheme):
    # aot_eager: TorchDynamo's capture and AOTAutograd's backward graph, without
    # inductor's code generation (minutes on a CPU, and not what can break here).
    # Dynamo warns that it traces through array-api-compat's lru_cache'd type tests.
    torch = pytest.importorskip("torch")
    case, names, values, kwargs, mask, want = _setup(scheme)
    tensors = [torch.from_numpy(a.copy()).requires_grad_(True) for a in values]
    tmask = torch.from_numpy(mask)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *xs: forward_of(case, names, list(xs), kwargs, tmask),
                             backend="aot_eager")
    out = compiled(*tensors)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-12, atol=1e-12)
    d_output = np.random.default_rng(5).standard_normal(want.shape)
    out.backward(torch.from_numpy(d_output))
    grads = vjp_of(case, d_output, names, values, kwargs, mask)
    for name, t in zip(names, tensors, strict=True):
        np.testing.assert_allclose(t.grad.numpy(), grads[name], rtol=1e-10, atol=1e-12,
                                   err_msg=name)


def test_bfloat16_moves_between_numpy_and_torch():
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    adapter = backends.get("torch")
    a = np.array([[1.5, -2.25], [3e38, 1e-3]], dtype=ml_dtypes.bfloat16)
    t = adapter.from_numpy(a)
    assert t.dtype == torch.bfloat16 and t.shape == (2, 2)
    assert torch.equal(t.view(torch.int16), torch.from_numpy(a.view(np.int16)))
    back = adapter.to_numpy(t)
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back.view(np.int16), a.view(np.int16))
    t[0, 0] = 7.0  # a copy: the NumPy array is untouched
    assert float(a[0, 0]) == 1.5
    assert adapter.from_numpy(np.zeros((0, 3), dtype=ml_dtypes.bfloat16)).shape == (0, 3)
