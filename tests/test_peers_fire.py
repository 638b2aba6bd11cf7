"""FIRE against the PyTorch port of the paper's appendix code.

No pip package ships FIRE, so the peer is the port's module, transcribed below
as it stands in mcleish7/arithmetic, ``cramming/architectures/embeddings.py``
(class ``FIRE``; the same code as the paper's appendix: ``threshold =
abs(L_multiplier * init_L)``, ``log(abs(c * x) + 1)``, ``eps`` added to the
normaliser after its log, ``mlp(x.unsqueeze(-1))`` permuted to
``(1, heads, t, t)``). In eval mode its positions are ``0 .. t - 1``; our
``L`` is its ``L_multiplier * init_L``. Its positions are float32
(``randperm(dtype=torch.float)``), which would make a float64 module fail
(a float32 input to a float64 ``Linear``): the float64 comparisons run it
with ``torch.randperm`` handing back the same integers in float64 (exact in
either), the module's code untouched; one comparison runs it as it is, in
float32. Compared, in float64: the bias at
several lengths, below and beyond ``L`` (``L = 8`` with ``t = 20``, the
paper's ``L = 512`` with ``t = 600``); causal attention built from it against
`fire_attention`; decoding (queries at ``q_offset`` against a cache) against
rows of its full bias; and every gradient (q, k, v, the MLP, ``c`` and
``L_multiplier``) against autograd through it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import kernels

torch = pytest.importorskip("torch", reason="torch is not installed")


class FIRE(torch.nn.Module):
    """The port's module (mcleish7/arithmetic, cramming/architectures/embeddings.py), as is."""

    def __init__(self, num_heads=12, mlp_width=32, init_c=0.1, init_L=512.0, eps=1e-6,
                 max_length=0):
        super().__init__()
        self.max_length = max_length  # using random PE

        # Define the MLP layers
        self.mlp = torch.nn.Sequential(torch.nn.Linear(1, mlp_width), torch.nn.ReLU(),
                                       torch.nn.Linear(mlp_width, num_heads))

        # Initialize c (log transformation parameter)
        self.c = torch.nn.Parameter(torch.tensor(init_c))

        # Initialize L (threshold)
        self.init_L = torch.nn.Parameter(torch.tensor(init_L), requires_grad=False)
        self.L_multiplier = torch.nn.Parameter(torch.tensor(1.0))  # learn a multiplier to L

        self.eps = eps

    def forward(self, seq_length, device):
        if (seq_length > self.max_length) or (not self.training):
            max_length = seq_length
        else:
            max_length = self.max_length

        # take a subset (of length seq_length) of a random permutation of length max_length
        positions = torch.sort(torch.randperm(max_length, dtype=torch.float,
                                              device=device)[:seq_length]).values
        relative_distances = positions[:, None] - positions[None, :]

        # Thresholding the normalizer for short sequence modeling
        threshold = torch.abs(self.L_multiplier * self.init_L)
        position_normalizer = torch.max(positions, threshold)[:, None]

        # Amplifying differences among local positions with log transform
        relative_distances = torch.log(torch.abs(self.c * relative_distances) + 1)
        position_normalizer = torch.log(torch.abs(self.c * position_normalizer) + 1)

        # Progressive interpolation
        normalized_distances = relative_distances / (position_normalizer + self.eps)
        fire_bias = self.mlp(normalized_distances.unsqueeze(-1)).unsqueeze(0)
        fire_bias = fire_bias.permute(0, 3, 1, 2)

        return fire_bias


H, D, WIDTH = 3, 4, 32


@pytest.fixture(autouse=True)
def float64_positions(request, monkeypatch):
    """The port's positions (integers, exact either way) in float64, unless marked float32."""
    if "float32" in request.node.name:
        return
    randperm = torch.randperm

    def wide(n, *, dtype=None, device=None):
        return randperm(n, dtype=torch.float64 if dtype == torch.float else dtype, device=device)

    monkeypatch.setattr(torch, "randperm", wide)


def _peer(init_l, *, c=0.1, seed=0):
    torch.manual_seed(seed)
    module = FIRE(num_heads=H, mlp_width=WIDTH, init_c=c, init_L=init_l).double().eval()
    with torch.no_grad():
        for p in module.mlp.parameters():
            p.normal_(0.0, 0.7)
    return module


def _tables(module):
    first, last = module.mlp[0], module.mlp[2]
    return first.weight, first.bias, last.weight  # (m, 1), (m,), (H, m)


def _ours(module):
    return {"b2": module.mlp[2].bias, "c": module.c, "L": module.L_multiplier * module.init_L,
            "eps": module.eps}


def _peer_attention(bias, q, k, v):
    t = q.shape[-2]
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias[0]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    logits = logits.masked_fill(~causal, float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


LENGTHS = [(8.0, 1), (8.0, 5), (8.0, 8), (8.0, 9), (8.0, 20), (512.0, 20), (512.0, 600),
           (3.0, 40)]


@pytest.mark.parametrize(("init_l", "t"), LENGTHS)
def test_the_bias_equals_the_port(init_l, t):
    module = _peer(init_l)
    with torch.no_grad():
        want = module(t, "cpu")[0]
        got = rp.fire_bias(*_tables(module), t, t, **_ours(module))
    assert got.shape == (H, t, t)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-13, atol=1e-13)


def test_the_port_as_it_is_in_float32_within_its_rounding():
    torch.manual_seed(0)
    module = FIRE(num_heads=H, mlp_width=WIDTH, init_L=8.0).eval()  # float32 throughout
    with torch.no_grad():
        want = module(20, "cpu")[0].double()
        got = rp.fire_bias(*(p.double() for p in _tables(module)), 20, 20,
                           b2=module.mlp[2].bias.double(), c=module.c.double(), L=8.0,
                           eps=module.eps)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("init_l", "t"), [(8.0, 20), (512.0, 20), (4.0, 13)])
def test_attention_and_decode_equal_the_port(init_l, t):
    module = _peer(init_l, c=0.3, seed=1)
    rng = np.random.default_rng(2)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, H, t, D))) for _ in range(3))
    with torch.no_grad():
        want = _peer_attention(module(t, "cpu"), q, k, v)
        got = rp.fire_attention(q, k, v, *_tables(module), **_ours(module))
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
        for start in (0, t // 2, t - 1):  # a chunk of queries after a cache (end-aligned)
            step = rp.fire_attention(q[..., start:start + 2, :], k[..., :start + 2, :],
                                     v[..., :start + 2, :], *_tables(module), **_ours(module))
            np.testing.assert_allclose(step.numpy(), want[..., start:start + 2, :].numpy(),
                                       rtol=1e-12, atol=1e-12)
        # one query at its position: the port's row of the full bias
        row = rp.fire_bias(*_tables(module), 1, t, q_offset=t - 1, **_ours(module))
        np.testing.assert_allclose(row.numpy(), module(t, "cpu")[0, :, t - 1:].numpy(),
                                   rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(("init_l", "t"), [(8.0, 20), (5.0, 5), (512.0, 12)])
def test_gradients_equal_autograd_through_the_port(init_l, t):
    # L = 8 with t = 20: position 8 ties with L (torch.max halves there, as the VJP does)
    module = _peer(init_l, c=-0.2, seed=3)
    rng = np.random.default_rng(4)
    q, k, v = (torch.from_numpy(rng.standard_normal((2, H, t, D))).requires_grad_(True)
               for _ in range(3))
    d_out = torch.from_numpy(rng.standard_normal((2, H, t, D)))
    _peer_attention(module(t, "cpu"), q, k, v).backward(d_out)
    with torch.no_grad(), kernels.disabled():
        got = rp.fire_attention_vjp(q.detach(), k.detach(), v.detach(),
                                    *(p.detach() for p in _tables(module)),
                                    d_output=d_out, b2=module.mlp[2].bias.detach(),
                                    c=module.c.detach(),
                                    L=(module.L_multiplier * module.init_L).detach(),
                                    eps=module.eps)
    first, last = module.mlp[0], module.mlp[2]
    want = {"q": q.grad, "k": k.grad, "v": v.grad, "w1": first.weight.grad,
            "b1": first.bias.grad, "w2": last.weight.grad, "b2": last.bias.grad,
            "c": module.c.grad}
    for name, w in want.items():
        np.testing.assert_allclose(got[name].numpy(), w.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)
    # the port learns L_multiplier: d/d multiplier = init_L * d/dL
    np.testing.assert_allclose(float(got["L"]) * init_l, float(module.L_multiplier.grad),
                               rtol=1e-10, atol=1e-12)
