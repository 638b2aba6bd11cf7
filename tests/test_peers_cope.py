"""CoPE against its peers: x-transformers' ``CoPE`` in ``Attend``, and the paper's Appendix B.

- x-transformers (``x_transformers.x_transformers.CoPE``, used by
  ``x_transformers.attend.Attend(cope=...)``): ``Attend`` scales ``q . k``,
  fills masked logits with ``-finfo.max``, then adds ``cope(q, sim)`` (the
  gates read the masked, scaled logits), softmax. Its flash path skips CoPE,
  so ``flash=False``; its softmax is float32 (``softmax(dtype=float32)``)
  unless ``custom_attn_fn`` is given, so a float64 softmax is passed to
  compare in float64. Outputs, and gradients of q, k, v and ``pos_emb`` by
  torch autograd, causal with a key mask.
- the paper (Golovneva et al. 2024, arXiv 2405.18719, Appendix B, "CoPE" and
  "SelfAttn"): re-expressed below as `_paper_self_attn` from the published
  listing: logits ``q k^T / sqrt(d)`` plus ``mask.log()``, gates their
  sigmoid, positions ``gates.flip(-1).cumsum(-1).flip(-1)`` clamped to
  ``npos_max - 1``, ``logits_int = q @ pos_emb`` with ``pos_emb`` of shape
  ``(1, d, npos_max)`` (ours transposed), interpolated by a gather at ceil
  and floor, added unscaled.
- the released training code (facebookresearch/RAM, projects/cope,
  ``ContextPosSelfAttn``) divides the sum ``q.k + term`` by ``sqrt(d)`` by
  default (``--cope-nodiv`` off): the term *is* scaled there, which is this
  scheme with the table times the scale (checked against a re-expression).

Each test reports the largest difference measured.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest

import relpos_ref as rp

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.peers


def _paper_self_attn(query, key, val, mask, pos_emb):
    """The paper's Appendix B attention, per batch of heads: (B, L, d) each; pos_emb (1, d, n)."""
    npos_max = pos_emb.shape[-1]
    attn_logits = torch.bmm(query, key.transpose(-1, -2)) / math.sqrt(query.shape[-1])
    attn_logits = attn_logits + mask.log()
    gates = torch.sigmoid(attn_logits)
    pos = gates.flip(-1).cumsum(dim=-1).flip(-1).clamp(max=npos_max - 1)
    pos_ceil, pos_floor = pos.ceil().long(), pos.floor().long()
    logits_int = torch.matmul(query, pos_emb)
    logits_ceil = logits_int.gather(-1, pos_ceil)
    logits_floor = logits_int.gather(-1, pos_floor)
    w = pos - pos_floor
    attn_logits = attn_logits + logits_ceil * w + logits_floor * (1 - w)
    return torch.bmm(torch.softmax(attn_logits, dim=-1), val)


def _inputs(seed, b, h, n, d, npos):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float64) * 1.5
               for _ in range(3))
    table = torch.randn(npos, d, generator=gen, dtype=torch.float64)
    return q, k, v, table


def _report(name, diffs):
    print(f"{name}: largest differences " + ", ".join(f"{n} {x:.1e}" for n, x in diffs.items()))


@pytest.mark.parametrize("npos", [3, 16])  # 3: the clamp is active for most pairs
def test_x_transformers_cope_in_attend(npos):
    xt = pytest.importorskip("x_transformers.x_transformers")
    attend_module = pytest.importorskip("x_transformers.attend")
    b, h, n, d = 2, 3, 9, 8
    q, k, v, table = _inputs(0, b, h, n, d, npos)
    key_mask = torch.rand(b, n, generator=torch.Generator().manual_seed(1)) < 0.8
    key_mask[:, 0] = True
    cope = xt.CoPE(dim=d, heads=h, max_pos=npos).double()
    with torch.no_grad():
        cope.pos_emb.copy_(table)
    attend = attend_module.Attend(causal=True, flash=False, cope=cope,
                                  custom_attn_fn=partial(torch.softmax, dim=-1))
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    d_out = torch.randn(b, h, n, d, generator=torch.Generator().manual_seed(2),
                        dtype=torch.float64)
    theirs = attend(*leaves, mask=key_mask[:, None, None, :])[0]
    theirs.backward(d_out)
    theirs = theirs.detach()
    mask = key_mask[:, None, None, :]
    ours = rp.cope_attention(q, k, v, table, mask=mask)
    grads = rp.cope_attention_vjp(q, k, v, table, mask=mask, d_output=d_out)
    diffs = {"output": float((ours - theirs).abs().max())}
    for name, leaf in zip(("q", "k", "v", "table"), (*leaves, cope.pos_emb), strict=True):
        diffs[name] = float((grads[name] - leaf.grad).abs().max())
    _report(f"x-transformers CoPE, max_pos {npos}", diffs)
    assert max(diffs.values()) < 1e-12, diffs  # measured below 1e-14 (float64)


def test_x_transformers_float32_softmax():
    # Attend's default float32 softmax: the difference is its rounding
    xt = pytest.importorskip("x_transformers.x_transformers")
    attend_module = pytest.importorskip("x_transformers.attend")
    q, k, v, table = _inputs(3, 1, 2, 12, 8, 6)
    cope = xt.CoPE(dim=8, heads=2, max_pos=6).double()
    with torch.no_grad():
        cope.pos_emb.copy_(table)
        theirs = attend_module.Attend(causal=True, flash=False, cope=cope)(q, k, v)[0]
    diff = float((rp.cope_attention(q, k, v, table) - theirs).abs().max())
    _report("x-transformers CoPE, float32 softmax", {"output": diff})
    assert diff < 1e-6, diff


@pytest.mark.parametrize("npos", [4, 13])
def test_the_papers_appendix_b(npos):
    b, h, n, d = 2, 2, 10, 8
    q, k, v, table = _inputs(4, b, h, n, d, npos)
    causal = torch.ones(n, n, dtype=torch.float64).tril()
    flat = [x.reshape(b * h, n, d).clone().requires_grad_(True) for x in (q, k, v)]
    pos_emb = table.T[None].clone().requires_grad_(True)  # (1, d, npos_max)
    d_out = torch.randn(b, h, n, d, generator=torch.Generator().manual_seed(5),
                        dtype=torch.float64)
    theirs = _paper_self_attn(*flat, causal, pos_emb).reshape(b, h, n, d)
    theirs.backward(d_out)
    theirs = theirs.detach()
    ours = rp.cope_attention(q, k, v, table)
    grads = rp.cope_attention_vjp(q, k, v, table, d_output=d_out)
    diffs = {"output": float((ours - theirs).abs().max())}
    for name, leaf in zip(("q", "k", "v"), flat, strict=True):
        diffs[name] = float((grads[name] - leaf.grad.reshape(b, h, n, d)).abs().max())
    diffs["table"] = float((grads["table"] - pos_emb.grad[0].T).abs().max())
    _report(f"paper Appendix B, npos_max {npos}", diffs)
    assert max(diffs.values()) < 1e-12, diffs


def test_the_released_code_scales_the_term():
    # facebookresearch/RAM's ContextPosSelfAttn (default, no --cope-nodiv):
    # softmax((q.k + term) / sqrt(d)), the gates sigma(q.k / sqrt(d)): our term is linear in
    # the table, so it is this scheme with the table times 1/sqrt(d)
    b, n, d, npos = 3, 8, 4, 5
    q, k, v, table = _inputs(6, b, 1, n, d, npos)
    q, k, v = q[:, 0], k[:, 0], v[:, 0]
    s = d**-0.5
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    gates = torch.sigmoid(q @ k.transpose(-1, -2) * s) * causal
    pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos - 1)
    fixed = q @ table.T
    low, high = pos.floor().long(), pos.ceil().long()
    w = pos - low
    term = fixed.gather(-1, high) * w + fixed.gather(-1, low) * (1 - w)
    logits = ((q @ k.transpose(-1, -2) + term) * s).masked_fill(~causal, -math.inf)
    theirs = torch.softmax(logits, -1) @ v
    ours = rp.cope_attention(q, k, v, table * s)
    diff = float((ours - theirs).abs().max())
    _report("RAM's released code (term scaled)", {"output": diff})
    assert diff < 1e-12, diff
    np.testing.assert_array_less(1e-3, float((rp.cope_attention(q, k, v, table)
                                              - theirs).abs().max()))
