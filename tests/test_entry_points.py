"""Every entry point reads a call the same way: the scheme's function, blocked, golden.

For every scheme of the catalog, one golden case's inputs go through three
doors: ``relpos_ref.<scheme>_attention`` (kernels and specification),
`relpos_ref.blocked.blocked_attention` and the golden recomputation
(`relpos_ref.golden.pipeline.golden_arrays`). They must agree with the
defaults left out, with ``None`` passed for ``scale``, ``causal`` and
``q_offset``, and with each of those and each option given a non-default
value (the parameter a golden case records).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import relpos_ref as rp
from relpos_ref import catalog, golden, kernels
from relpos_ref.blocked import blocked_attention
from relpos_ref.golden.pipeline import golden_arrays

#: Small sizes and, per scheme, option values that differ from the defaults.
SIZES = {"T": None, "K": 2, "P": None, "M": 4, "t_max": 9, "height": 2, "width": 3, "buckets": 8,
         "d_model": 4, "rows": 9, "span": 3, "hidden": 3, "npos": 3}
OTHER_OPTIONS = {
    "shaw": {"beyond": "zero"}, "bias": {"beyond": "zero"}, "music": {"beyond": "zero"},
    "general": {"order": "future_to_past"}, "t5": {"bidirectional": False, "max_distance": 9},
    "alibi": {"symmetric": False}, "kerple": {"kernel": "power"},
    "sandwich": {"d_bar": 16, "start": 1}, "rope": {"layout": "interleaved", "base": 100.0},
    "xpos": {"layout": "half", "scale_base": 8.0, "center": "middle_up"},
    "transformer_xl": {"clamp_len": 2}, "deberta": {"max_position": 8},
    "absolute": {}, "grid2d": {}, "swin": {}, "swinv2": {}, "forgetting": {}, "cope": {},
    "fire": {"c": -0.3, "L": 3.0, "eps": 0.01},
}
GIVEN = ("omitted", "none", "scale", "causal", "q_offset", "options")


def _accepts(entry, name):
    return name in inspect.signature(entry.attention).parameters


def _case(entry, given):
    params = {"h": 2, "t_q": 5, "t_k": 7, "d": 4, "per_head": True,
              **{s.key: SIZES[s.key] for s in entry.sizes}}
    if given == "scale":
        params["scale"] = 0.7
    if given == "causal":
        params["causal"] = not entry.defaults.causal
    if given == "q_offset":
        params["q_offset"] = 3
        if entry.name == "forgetting":  # query 4 at 7 reads a gate past the last key
            params["T"] = 8
    if given == "options":
        params.update(OTHER_OPTIONS[entry.name])
    return golden.Case.make(entry.name, "agree", dtype="float64", **params)


def _keywords(entry, case, given):
    p = case.parameters
    kwargs = {} if given != "options" else dict(OTHER_OPTIONS[entry.name])
    kwargs.update({o: v for o, v in entry.options_from(p).items()
                   if o in ("height", "width", "window_height", "window_width")})
    for name in ("scale", "causal", "q_offset"):
        if not _accepts(entry, name):
            continue
        if given == "none":
            kwargs[name] = None
        elif given == name:
            kwargs[name] = p[name]
    return kwargs


@pytest.mark.parametrize("given", GIVEN)
@pytest.mark.parametrize("scheme", catalog.names())
def test_direct_blocked_and_golden_agree(scheme, given):
    entry = catalog.get(scheme)
    if given in ("causal", "q_offset") and not _accepts(entry, given):
        pytest.skip(f"{scheme}_attention takes no `{given}`")
    if given == "causal" and scheme == "forgetting":
        pytest.skip("the forgetting bias is causal only: causal=False is refused")
    if given == "options" and not OTHER_OPTIONS[scheme]:
        pytest.skip(f"{scheme} has no option besides its grid")
    case = _case(entry, given)
    inputs = case.inputs()
    want = golden_arrays(case, inputs)["output"]
    tables = entry.table_args({t.name: inputs[t.name] for t in entry.tables if t.name in inputs})
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    kwargs = _keywords(entry, case, given)
    direct = getattr(rp, f"{scheme}_attention")(q, k, v, *tables, **kwargs)
    with kernels.disabled():
        spec = getattr(rp, f"{scheme}_attention")(q, k, v, *tables, **kwargs)
    found = [("direct", direct), ("specification", spec)]
    if scheme == "cope":  # a position sums the gates of the whole row: no tile of its own
        with pytest.raises(ValueError, match="blocked attention cannot evaluate `scheme` 'cope'"):
            blocked_attention(q, k, v, *tables, scheme=scheme, block_size=3, **kwargs)
    else:
        found.append(("blocked", blocked_attention(q, k, v, *tables, scheme=scheme,
                                                   block_size=3, **kwargs)))
    for name, got in found:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)


def test_the_reported_t5_disagreement_is_gone():
    # issue 14: with scale=None the direct call scaled by 1/sqrt(d) and blocked did not
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 4)) for _ in range(3))
    table = rng.standard_normal((2, 32))
    direct = rp.t5_attention(q, k, v, table, scale=None)
    blocked = blocked_attention(q, k, v, table, scheme="t5", scale=None)
    np.testing.assert_allclose(direct, blocked, rtol=1e-12)
    np.testing.assert_allclose(direct, rp.t5_attention(q, k, v, table, scale=1.0), rtol=1e-12)


@pytest.mark.parametrize("scheme", catalog.names())
def test_golden_cases_record_the_resolved_defaults(scheme):
    entry = catalog.get(scheme)
    case = _case(entry, "omitted")
    p = case.parameters
    assert isinstance(p["scale"], float) and isinstance(p["causal"], bool)
    assert isinstance(p["q_offset"], int)
    assert p["causal"] == entry.defaults.causal
    if entry.defaults.q_offset == "end":
        assert p["q_offset"] == p["t_k"] - p["t_q"]
