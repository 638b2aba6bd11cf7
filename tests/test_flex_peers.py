"""The FlexAttention export against attention-gym's and PyTorch's published score_mods.

attention-gym is not a package this project installs, so each published
score_mod is written here from its source, as a formula (the file is cited
beside it), and run through FlexAttention beside our export. Where the two
agree (ALiBi with a power-of-two head count, after attention-gym's PR #86)
the outputs are equal; where they do not (other head counts, the ``q - kv``
ALiBi before PR #86, the learnable bias's row order, the missing offset
when decoding) the test shows the difference and the call of ours that
reproduces theirs. docs/flex.md tabulates the same facts.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest

import relpos_ref as rp
from relpos_ref import kernels

torch = pytest.importorskip("torch", reason="torch is not installed")
flex = pytest.importorskip("torch.nn.attention.flex_attention",
                           reason="this torch has no FlexAttention")
from relpos_ref.flex import attend  # noqa: E402

pytestmark = [pytest.mark.peers, pytest.mark.filterwarnings(
    "ignore:flex_attention called without torch.compile:UserWarning")]


# -- their score_mods, transcribed --------------------------------------------------------

def gym_alibi(heads):
    """attention-gym ``attn_gym/mods/alibi.py``, ``generate_alibi_bias`` after PR #86.

    meta-pytorch/attention-gym @ a72972153a98ddb02aa2b57d7b3799fb42170b74: the
    slope of head ``h`` is ``2^(-(h + 1) 8 / H)`` and the bias ``(kv - q) slope``.
    """
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + (kv_idx - q_idx) * torch.exp2(-(h + 1) * 8.0 / heads)

    return score_mod


def gym_alibi_before_pr86(heads):
    """The same file before PR #86 (pytorch-labs/attention-gym, 2024): ``(q - kv) slope``."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) * torch.exp2(-(h + 1) * 8.0 / heads)

    return score_mod


def gym_local_window_bias(bias, window):
    """attention-gym ``examples/learnable_bias.py``, ``_apply_local_window_bias``.

    pytorch-labs/attention-gym @ fcad2317252de109551699a221aaaeb21e6a6721: a
    learned ``(2 W + 1,)`` table read at ``clamp(q - kv + W, 0, 2 W)``.
    """
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[torch.clamp(q_idx - kv_idx + window, 0, 2 * window)]

    return score_mod


def blog_relative_positional(score, b, h, q_idx, kv_idx):
    """PyTorch's FlexAttention blog post (pytorch.org/blog/flexattention): ``+ (q - kv)``."""
    return score + (q_idx - kv_idx)


def causal_mask(b, h, q_idx, kv_idx):
    """Their causal mask (attention-gym and the blog): ``q_idx >= kv_idx``, no offset."""
    return q_idx >= kv_idx


# -- running them -------------------------------------------------------------------------

def _unfused():
    name = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"  # see tests/test_flex.py
    if not hasattr(flex, name):
        return contextlib.nullcontext()
    return mock.patch.object(flex, name, True)


def _theirs(q, k, v, score_mod, causal=False):
    block_mask = None
    if causal:
        block_mask = flex.create_block_mask(causal_mask, None, None, q.shape[-2], k.shape[-2],
                                            device="cpu")
    with _unfused():
        return flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)


def _ours(scheme, q, k, v, *tables, **kwargs):
    with _unfused():
        return attend(scheme, q, k, v, *tables, **kwargs)


def _spec(scheme, q, k, v, *tables, **kwargs):
    with kernels.disabled():
        return getattr(rp, f"{scheme}_attention")(q, k, v, *tables, **kwargs)


def _qkv(heads, t_q=9, t_k=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, heads, t, 8, generator=g, dtype=torch.float64)
                 for t in (t_q, t_k, t_k))


def _gym_slopes(heads):
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)],
                        dtype=torch.float64)


def _equal(a, b):
    # their slopes are float32 tensors (exp2 of an int tensor over a float): exact for a
    # power-of-two exponent only; the float64 rest agrees to 1e-12
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def _differ(a, b):
    assert (a - b).abs().max() > 1e-3


# -- where they agree ---------------------------------------------------------------------

@pytest.mark.parametrize("heads", [1, 2, 4, 8, 16])
def test_gym_alibi_equals_ours_for_power_of_two_heads(heads):
    q, k, v = _qkv(heads)
    want = _spec("alibi", q, k, v, causal=True)
    _equal(_theirs(q, k, v, gym_alibi(heads), causal=True), want)
    _equal(_ours("alibi", q, k, v, causal=True), want)
    # the slopes themselves: Press et al.'s geometric sequence
    _equal(torch.tensor(rp.alibi_slopes(heads), dtype=torch.float64), _gym_slopes(heads))


# -- where they differ --------------------------------------------------------------------

@pytest.mark.parametrize("heads", [3, 5, 6, 12])
def test_gym_alibi_slopes_differ_for_other_head_counts(heads):
    q, k, v = _qkv(heads)
    theirs = _theirs(q, k, v, gym_alibi(heads), causal=True)
    _differ(theirs, _ours("alibi", q, k, v, causal=True))  # the paper's slopes
    assert not torch.allclose(torch.tensor(rp.alibi_slopes(heads), dtype=torch.float64),
                              _gym_slopes(heads))
    # their formula's slopes, passed as ours: the same attention
    _equal(theirs, _ours("alibi", q, k, v, causal=True, slopes=_gym_slopes(heads)))


def test_gym_alibi_without_a_mask_is_the_causal_form_both_ways():
    # no mask: (kv - q) slope rewards future keys; ours is -slope |r| unless asked
    q, k, v = _qkv(4)
    theirs = _theirs(q, k, v, gym_alibi(4))
    _differ(theirs, _ours("alibi", q, k, v))
    _equal(theirs, _ours("alibi", q, k, v, symmetric=False))


def test_gym_alibi_before_pr86_has_the_opposite_sign():
    q, k, v = _qkv(4)
    theirs = _theirs(q, k, v, gym_alibi_before_pr86(4), causal=True)
    _differ(theirs, _ours("alibi", q, k, v, causal=True))
    # q - kv = -r: the paper's slopes negated, so the far past is favoured
    _equal(theirs, _ours("alibi", q, k, v, causal=True, slopes=-_gym_slopes(4)))


def test_gym_learnable_bias_reads_rows_in_reverse():
    window = 3
    q, k, v = _qkv(2)
    table = torch.randn(2 * window + 1, generator=torch.Generator().manual_seed(1),
                        dtype=torch.float64)
    theirs = _theirs(q, k, v, gym_local_window_bias(table, window))
    # their row q - kv + W is -r + W: our row r + K of the table reversed, K = W
    _equal(theirs, _ours("bias", q, k, v, table.flip(0)))
    _differ(theirs, _ours("bias", q, k, v, table))


def test_blog_relative_positional_is_a_negative_unit_slope():
    q, k, v = _qkv(3)
    theirs = _theirs(q, k, v, blog_relative_positional)
    # q - kv = -r: a causal-form ALiBi with slope -1 in every head
    _equal(theirs, _ours("alibi", q, k, v, symmetric=False, slopes=-torch.ones(3,
                                                                                dtype=q.dtype)))


def test_their_indices_carry_no_offset_when_decoding():
    # 3 new queries after 6 cached keys: positions 6, 7, 8 against keys 0 .. 8
    q, k, v = _qkv(4, t_q=3, t_k=9)
    want = _spec("alibi", q, k, v, causal=True, q_offset=6)
    _equal(_ours("alibi", q, k, v, causal=True, q_offset=6), want)
    theirs = _theirs(q, k, v, gym_alibi(4), causal=True)
    _differ(theirs, want)
    _equal(theirs, _ours("alibi", q, k, v, causal=True, q_offset=0))  # start-aligned


def test_t5_is_exported_unscaled():
    # FlexAttention's default scale is 1/sqrt(E) and its score arrives scaled; T5 never
    # scales (and no T5 score_mod is published): the export passes scale=1.0
    q, k, v = _qkv(2)
    table = torch.zeros(2, 8, dtype=torch.float64)
    with _unfused():
        unscaled = flex.flex_attention(q, k, v, scale=1.0)
        default = flex.flex_attention(q, k, v)
    _equal(_ours("t5", q, k, v, table), unscaled)
    _differ(_ours("t5", q, k, v, table), default)
