"""The schemes' ReLU (FIRE's and Swin v2's MLPs) is torch.relu: values, NaN, infinities and
the gradient, none at 0."""

from __future__ import annotations

import numpy as np
import pytest

from relpos_ref.schemes._activations import relu

VALUES = [-2.0, -0.0, 0.0, 3.0, np.nan, -np.inf, np.inf]


def test_relu_keeps_nan_and_zeroes_what_is_not_above_zero():
    got = relu(np.asarray(VALUES))
    np.testing.assert_array_equal(got, [0.0, 0.0, 0.0, 3.0, np.nan, 0.0, np.inf])


def test_relu_passes_torch_s_gradient_under_autograd():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    want_x = x.detach().clone().requires_grad_()
    (got,) = torch.autograd.grad(relu(x).sum(), x)
    (want,) = torch.autograd.grad(torch.relu(want_x).sum(), want_x)
    np.testing.assert_array_equal(relu(x).detach().numpy(), torch.relu(want_x).detach().numpy())
    np.testing.assert_array_equal(got.numpy(), want.numpy())  # 0 at 0, 1 at NaN and inf
