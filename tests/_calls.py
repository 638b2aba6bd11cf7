"""Hypothesis strategies for calls of every catalog scheme, shared by the kernel tests.

`calls` draws the arguments of one ``*_attention`` call on NumPy arrays:
shapes, offsets, causality, masks (random, broadcast, with empty rows), the
scheme's policies and options, shared or per-head tables and scales.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from relpos_ref import catalog


def draw_mask(draw, rng, t_q, t_k):
    """A mask of one of five kinds: none, random, with empty rows, broadcast, one row."""
    kind = draw(st.sampled_from(["none", "random", "empty rows", "broadcast", "row"]))
    if kind == "none":
        return None
    if kind == "random":
        return rng.random((t_q, t_k)) < 0.7
    if kind == "empty rows":
        mask = rng.random((t_q, t_k)) < 0.8
        mask[::2] = False
        return mask
    if kind == "broadcast":  # leading axes of its own: the scores (and gradients) widen
        return rng.random((2, 1, t_q, t_k)) < 0.7
    return rng.random((1, t_k)) < 0.7


def rope_scalings(pairs: int, trained: int = 4) -> list[dict | None]:
    """One scaling of each rope_type for `pairs` rotated pairs, switching at length `trained`.

    Small trained lengths, so that the calls of a few tokens cross them: the
    length-dependent rules (dynamic, longrope per call) change within a draw.
    """
    return [
        None,
        {"rope_type": "linear", "factor": 3.0},
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": trained},
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": trained,
         "policy": "fixed"},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4 * trained,
         "beta_fast": 2.0, "beta_slow": 0.5},
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": trained,
         "mscale": 0.7, "mscale_all_dim": 1.0, "softmax_mscale": True, "truncate": False},
        {"rope_type": "longrope", "short_factor": [1.0, 1.5][:pairs],
         "long_factor": [2.0, 5.0][:pairs], "original_max_position_embeddings": trained,
         "max_position_embeddings": 4 * trained},
        {"rope_type": "longrope", "short_factor": [1.0, 1.5][:pairs],
         "long_factor": [2.0, 5.0][:pairs], "original_max_position_embeddings": trained,
         "factor": 4.0, "max_position_embeddings": 4 * trained, "policy": "fixed"},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 16},
        {"rope_type": "proportional", "partial_rotary_factor": 0.5},
    ]


def _lengths(draw, scheme, longest=9):
    """t_q, t_k (up to `longest`), q_offset and the scheme's sizes and options."""
    t_q, t_k = draw(st.integers(0, longest)), draw(st.integers(0, longest))
    q_offset = draw(st.integers(-4 * longest // 9, 8 * longest // 9))
    sizes, options = {}, {}
    if scheme in ("shaw", "bias"):
        sizes["K"] = draw(st.integers(0, max(4, longest // 2)))
        options["beyond"] = draw(st.sampled_from(["clip", "zero", "error"]))
        if draw(st.booleans()):  # asymmetric clipping: rows for r = -P .. K
            sizes["P"] = options["max_past"] = draw(st.integers(0, max(4, longest // 2)))
    elif scheme == "music":
        sizes["M"] = draw(st.integers(1, max(12, longest + 3)))
        options["beyond"] = draw(st.sampled_from(["clip", "zero"]))
        q_offset = draw(st.sampled_from([t_k - t_q, q_offset]))  # the skew and the rest
    elif scheme == "general":
        t_q, t_k = max(t_q, 1), max(t_k, 1)
        reach = max(abs(t_q - 1 + q_offset), abs(t_k - 1 - q_offset))
        sizes["t_max"] = max(t_q, t_k, reach + 1) + draw(st.integers(0, 3))
        options["order"] = draw(st.sampled_from(["past_to_future", "future_to_past"]))
    elif scheme in ("grid2d", "swin", "swinv2"):
        side = 4 if longest < 16 else 6
        h, w = draw(st.integers(1, side)), draw(st.integers(1, side))
        sizes.update(height=h, width=w)
        if scheme == "swinv2":
            sizes["hidden"] = draw(st.sampled_from([1, 5]))
            options["pretrained_window"] = draw(st.sampled_from([None, (3, 2)]))
            options["mask_penalty"] = draw(st.sampled_from([None, -7.0]))
        t_q = t_k = h * w
        q_offset = 0
        if scheme == "grid2d":
            options.update(height=h, width=w)
        else:
            options.update(window_height=h, window_width=w)
    elif scheme == "t5":
        sizes["buckets"] = draw(st.sampled_from([4, 8, 16]))
        options["bidirectional"] = draw(st.booleans())
        options["max_distance"] = draw(st.integers(sizes["buckets"] // 2, 20))
    elif scheme == "alibi":
        options["symmetric"] = draw(st.booleans())
    elif scheme == "kerple":
        options["kernel"] = draw(st.sampled_from(["log", "power"]))
    elif scheme == "sandwich":
        options["d_bar"] = draw(st.sampled_from([2, 16]))
        options["start"] = draw(st.sampled_from([0, 1]))
    elif scheme == "rope":
        options["layout"] = draw(st.sampled_from(["half", "interleaved"]))
        options["rotary_dim"] = draw(st.sampled_from([None, 2]))
        pairs = 2 if options["rotary_dim"] is None else 1  # d = 4
        scaling = draw(st.sampled_from(rope_scalings(pairs)))
        if scaling is not None:
            options["scaling"] = scaling
        if draw(st.booleans()):
            options["angles"] = draw(st.sampled_from(["float64", "float32"]))
    elif scheme == "xpos":
        options["layout"] = draw(st.sampled_from(["half", "interleaved"]))
        options["rotary_dim"] = draw(st.sampled_from([None, 2]))
        options["scale_base"] = draw(st.sampled_from([4.0, 512.0]))
        options["center"] = draw(st.sampled_from(["middle", "middle_up", 0, 3]))
    elif scheme == "transformer_xl":
        sizes["d_model"] = draw(st.sampled_from([2, 6]))
        options["clamp_len"] = draw(st.sampled_from([None, 0, 2]))
    elif scheme == "deberta":
        sizes["span"] = draw(st.integers(2, max(5, longest // 2)))
        options["max_position"] = draw(st.sampled_from([None, 2 * sizes["span"] + 3]))
    elif scheme == "absolute":
        sizes["rows"] = t_k + draw(st.integers(0, 3))
    elif scheme == "fire":  # thresholds below, at and above the positions; c of either sign
        sizes["hidden"] = draw(st.sampled_from([1, 5]))
        options["c"] = draw(st.sampled_from([0.1, -0.7, 0.0, 2.0]))
        options["L"] = draw(st.sampled_from([512.0, 3.0, 4.0, -2.0, 0.0]))
        options["eps"] = draw(st.sampled_from([1e-6, 0.5]))
    elif scheme == "forgetting":  # a gate per key (or a few more); every query has its own
        sizes["T"] = t_k + draw(st.sampled_from([0, 0, 2]))
        q_offset = draw(st.sampled_from([t_k - t_q, min(q_offset, sizes["T"] - t_q)]))
    elif scheme == "cope":  # a few rows: the clamp at max_pos - 1 is reached
        sizes["npos"] = draw(st.integers(1, 6))
    return t_q, t_k, q_offset, sizes, options


@st.composite
def calls(draw, scheme, dtypes=("float32", "float64"), longest=9, heads=None):
    """(args, kwargs) of one ``*_attention`` call on NumPy arrays of one of `dtypes`.

    Sequences have up to `longest` queries and keys; `heads`, a strategy, draws
    the number of heads (default 1 to 3).
    """
    entry = catalog.get(scheme)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from(dtypes))
    heads, d = draw(st.integers(1, 3) if heads is None else heads), 4
    t_q, t_k, q_offset, sizes, options = _lengths(draw, scheme, longest)
    per_head = draw(st.booleans())
    switches = {t.switch: draw(st.booleans()) for t in entry.tables if t.switch}
    if scheme == "deberta" and not any(switches.values()):
        switches["c2p"] = True
    shapes = entry.table_shapes(sizes, d=d, d_v=3, heads=heads if per_head else None,
                                include=switches)

    def normal(*shape):
        return (rng.standard_normal(shape) * 2).astype(dtype)

    lead = draw(st.sampled_from([(heads,), (2, heads)]))
    q, k, v = normal(*lead, t_q, d), normal(*lead, t_k, d), normal(*lead, t_k, 3)
    tables = {name: normal(*shape) for name, shape in shapes.items()}
    kwargs = dict(options, mask=draw_mask(draw, rng, t_q, t_k), return_weights=True,
                  scale=draw(st.sampled_from([None, 0.7, -0.3])))
    if scheme not in ("grid2d", "swin", "swinv2"):
        kwargs["q_offset"] = q_offset
    if scheme == "swinv2" and draw(st.booleans()):  # cosine attention, tau per head or one
        kwargs["scale"] = None
        shape = draw(st.sampled_from([(), (heads,)]))
        kwargs["logit_scale"] = np.asarray(rng.random(shape) * 6, dtype=dtype)
    if scheme == "fire" and draw(st.booleans()):  # the output layer's bias, per head or one
        kwargs["b2"] = np.asarray(normal(*draw(st.sampled_from([(heads,), (), (1,)]))))
    if scheme == "forgetting":  # causal only
        kwargs["causal"] = draw(st.sampled_from([None, True]))
    elif scheme not in ("swin", "swinv2"):
        kwargs["causal"] = draw(st.sampled_from([None, True, False]))
    if scheme == "plain":
        if draw(st.booleans()):
            kwargs["position"] = normal(t_q, t_k)
        if draw(st.booleans()):
            kwargs["bias"] = normal(heads, t_q, t_k)
    if scheme == "alibi" and draw(st.booleans()):
        kwargs["slopes"] = (rng.random(heads) + 0.1).astype(dtype)
    if scheme == "kerple":  # per-head parameters (> 0), or the defaults
        for name in ("r1", "r2"):
            if draw(st.booleans()):
                kwargs[name] = (rng.random(heads) + 0.1).astype(dtype)
    return (q, k, v, *entry.table_args(tables)), kwargs
