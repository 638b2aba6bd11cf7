"""Swin v2's continuous position bias against transformers' ``Swinv2SelfAttention``.

A small module (3 heads of width 4, its fixed 512-unit MLP, random weights):
the log-spaced coordinates, the ``16 sigma`` table, the bias matrix and the
attention output with a shifted-window style mask, through the ``hf-swinv2``
preset (``-w1``, the mask added twice: ``mask_penalty=-200``). transformers
builds its coordinates in float32; the table and attention comparisons put
ours (float64) into its buffer so that the rest is compared exactly. Also:
what the double mask changes, and transformers' edge cases of a window side
of 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref.presets import PRESETS

torch = pytest.importorskip("torch", reason="torch is not installed")
swinv2_hf = pytest.importorskip("transformers.models.swinv2.modeling_swinv2",
                                reason="transformers is not installed")

H, DH = 3, 4


def _module(window, pretrained=(0, 0), *, seed=0):
    from transformers import Swinv2Config

    torch.manual_seed(seed)
    config = Swinv2Config(qkv_bias=True, attention_probs_dropout_prob=0.0)
    att = swinv2_hf.Swinv2SelfAttention(config, H * DH, H, window, list(pretrained))
    att = att.double().eval()
    with torch.no_grad():
        for p in att.continuous_position_bias_mlp.parameters():
            p.normal_(0.0, 0.5)
    return att


def _weights(att):
    mlp = att.continuous_position_bias_mlp
    w1, b1, w2 = (x.detach().numpy() for x in (mlp[0].weight, mlp[0].bias, mlp[2].weight))
    return PRESETS["hf-swinv2"].to_canonical(w1), b1, w2


@pytest.mark.parametrize(("window", "pretrained"), [((3, 4), None), ((2, 2), None),
                                                    ((5, 3), (4, 6)), ((1, 3), (2, 2))])
def test_coordinates_equal_transformers(window, pretrained):
    att = _module(window, pretrained or (0, 0))
    theirs = att.relative_coords_table.reshape(-1, 2).numpy()  # built in float32
    ours = rp.swinv2_coordinates(*window, pretrained_window=pretrained, xp=np)
    np.testing.assert_allclose(ours, theirs, rtol=2e-7, atol=0)


def test_a_window_side_of_one_in_transformers():
    # normalized only when window_size[0] > 1: (1, Ww) keeps 8 dx, i.e. pretrained (2, 2);
    # (Wh, 1) divides dx = 0 by 0
    theirs = _module((1, 3)).relative_coords_table.reshape(-1, 2).numpy()
    np.testing.assert_allclose(theirs, rp.swinv2_coordinates(1, 3, pretrained_window=(2, 2),
                                                             xp=np), rtol=2e-7)
    assert not np.allclose(theirs, rp.swinv2_coordinates(1, 3, xp=np))
    assert np.isnan(_module((3, 1)).relative_coords_table.numpy()).any()
    assert np.isfinite(rp.swinv2_coordinates(3, 1, xp=np)).all()


@pytest.mark.parametrize(("window", "pretrained"), [((3, 4), None), ((4, 2), (6, 6))])
def test_table_and_bias_equal_transformers(window, pretrained):
    att = _module(window, pretrained or (0, 0))
    att.relative_coords_table = torch.from_numpy(
        rp.swinv2_coordinates(*window, pretrained_window=pretrained, xp=np))[None]
    w1, b1, w2 = _weights(att)
    with torch.no_grad():
        z = att.continuous_position_bias_mlp(att.relative_coords_table).view(-1, H)
        table = (16 * torch.sigmoid(z)).numpy()  # (n, h), rows for query minus key
        n = window[0] * window[1]
        bias = table[att.relative_position_index.view(-1)].reshape(n, n, H).transpose(2, 0, 1)
    ours = rp.swinv2_table(w1, b1, w2, *window, pretrained_window=pretrained)
    np.testing.assert_allclose(ours, table[::-1].T, rtol=0, atol=1e-13)
    np.testing.assert_allclose(rp.swinv2_bias(w1, b1, w2, *window, pretrained_window=pretrained),
                               bias, rtol=0, atol=1e-13)


def _attend(att, x, mask):
    """transformers' output ``(windows, h, n, d)`` for a boolean mask ``(nW, n, n)``."""
    with torch.no_grad():
        additive = torch.where(torch.from_numpy(mask), 0.0, -100.0).double()
        out = att(x, additive)[0]
    windows, n = x.shape[:2]
    return out.view(windows, n, H, DH).transpose(1, 2).numpy()


def _split(att, x, layer):
    windows, n = x.shape[:2]
    with torch.no_grad():
        return layer(x).view(windows, n, H, DH).transpose(1, 2).numpy()


@pytest.mark.parametrize("tau", [math.log(10.0), math.log(100.0), 6.0])
def test_attention_equals_transformers_with_its_double_mask(tau):
    wh, ww, n_windows, batch = 3, 4, 2, 2
    n = wh * ww
    att = _module((wh, ww), seed=1)
    att.relative_coords_table = torch.from_numpy(rp.swinv2_coordinates(wh, ww, xp=np))[None]
    with torch.no_grad():
        att.logit_scale.fill_(tau)
    x = torch.randn(batch * n_windows, n, H * DH, dtype=torch.float64)
    rng = np.random.default_rng(1)
    mask = (rng.random((n_windows, n, n)) > 0.4) | np.eye(n, dtype=bool)
    q, k, v = (_split(att, x, layer) for layer in (att.query, att.key, att.value))
    ours_mask = np.broadcast_to(mask[None, :, None], (batch, n_windows, H, n, n)).reshape(
        batch * n_windows, H, n, n)
    w1, b1, w2 = _weights(att)
    logit_scale = att.logit_scale.detach().numpy().reshape(-1)  # (h, 1, 1) -> (h,)
    ours = rp.swinv2_attention(q, k, v, w1, b1, w2, window_height=wh, window_width=ww,
                               logit_scale=logit_scale, mask=ours_mask,
                               **PRESETS["hf-swinv2"].params)
    np.testing.assert_allclose(ours, _attend(att, x, mask), rtol=0, atol=1e-13)


@pytest.mark.parametrize(("tau", "penalty", "masked_weight"), [
    (math.log(10.0), -100.0, 1.8e-35), (math.log(10.0), -200.0, 6.7e-79),
    (math.log(100.0), -100.0, 1.0), (math.log(100.0), -200.0, 0.5),
])
def test_what_the_double_mask_changes(tau, penalty, masked_weight):
    # a query aligned with a masked key and opposed to the allowed one (cos = 1 and -1),
    # equal biases: the masked logit is tau + penalty, the allowed one -tau
    q = np.asarray([[[1.0, 0.0], [1.0, 0.0]]])
    k = np.asarray([[[1.0, 0.0], [-1.0, 0.0]]])
    v = np.asarray([[[1.0], [0.0]]])
    mask = np.asarray([[False, True], [False, True]])
    zeros = np.zeros((4, 2)), np.zeros(4), np.zeros(4)
    kw = {"window_height": 1, "window_width": 2, "logit_scale": np.asarray(tau), "mask": mask}
    got = rp.swinv2_attention(q, k, v, *zeros, mask_penalty=penalty, **kw)[0, 0, 0]
    want = 1.0 / (1.0 + math.exp(-math.exp(tau) - (math.exp(tau) + penalty)))
    assert got == pytest.approx(want, rel=1e-12)
    assert got == pytest.approx(masked_weight, rel=0.01)
    assert rp.swinv2_attention(q, k, v, *zeros, **kw)[0, 0, 0] == 0.0  # left out: none
