"""Loop-style NumPy definitions, element by element, written from the formulas.

Independent of the code under test: no vectorized tricks, no imports from
``relpos_ref``. Each function is the sentence of the design notes or the
paper, spelled out with ``for`` loops and ``math`` in float64.
"""

from __future__ import annotations

import math

import numpy as np


def relative_positions(t_q: int, t_k: int, q_offset: int = 0) -> np.ndarray:
    """r[i, j] = pos_k(j) - pos_q(i) with pos_q(i) = i + q_offset, pos_k(j) = j."""
    out = np.zeros((t_q, t_k), dtype=np.int64)
    for i in range(t_q):
        for j in range(t_k):
            out[i, j] = j - (i + q_offset)
    return out


def table_index(r: np.ndarray, k: int, beyond: str) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided table: rows for -K..K, row r + K; beyond the table per policy."""
    index = np.zeros(r.shape, dtype=np.int64)
    valid = np.zeros(r.shape, dtype=bool)
    for pos in np.ndindex(r.shape):
        d = int(r[pos])
        if -k <= d <= k:
            index[pos], valid[pos] = d + k, True
        elif beyond == "error":
            raise ValueError(d)
        else:
            nearest = -k if d < -k else k
            index[pos], valid[pos] = nearest + k, beyond == "clip"
    return index, valid


def causal_table_index(r: np.ndarray, m: int, beyond: str) -> tuple[np.ndarray, np.ndarray]:
    """One-sided table: rows for -(M-1)..0, row r + M - 1; the future has no row."""
    index = np.zeros(r.shape, dtype=np.int64)
    valid = np.zeros(r.shape, dtype=bool)
    for pos in np.ndindex(r.shape):
        d = int(r[pos])
        if d > 0:
            index[pos], valid[pos] = m - 1, False
        elif d >= -(m - 1):
            index[pos], valid[pos] = d + m - 1, True
        elif beyond == "error":
            raise ValueError(d)
        else:
            index[pos], valid[pos] = 0, beyond == "clip"
    return index, valid


def grid_positions(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Token n of a row-major h x w grid sits at (n // w, n % w)."""
    rows, cols = [], []
    for y in range(h):
        for x in range(w):
            rows.append(y)
            cols.append(x)
    return np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)


def relative_to_absolute(
    x: np.ndarray, t_k: int, offset: int, q_offset: int = 0, reverse: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """out[..., i, j] = x[..., i, r + offset]; zero where the column does not exist.

    With ``reverse=True`` the columns run from the most distant future:
    column c stands for r = offset - c. Also returns where the column exists.
    """
    *batch, t_q, n_rel = x.shape
    out = np.zeros((*batch, t_q, t_k), dtype=x.dtype)
    exists = np.zeros((t_q, t_k), dtype=bool)
    for i in range(t_q):
        for j in range(t_k):
            r = j - (i + q_offset)
            c = offset - r if reverse else r + offset
            if 0 <= c < n_rel:
                out[..., i, j] = x[..., i, c]
                exists[i, j] = True
    return out, exists


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    scale: float | None = None,
    mask: np.ndarray | None = None,
    causal: bool = False,
    q_offset: int = 0,
    bias: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """softmax over allowed keys of scale * q.k + bias, times v; empty rows zero.

    Computed in float64 with explicit loops over queries and keys.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    t_q, d = q.shape[-2:]
    t_k, d_v = v.shape[-2:]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    bias = np.zeros((t_q, t_k)) if bias is None else np.asarray(bias, dtype=np.float64)
    mask = np.ones((t_q, t_k), dtype=bool) if mask is None else np.asarray(mask)
    batch = np.broadcast_shapes(
        q.shape[:-2], k.shape[:-2], v.shape[:-2], bias.shape[:-2], mask.shape[:-2]
    )
    q = np.broadcast_to(q, (*batch, t_q, d))
    k = np.broadcast_to(k, (*batch, t_k, d))
    v = np.broadcast_to(v, (*batch, t_k, d_v))
    bias = np.broadcast_to(bias, (*batch, t_q, t_k))
    mask = np.broadcast_to(mask, (*batch, t_q, t_k))
    out = np.zeros((*batch, t_q, d_v))
    weights = np.zeros((*batch, t_q, t_k))
    for b in np.ndindex(batch):
        for i in range(t_q):
            scores = {}
            for j in range(t_k):
                if not mask[(*b, i, j)]:
                    continue
                if causal and j - (i + q_offset) > 0:
                    continue
                dot = sum(q[(*b, i, c)] * k[(*b, j, c)] for c in range(d))
                value = s * dot + bias[(*b, i, j)]
                if value != -math.inf:
                    scores[j] = value
            if not scores:
                continue
            top = max(scores.values())
            total = sum(math.exp(x - top) for x in scores.values())
            for j, x in scores.items():
                w = math.exp(x - top) / total
                weights[(*b, i, j)] = w
                for c in range(d_v):
                    out[(*b, i, c)] += w * v[(*b, j, c)]
    return out, weights


# --- schemes -------------------------------------------------------------------------------
# Each scheme is described by the vector it adds to k_j for query i (a "key row", dotted with
# q_i and scaled with the content term), the vector it adds to v_j (a "value row"), and a
# scalar bias added after scaling. ``None`` means "no term" for that pair.


def table_row(table: np.ndarray, head: int, row: int, scalar: bool = False) -> np.ndarray:
    """Row of a table for a head: tables are (n, d) / (n,) shared or (h, n, d) / (h, n)."""
    shared_ndim = 1 if scalar else 2
    return table[row] if table.ndim == shared_ndim else table[head, row]


def relative_attention(
    q,
    k,
    v,
    *,
    key_row=None,
    value_row=None,
    bias_value=None,
    scale=None,
    mask=None,
    causal=False,
    q_offset=0,
):
    """softmax_j(s (q_i.k_j + q_i.key_row(h,i,j)) + bias_value(h,i,j)) (v_j + value_row(h,i,j)).

    Loops in float64; `h` is the index on axis -3 of the broadcast batch (0 without one).
    Returns (out, weights, position) with position[b, i, j] = q_i . key_row (0 where None).
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    t_q, d = q.shape[-2:]
    t_k, d_v = v.shape[-2:]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    mask = np.ones((t_q, t_k), dtype=bool) if mask is None else np.asarray(mask)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], mask.shape[:-2])
    q = np.broadcast_to(q, (*batch, t_q, d))
    k = np.broadcast_to(k, (*batch, t_k, d))
    v = np.broadcast_to(v, (*batch, t_k, d_v))
    mask = np.broadcast_to(mask, (*batch, t_q, t_k))
    out = np.zeros((*batch, t_q, d_v))
    weights = np.zeros((*batch, t_q, t_k))
    position = np.zeros((*batch, t_q, t_k))
    for b in np.ndindex(batch):
        h = b[-1] if len(b) >= 1 else 0
        for i in range(t_q):
            scores = {}
            for j in range(t_k):
                extra = None if key_row is None else key_row(h, i, j)
                pos = 0.0 if extra is None else float(np.dot(q[(*b, i)], extra))
                position[(*b, i, j)] = pos
                if not mask[(*b, i, j)] or (causal and j - (i + q_offset) > 0):
                    continue
                value = s * (float(np.dot(q[(*b, i)], k[(*b, j)])) + pos)
                if bias_value is not None:
                    value += bias_value(h, i, j)
                scores[j] = value
            if not scores:
                continue
            top = max(scores.values())
            total = sum(math.exp(x - top) for x in scores.values())
            for j, x in scores.items():
                w = math.exp(x - top) / total
                weights[(*b, i, j)] = w
                row = v[(*b, j)].copy()
                if value_row is not None:
                    extra = value_row(h, i, j)
                    if extra is not None:
                        row = row + extra
                out[(*b, i)] += w * row
    return out, weights, position


def shaw_row(table, k_max, beyond, q_offset, past=None):
    """Shaw et al.: row clip(r, -K, K) + K; under "zero" no term beyond the table.

    With `past` P (asymmetric clipping, wav2vec2-BERT): row clip(r, -P, K) + P.
    """
    past = k_max if past is None else past

    def row(h, i, j):
        r = j - (i + q_offset)
        if not -past <= r <= k_max and beyond == "zero":
            return None
        return np.asarray(table_row(table, h, max(-past, min(k_max, r)) + past), float)

    return row


def music_row(table, beyond, q_offset):
    """Huang et al.: row r + M - 1 for -(M-1) <= r <= 0; none for the future."""
    m = table.shape[-2]

    def row(h, i, j):
        r = j - (i + q_offset)
        if r > 0 or (r < -(m - 1) and beyond == "zero"):
            return None
        return np.asarray(table_row(table, h, max(r, -(m - 1)) + m - 1), float)

    return row


def general_row(table, q_offset, order):
    """Row r + t_max - 1 (past to future) or t_max - 1 - r (future to past)."""
    t_max = (table.shape[-2] + 1) // 2

    def row(h, i, j):
        r = j - (i + q_offset)
        c = r + t_max - 1 if order == "past_to_future" else t_max - 1 - r
        return np.asarray(table_row(table, h, c), float)

    return row


def absolute_row(table):
    """A learned row per key position j."""
    return lambda h, i, j: np.asarray(table_row(table, h, j), float)


def grid2d_row(row_table, col_table, height, width):
    """Row table at x_m - x_n + h - 1 plus column table at y_m - y_n + w - 1 (row-major)."""

    def row(h, n, m):
        dx = m // width - n // width
        dy = m % width - n % width
        return np.asarray(table_row(row_table, h, dx + height - 1), float) + np.asarray(
            table_row(col_table, h, dy + width - 1), float
        )

    return row


def bias_value(table, k_max, beyond, q_offset, past=None):
    """A learned scalar b[clip(r) + K]; zero beyond the table under "zero".

    With `past` P: b[clip(r, -P, K) + P].
    """
    past = k_max if past is None else past

    def value(h, i, j):
        r = j - (i + q_offset)
        if not -past <= r <= k_max and beyond == "zero":
            return 0.0
        return float(table_row(table, h, max(-past, min(k_max, r)) + past, scalar=True))

    return value


def t5_bucket(r: int, num_buckets: int, max_distance: int, bidirectional: bool) -> int:
    """T5 / mesh-tensorflow _relative_position_bucket, one distance, r = key - query."""
    n = num_buckets
    bucket = 0
    if bidirectional:
        n //= 2
        if r > 0:
            bucket += n
        a = abs(r)
    else:
        a = max(-r, 0)
    max_exact = n // 2
    if a < max_exact:
        return bucket + a
    large = max_exact + int(math.log(a / max_exact) / math.log(max_distance / max_exact)
                            * (n - max_exact))
    return bucket + min(large, n - 1)


def alibi_slopes(n: int) -> list[float]:
    """Press et al.: geometric slopes 2^(-8 i / n), i = 1..n, for n a power of two;
    otherwise the closest smaller power of two, then every other slope of twice that."""
    def power_of_two(m):
        return [2.0 ** (-8.0 * i / m) for i in range(1, m + 1)]

    p = 1
    while p * 2 <= n:
        p *= 2
    return power_of_two(p) + power_of_two(2 * p)[0::2][: n - p]


def alibi_power_of_two_slopes(n: int) -> list[float]:
    """attention-gym and the PyTorch blog: 2^(-8 (h + 1) / n) for h = 0 .. n - 1, any n."""
    return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]


def kerple_value(r1: float, r2: float, r: int, kernel: str) -> float:
    """Chi et al. 2022: -r1 log(1 + r2 |r|) (log) or -r1 |r|^r2 (power)."""
    a = abs(r)
    if kernel == "log":
        return -r1 * math.log(1.0 + r2 * a)
    return -r1 * a**r2


def sandwich_value(h: int, heads: int, r: int, d_bar: int, start: int) -> float:
    """Chi et al. 2023: (sum_c cos(r 10000^(-2c/d_bar)) - d_bar/2) / (8 (h + 1) / heads)."""
    total = sum(math.cos(r * 10000.0 ** (-2.0 * c / d_bar))
                for c in range(start, start + d_bar // 2))
    return (total - d_bar / 2) / (8.0 * (h + 1) / heads)


def swin_row(wh: int, ww: int, n: int, m: int) -> int:
    """Swin table row for query token n and key token m (row-major), key minus query."""
    dy = m // ww - n // ww
    dx = m % ww - n % ww
    return (dy + wh - 1) * (2 * ww - 1) + (dx + ww - 1)


def swinv2_coordinate(delta: int, w: int, pretrained: int | None = None) -> float:
    """Liu et al. 2022, eq. 4: sign(u) log2(1 + |u|) / log2(8), u = 8 delta / (W - 1).

    W is the pretrained window side when given; an axis of one token divides by 1.
    """
    side = w if pretrained is None else pretrained
    u = 8.0 * delta / (side - 1 if side > 1 else 1)
    if u == 0:
        return 0.0
    return math.copysign(math.log2(1.0 + abs(u)) / math.log2(8.0), u)


def swinv2_value(w1, b1, w2, head: int, wh: int, ww: int, n: int, m: int,
                 pretrained=None) -> float:
    """Swin v2's bias for query token n, key token m: 16 sigmoid(w2 . relu(W1 c + b1)).

    c = (c(dy), c(dx)) with dy, dx key minus query; w1 (m, 2) / b1 (m,) / w2 (m,) shared,
    or with a head axis first.
    """
    def per_head(x, ndim):
        return np.asarray(x[head] if x.ndim > ndim else x, dtype=np.float64)

    a, b, c = per_head(w1, 2), per_head(b1, 1), per_head(w2, 1)
    ph, pw = (None, None) if pretrained is None else pretrained
    coords = (swinv2_coordinate(m // ww - n // ww, wh, ph),
              swinv2_coordinate(m % ww - n % ww, ww, pw))
    z = 0.0
    for unit in range(a.shape[0]):
        pre = a[unit, 0] * coords[0] + a[unit, 1] * coords[1] + b[unit]
        z += c[unit] * max(pre, 0.0)
    return 16.0 / (1.0 + math.exp(-z))


def rope_rotate(x: np.ndarray, offset: int, base: float, rotary_dim: int, layout: str):
    """Rotate pairs as complex numbers z_c e^{i p theta_c}, p = offset + row."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    half = rotary_dim // 2
    for idx in np.ndindex(x.shape[:-1]):
        p = offset + idx[-1]
        for c in range(half):
            theta = base ** (-2.0 * c / rotary_dim)
            a_i, b_i = (2 * c, 2 * c + 1) if layout == "interleaved" else (c, c + half)
            z = complex(x[(*idx, a_i)], x[(*idx, b_i)]) * complex(
                math.cos(p * theta), math.sin(p * theta)
            )
            out[(*idx, a_i)], out[(*idx, b_i)] = z.real, z.imag
    return out


#: The fields each rope_type defaults (transformers' defaults, and ours for the policies).
ROPE_FIELD_DEFAULTS = {
    "dynamic": {"policy": "per_call", "max_position_embeddings": None},
    "yarn": {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "mscale": None,
             "mscale_all_dim": None, "attention_factor": None, "softmax_mscale": False},
    "longrope": {"factor": None, "max_position_embeddings": None, "attention_factor": None,
                 "policy": "per_call"},
    "proportional": {"partial_rotary_factor": 1.0, "factor": 1.0},
}


def rope_complete(scaling: dict | None) -> dict | None:
    """`scaling` with the fields it leaves out at their defaults."""
    if scaling is None:
        return None
    return {**ROPE_FIELD_DEFAULTS.get(scaling["rope_type"], {}), **scaling}


def rope_scaled_thetas(rotary_dim: int, base: float, scaling: dict | None,
                       length: int) -> list[float]:
    """theta'_c of each rope_type, pair by pair, from the formulas of docs/schemes/rope.md.

    `scaling` holds every field (no defaults here); `length` is the call's
    largest position + 1.
    """
    kind = "default" if scaling is None else scaling["rope_type"]
    n = rotary_dim // 2
    s = {} if scaling is None else scaling
    if kind == "dynamic" and rotary_dim > 2:
        l0, factor = s["original_max_position_embeddings"], s["factor"]
        fixed = s["max_position_embeddings"] or factor * l0  # vLLM: factor times L0
        span = fixed if s["policy"] == "fixed" else length
        if span < l0:
            span = l0
        base = base * (factor * span / l0 - factor + 1) ** (rotary_dim / (rotary_dim - 2))
    out = []
    for c in range(n):
        theta = 1.0 / base ** (2.0 * c / rotary_dim)
        if kind == "linear":
            theta = theta / s["factor"]
        elif kind == "yarn":
            l0 = s["original_max_position_embeddings"]
            # the pair index at which a wavelength fits `turns` times in L0
            lo = rotary_dim * math.log(l0 / (2 * math.pi * s["beta_fast"])) / (2 * math.log(base))
            hi = rotary_dim * math.log(l0 / (2 * math.pi * s["beta_slow"])) / (2 * math.log(base))
            if s["truncate"]:
                lo, hi = math.floor(lo), math.ceil(hi)
            lo, hi = max(lo, 0), min(hi, rotary_dim - 1)
            if hi == lo:
                hi = hi + 0.001
            ramp = (c - lo) / (hi - lo)
            ramp = 0.0 if ramp < 0 else 1.0 if ramp > 1 else ramp
            theta = (1 - ramp) * theta + ramp * theta / s["factor"]
        elif kind == "longrope":
            l0 = s["original_max_position_embeddings"]
            span = length if s["policy"] == "per_call" else s["max_position_embeddings"]
            theta = theta / (s["long_factor"] if span > l0 else s["short_factor"])[c]
        elif kind == "llama3":
            l0 = s["original_max_position_embeddings"]
            wavelength = 2 * math.pi / theta
            if wavelength > l0 / s["low_freq_factor"]:
                theta = theta / s["factor"]
            elif wavelength >= l0 / s["high_freq_factor"]:
                w = (l0 / wavelength - s["low_freq_factor"]) / (
                    s["high_freq_factor"] - s["low_freq_factor"])
                theta = w * theta + (1 - w) * theta / s["factor"]
        elif kind == "proportional":
            kept = math.floor(s["partial_rotary_factor"] * rotary_dim / 2)
            theta = theta / s["factor"] if c < kept else 0.0
        out.append(theta)
    return out


def rope_float32_thetas(rotary_dim: int, base: float) -> list[float]:
    """The float32 frequencies most code forms: 1 / base ** (2c / R), each step in float32."""
    out = []
    for c in range(rotary_dim // 2):
        exponent = np.float32(np.float32(2 * c) / np.float32(rotary_dim))
        power = np.float32(float(np.float32(base)) ** float(exponent))  # correctly rounded
        out.append(float(np.float32(np.float32(1.0) / power)))
    return out


def rope_attention_factor(scaling: dict | None) -> float:
    """YaRN's 0.1 ln s + 1 (or the mscale ratio), LongRoPE's sqrt(1 + ln s / ln L0), else 1."""
    if scaling is None or scaling["rope_type"] not in ("yarn", "longrope"):
        return 1.0
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]

    def m(s, k):
        return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1.0

    if scaling["rope_type"] == "yarn":
        if scaling["mscale"] and scaling["mscale_all_dim"]:
            return m(scaling["factor"], scaling["mscale"]) / m(scaling["factor"],
                                                               scaling["mscale_all_dim"])
        return m(scaling["factor"], 1.0)
    l0 = scaling["original_max_position_embeddings"]
    s = scaling["factor"] or scaling["max_position_embeddings"] / l0
    return 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(l0))


def rope_rotate_thetas(x: np.ndarray, offset: int, thetas: list[float], layout: str,
                       factor: float = 1.0, angles: str = "float64") -> np.ndarray:
    """Pairs as complex numbers times factor e^{i phi}, phi = p theta_c (float32: rounded)."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    half = len(thetas)
    for idx in np.ndindex(x.shape[:-1]):
        p = offset + idx[-1]
        for c in range(half):
            if angles == "float32":
                phi = float(np.float32(np.float32(p) * np.float32(thetas[c])))
            else:
                phi = p * thetas[c]
            a_i, b_i = (2 * c, 2 * c + 1) if layout == "interleaved" else (c, c + half)
            z = complex(x[(*idx, a_i)], x[(*idx, b_i)]) * factor * complex(
                math.cos(phi), math.sin(phi))
            out[(*idx, a_i)], out[(*idx, b_i)] = z.real, z.imag
    return out


def xpos_rotate(x: np.ndarray, offset: int, layout: str, *, rotary_dim: int, base: float,
                scale_base: float, center: int, key: bool) -> np.ndarray:
    """xPos from the paper: pair c as a complex number times e^{i p theta_c}, times
    zeta_c^{(p - center)/gamma} (a query) or its inverse (a key),
    zeta_c = (2c/R + 0.4) / 1.4, theta_c = base^(-2c/R)."""
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    half = rotary_dim // 2
    for idx in np.ndindex(x.shape[:-1]):
        p = offset + idx[-1]
        for c in range(half):
            theta = base ** (-2 * c / rotary_dim)
            zeta = (2 * c / rotary_dim + 0.4) / 1.4
            power = (p - center) / scale_base
            s = zeta ** (-power if key else power)
            a_i, b_i = (2 * c, 2 * c + 1) if layout == "interleaved" else (c, c + half)
            z = complex(x[(*idx, a_i)], x[(*idx, b_i)]) * s * complex(
                math.cos(p * theta), math.sin(p * theta))
            out[(*idx, a_i)], out[(*idx, b_i)] = z.real, z.imag
    return out


def mrope_matrix(section: list[int], interleaved: bool, thetas: list[float]) -> np.ndarray:
    """M-RoPE's F (R/2, n): Qwen2-VL's contiguous sections, or Qwen3-VL's pair c mod n."""
    n = len(section)
    f = np.zeros((len(thetas), n))
    starts = [sum(section[:a]) for a in range(n)]
    for c, theta in enumerate(thetas):
        if interleaved:
            axis = c % n if (c % n != 0 and c < n * section[c % n]) else 0
        else:
            axis = max(a for a in range(n) if starts[a] <= c and section[a] > 0)
        f[c, axis] = theta
    return f


def axial_matrix(dims: list[int], base: float, scales: list[float]) -> np.ndarray:
    """Axial RoPE's F (R/2, n): axis a owns d_a/2 pairs of frequency scale_a base^(-2c/d_a)."""
    rows = []
    for a, d_a in enumerate(dims):
        for c in range(d_a // 2):
            row = [0.0] * len(dims)
            row[a] = scales[a] * base ** (-2.0 * c / d_a)
            rows.append(row)
    return np.asarray(rows)


def rope_rotate_axes(x: np.ndarray, positions: np.ndarray, freq: np.ndarray, layout: str,
                     offset: int = 0, rotary_at: str = "front", factor: float = 1.0):
    """Pairs as complex numbers times factor e^{i phi}, phi_c = sum_a F[c, a] p_a(token).

    `x` (..., h, t, d); `positions` (n, L): token offset + row; `freq` (R/2, n) or
    (h, R/2, n) per head; the rotated features the first R (front) or the last R (tail).
    """
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    half = freq.shape[-2]
    d = x.shape[-1]
    lo = 0 if rotary_at == "front" else d - 2 * half
    for idx in np.ndindex(x.shape[:-1]):
        token = offset + idx[-1]
        f = freq if freq.ndim == 2 else freq[idx[-2]]
        for c in range(half):
            phi = sum(f[c, a] * positions[a, token] for a in range(f.shape[1]))
            a_i, b_i = (2 * c, 2 * c + 1) if layout == "interleaved" else (c, c + half)
            a_i, b_i = a_i + lo, b_i + lo
            z = complex(x[(*idx, a_i)], x[(*idx, b_i)]) * factor * complex(
                math.cos(phi), math.sin(phi))
            out[(*idx, a_i)], out[(*idx, b_i)] = z.real, z.imag
    return out


def sinusoid(delta: int, d_model: int, base: float = 10000.0) -> np.ndarray:
    """Transformer-XL's R_delta: sin(delta w_c) for c < d_model/2, then cos(delta w_c)."""
    half = d_model // 2
    out = np.zeros(d_model)
    for c in range(half):
        w = 1.0 / base ** (2.0 * c / d_model)
        out[c] = math.sin(delta * w)
        out[half + c] = math.cos(delta * w)
    return out


def transformer_xl_position(q, k, w_r, u, v, q_offset, clamp_len, base=10000.0):
    """Dai et al. eq. (terms b, c, d): q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j}, per pair.

    Positions: query i at i + q_offset, key j at j; i - j is query minus key, clamped to
    [-clamp_len, clamp_len] when clamp_len is given. W_R is (d_model, d) or (h, d_model, d),
    u and v are (d,) or (h, d) or None.
    """
    q, k = (np.asarray(a, dtype=np.float64) for a in (q, k))
    t_q, d = q.shape[-2:]
    t_k = k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q = np.broadcast_to(q, (*batch, t_q, d))
    k = np.broadcast_to(k, (*batch, t_k, d))
    out = np.zeros((*batch, t_q, t_k))
    for b in np.ndindex(batch):
        h = b[-1] if b else 0
        w = w_r if w_r.ndim == 2 else w_r[h]
        uh = None if u is None else (u if u.ndim == 1 else u[h])
        vh = None if v is None else (v if v.ndim == 1 else v[h])
        for i in range(t_q):
            for j in range(t_k):
                delta = (i + q_offset) - j
                if clamp_len is not None:
                    delta = max(-clamp_len, min(clamp_len, delta))
                rel = sinusoid(delta, w.shape[0], base)
                p = [sum(rel[m] * w[m, c] for m in range(w.shape[0])) for c in range(d)]
                total = sum(q[(*b, i, c)] * p[c] for c in range(d))
                if uh is not None:
                    total += sum(uh[c] * k[(*b, j, c)] for c in range(d))
                if vh is not None:
                    total += sum(vh[c] * p[c] for c in range(d))
                out[(*b, i, j)] = total
    return out


def deberta_bucket(r: int, bucket_size: int, max_position: int) -> int:
    """He et al. (DeBERTa v2 code) log bucket: exact up to mid, then
    sign(r) (mid + ceil(log(|r|/mid) / log((max_position-1)/mid) (mid-1))), in 60 digits."""
    from decimal import Decimal, localcontext

    mid = bucket_size // 2
    if abs(r) <= mid:
        return r
    with localcontext() as ctx:
        ctx.prec = 60
        x = (Decimal(abs(r)) / mid).ln() / (Decimal(max_position - 1) / mid).ln() * (mid - 1)
        nearest = x.to_integral_value()
        up = int(nearest) if abs(x - nearest) < Decimal(10) ** -40 else math.ceil(x)
    b = mid + up
    return b if r > 0 else -b


def deberta_position(q, k, key_table, query_table, q_offset, max_position):
    """He et al. eq. (4) as DeBERTa's released code computes it, in its own indexing: the
    relative position matrix R[a, b] = bucket(pos_a - pos_b) of (query, key) pairs, rows
    clamp(R + S, 0, 2S - 1) of a 2S-row table for c2p = q_i . K_r[...]; p2c gathers, for key
    j, column clamp(-R[j, i] + S) of k_j Q_r^T (the paper writes delta(j, i) here; the code's
    -R[j, i] is delta(i, j)). Our canonical tables are DeBERTa's reversed, so they are
    reversed back here first."""
    q, k = (np.asarray(a, dtype=np.float64) for a in (q, k))
    t_q, d = q.shape[-2:]
    t_k = k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q = np.broadcast_to(q, (*batch, t_q, d))
    k = np.broadcast_to(k, (*batch, t_k, d))
    theirs = [None if t is None else np.flip(np.asarray(t, dtype=np.float64), axis=-2)
              for t in (key_table, query_table)]
    span = next(t.shape[-2] for t in theirs if t is not None) // 2

    def bucket(x):
        return x if max_position is None else deberta_bucket(x, span, max_position)

    def row(x):
        return max(0, min(2 * span - 1, bucket(x) + span))

    def neg_row(x):
        return max(0, min(2 * span - 1, -bucket(x) + span))

    out = np.zeros((*batch, t_q, t_k))
    for b in np.ndindex(batch):
        h = b[-1] if b else 0
        for i in range(t_q):
            for j in range(t_k):
                pos_i = i + q_offset
                total = 0.0
                if theirs[0] is not None:
                    rel = table_row(theirs[0], h, row(pos_i - j))
                    total += sum(q[(*b, i, c)] * rel[c] for c in range(d))
                if theirs[1] is not None:
                    rel = table_row(theirs[1], h, neg_row(j - pos_i))
                    total += sum(k[(*b, j, c)] * rel[c] for c in range(d))
                out[(*b, i, j)] = total
    return out


def forgetting_value(f, p_i, j):
    """FoX's bias of the query at position `p_i` and key `j`: ``sum_{t=j+1}^{p_i} log sigma(f_t)``.

    Zero where ``j > p_i`` (never attended). Each term ``-log(1 + exp(-f_t))``
    in Python floats, summed exactly (``math.fsum``).
    """
    if j > p_i:
        return 0.0
    terms = []
    for t in range(j + 1, p_i + 1):
        x = float(f[t])
        terms.append(-math.log1p(math.exp(-x)) if x > -30 else x - math.log1p(math.exp(x)))
    return math.fsum(terms)


def fire_value(w1, b1, w2, head, p_i, j, *, b2=None, c=0.1, L=512.0, eps=1e-6):
    """FIRE's bias (Li et al. 2023, eq. for ``b(i, j)``) of the query at position `p_i`, key `j`.

    ``f_theta(psi(i - j) / psi(max(L, i)))`` with ``psi(x) = log(c x + 1)``, in
    Python floats: ``c`` and ``L`` through their absolute values and the
    distance through ``|i - j|`` (the appendix's code: ``abs(c * x)``,
    ``abs(L)``), ``eps`` added to the normaliser after its log, and the MLP
    ``w2 . relu(w1 x + b1) + b2`` read per head (one MLP per head when the
    tables have a head axis: ``w1 (H, m, 1)``, ``b1 (H, m)``, ``w2 (H, m)``,
    ``b2 (H, 1)``; no ``b2``: 0).
    """

    def at(table, width):  # the head's row of a table with an optional head axis
        t = np.asarray(table, dtype=np.float64)
        if t.ndim > width:
            t = t[head] if t.shape[0] > 1 else t[0]
        return t

    w1h = at(w1, 2 if np.ndim(w1) >= 2 else 1).reshape(-1)
    b1h = at(b1, 1)
    w2h = at(w2, 1)
    b2v = np.asarray(0.0 if b2 is None else b2, dtype=np.float64).reshape(-1)
    b2h = float(b2v[head] if b2v.size > 1 else b2v[0])
    cc, ll = abs(float(c)), abs(float(L))
    x = math.log(cc * abs(p_i - j) + 1.0) / (math.log(cc * max(ll, p_i) + 1.0) + eps)
    hidden = [max(float(w1h[n]) * x + float(b1h[n]), 0.0) for n in range(len(w1h))]
    return math.fsum(float(w2h[n]) * hidden[n] for n in range(len(hidden))) + b2h


def cope_value(q_i, keys, table, allowed_row, j, scale):
    """CoPE's term of one pair (Golovneva et al. 2024, Section 3), from the paper's sentences.

    "the gate value ... g_ij = sigmoid(q_i^T k_j)" (here with the attention's
    `scale`, as the paper's code applies it before the gates), "p_ij =
    sum_{k=j}^{i} g_ik" over the keys the query may see (`allowed_row`, a
    list of booleans: the causal past, a key mask), clamped to ``p_max`` (the
    table's rows less one), and "e[p_ij] = (p_ij - floor p_ij) e[ceil p_ij] +
    (1 - p_ij + floor p_ij) e[floor p_ij]", the term being ``q_i . e[p_ij]``.
    Zero for a pair that is not allowed. Python floats, one pair at a time.
    """
    if not allowed_row[j]:
        return 0.0
    d = len(q_i)
    p = 0.0
    for t in range(j, len(keys)):
        if allowed_row[t]:
            x = scale * math.fsum(float(q_i[c]) * float(keys[t][c]) for c in range(d))
            p += 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    p = min(p, len(table) - 1)
    low, high = math.floor(p), math.ceil(p)
    w = p - low
    e = [w * float(table[high][c]) + (1.0 - w) * float(table[low][c]) for c in range(d)]
    return math.fsum(float(q_i[c]) * e[c] for c in range(d))
