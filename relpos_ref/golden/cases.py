"""Golden cases: a scheme, its parameters, a dtype and a seed, with a stable id.

A case id reads ``scheme/variant/shape/dtype/seed``, for example
``shaw/clip/b2-h4-q17-k33-d16-K4/float32/s0``: batch 2, 4 heads, 17 queries,
33 keys, width 16, ``K = 4``, inputs in float32, seed 0.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import catalog
from .dtypes import FLOAT_DTYPES, numpy_dtype

__all__ = [
    "COMMON_DEFAULTS",
    "SCHEMES",
    "Case",
    "CaseRegistry",
    "default_cases",
    "select_ids",
]

#: The schemes the golden suite knows: every scheme of `relpos_ref.catalog`.
SCHEMES = tuple(catalog.names())

#: Parameters every case has, with their defaults; ``None`` is the scheme's default
#: (`relpos_ref.catalog.Scheme.defaults`), resolved when the case is made.
COMMON_DEFAULTS: Mapping[str, Any] = {
    "b": 1,  # batch
    "h": 1,  # heads
    "t_q": 1,
    "t_k": 1,
    "d": 8,  # width of q, k and v
    "causal": None,
    "q_offset": None,
    "masked": False,  # a random mask with fully masked rows
    "scale": None,
    "per_head": False,  # tables (h, n, ...) instead of shared (n, ...)
}

_VARIANT = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def scheme_defaults(entry: catalog.Scheme) -> dict[str, Any]:
    """A scheme's own case parameters and their defaults, from the catalog.

    Its sizes (by `Size.key`), its options that cases record (unless named
    like a size), and a switch per optional table.

    Examples
    --------
    >>> scheme_defaults(catalog.get("shaw"))
    {'K': 4, 'P': None, 'beyond': 'clip', 'values': True}
    """
    out: dict[str, Any] = {s.key: s.default for s in entry.sizes}
    size_names = {s.name for s in entry.sizes}
    defaults = entry.option_defaults()
    for option in entry.options:
        if option.case_parameter and option.name not in size_names:
            out[option.name] = defaults[option.name]
    for table in entry.tables:
        if table.switch is not None:
            out[table.switch] = table.switch_default
    return out


def _minimums(entry: catalog.Scheme) -> dict[str, int]:
    # the integer parameters and their smallest values: 1, or a size's own minimum
    out = dict.fromkeys(("b", "h", "t_q", "t_k", "d"), 1)
    out.update({s.key: s.minimum for s in entry.sizes})
    out.update({o.name: 1 for o in entry.options if o.positive})
    return out


@dataclass(frozen=True)
class Case:
    """One golden case. Build it with `Case.make`, which validates and fills defaults.

    Attributes
    ----------
    scheme : str
        A scheme of `relpos_ref.catalog` (`SCHEMES`).
    variant : str
        Lower-case words joined by ``-`` naming what the case exercises.
    params : tuple of (name, value)
        Every parameter, defaults included, sorted by name.
    dtype : str
        The dtype under test: the inputs are stored in it.
    seed : int
        Seed of NumPy's PCG64 generator for the inputs.
    """

    scheme: str
    variant: str
    params: tuple[tuple[str, Any], ...]
    dtype: str
    seed: int

    @classmethod
    def make(
        cls, scheme: str, variant: str, *, dtype: str = "float32", seed: int = 0, **params: Any
    ) -> Case:
        """Validate and complete a case.

        Examples
        --------
        >>> Case.make("shaw", "clip", b=2, h=4, t_q=17, t_k=33, d=16, K=4).id
        'shaw/clip/b2-h4-q17-k33-d16-K4/float32/s0'
        """
        if scheme not in SCHEMES:
            msg = f"unknown scheme {scheme!r}; known schemes: {', '.join(sorted(SCHEMES))}"
            raise ValueError(msg)
        entry = catalog.get(scheme)
        if not isinstance(variant, str) or not _VARIANT.match(variant):
            msg = f"`variant` must be lower-case words joined by '-', got {variant!r}"
            raise ValueError(msg)
        if dtype not in FLOAT_DTYPES:
            msg = f"`dtype` must be one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}"
            raise ValueError(msg)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            msg = f"`seed` must be an integer >= 0, got {seed!r}"
            raise ValueError(msg)
        full = {**COMMON_DEFAULTS, **scheme_defaults(entry)}
        unknown = sorted(set(params) - set(full))
        if unknown:
            msg = (
                f"unknown parameter(s) {', '.join(unknown)} for scheme {scheme!r}; "
                f"known: {', '.join(sorted(full))}"
            )
            raise ValueError(msg)
        full.update(params)
        for name, value in full.items():
            default = {**COMMON_DEFAULTS, **scheme_defaults(entry)}.get(name)
            if isinstance(default, bool) and not isinstance(value, bool):
                msg = f"`{name}` must be True or False, got {value!r}"
                raise ValueError(msg)
        for name, minimum in _minimums(entry).items():
            value = full.get(name)
            if name in full and value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < minimum
            ):
                msg = f"`{name}` must be an integer >= {minimum}, got {value!r}"
                raise ValueError(msg)
        _resolve_defaults(entry, full)
        return cls(scheme, variant, tuple(sorted(full.items())), dtype, seed)

    @property
    def parameters(self) -> dict[str, Any]:
        """The parameters as a dict."""
        return dict(self.params)

    @property
    def entry(self) -> catalog.Scheme:
        """The scheme's entry in `relpos_ref.catalog`."""
        return catalog.get(self.scheme)

    @property
    def id(self) -> str:
        """``scheme/variant/shape/dtype/seed``."""
        p = self.parameters
        shape = f"b{p['b']}-h{p['h']}-q{p['t_q']}-k{p['t_k']}-d{p['d']}-{self.entry.label(p)}"
        return f"{self.scheme}/{self.variant}/{shape}/{self.dtype}/s{self.seed}"

    @property
    def file_stem(self) -> str:
        """File name of the case without suffix: the id with ``/`` as ``__``."""
        return self.id.replace("/", "__")

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of the float inputs, in the order they are drawn."""
        p = self.parameters
        lead = (p["b"], p["h"])
        return {
            "q": (*lead, p["t_q"], p["d"]),
            "k": (*lead, p["t_k"], p["d"]),
            "v": (*lead, p["t_k"], p["d"]),
            **_table_shapes(self.entry, p),
        }

    def inputs(self) -> dict[str, np.ndarray]:
        """The case's inputs, bit-exact in its dtype (the mask, if any, is bool).

        Float inputs are standard normal float64 draws from
        ``numpy.random.Generator(PCG64(seed))`` in the order of
        `input_shapes`, rounded to the dtype under test. With
        ``masked=True`` a ``(t_q, t_k)`` mask follows: each entry ``True``
        with probability 3/4 (a uniform draw below 0.75), then query row 0,
        and row ``t_q // 2`` when ``t_q > 2``, set all ``False``.
        """
        return self._draw()[1]

    def output_shape(self) -> tuple[int, ...]:
        """Shape of the attention output, ``(b, h, t_q, d)``."""
        p = self.parameters
        return (p["b"], p["h"], p["t_q"], p["d"])

    def d_output(self) -> np.ndarray:
        """The output's cotangent of the gradient goldens, bit-exact in the case's dtype.

        Standard normal float64 draws of shape `output_shape` from the same
        generator, after the inputs and the mask (so `inputs` does not
        depend on it), rounded to the dtype under test.

        Examples
        --------
        >>> Case.make("bias", "clip", h=2, t_q=3, t_k=4, K=1).d_output().shape
        (1, 2, 3, 8)
        """
        rng, _ = self._draw()
        return rng.standard_normal(self.output_shape()).astype(numpy_dtype(self.dtype))

    def _draw(self) -> tuple[np.random.Generator, dict[str, np.ndarray]]:
        rng = np.random.Generator(np.random.PCG64(self.seed))
        dtype = numpy_dtype(self.dtype)
        out = {
            name: rng.standard_normal(shape).astype(dtype)
            for name, shape in self.input_shapes().items()
        }
        p = self.parameters
        if p["masked"]:
            mask = rng.random((p["t_q"], p["t_k"])) < 0.75
            mask[0] = False
            if p["t_q"] > 2:
                mask[p["t_q"] // 2] = False
            out["mask"] = mask
        return rng, out


def _table_shapes(entry: catalog.Scheme, p: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    sizes = {**entry.sizes_from(p), "d": p["d"]}
    return entry.table_shapes(
        sizes, d=p["d"], d_v=p["d"], heads=p["h"] if p["per_head"] else None, include=p
    )


def _resolve_defaults(entry: catalog.Scheme, p: dict[str, Any]) -> None:
    # A grid's lengths from its sizes; then None -> the scheme's causal, q_offset, scale.
    if entry.grid is not None:
        p["t_q"] = p["t_k"] = entry.grid(entry.sizes_from(p))
    defaults = entry.defaults
    p["causal"] = defaults.resolve_causal(p["causal"])
    p["q_offset"] = defaults.resolve_q_offset(p["q_offset"], p["t_q"], p["t_k"])
    if p["scale"] is None:
        present = dict.fromkeys(_table_shapes(entry, p), True)
        p["scale"] = entry.scale(p["d"], present)


def select_ids(
    ids: Sequence[str], patterns: Sequence[str], *, hint: str, option: str = "--select"
) -> set[str]:
    """The ids matching any glob in `patterns`; a glob that matches none is an error.

    The error names `option`, the flag the user typed the glob after.

    Examples
    --------
    >>> sorted(select_ids(["a/x", "b/x"], ["a/*"], hint=""))
    ['a/x']
    """
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(i, pattern) for i in ids):
            msg = f"{option} {pattern!r} matches no case; {hint}"
            raise ValueError(msg)
    return {i for i in ids if any(fnmatch.fnmatchcase(i, p) for p in patterns)}


class CaseRegistry:
    """An ordered set of cases with unique ids.

    Examples
    --------
    >>> reg = CaseRegistry([Case.make("bias", "clip", t_q=3, t_k=3, K=1)])
    >>> reg.add(Case.make("bias", "clip", t_q=3, t_k=3, K=1))
    Traceback (most recent call last):
    ...
    ValueError: duplicate case id 'bias/clip/b1-h1-q3-k3-d8-K1/float32/s0'
    """

    def __init__(self, cases: Iterable[Case] = ()) -> None:
        self._cases: dict[str, Case] = {}
        for case in cases:
            self.add(case)

    def add(self, case: Case) -> None:
        """Register `case`; a second case with the same id is refused."""
        if case.id in self._cases:
            msg = f"duplicate case id {case.id!r}"
            raise ValueError(msg)
        self._cases[case.id] = case

    def __iter__(self) -> Iterator[Case]:
        return iter(self._cases.values())

    def __len__(self) -> int:
        return len(self._cases)

    def __getitem__(self, case_id: str) -> Case:
        return self._cases[case_id]

    def select(
        self, patterns: Sequence[str] | None = None, *, dtypes: Sequence[str] | None = None
    ) -> list[Case]:
        """Cases whose id matches any glob in `patterns` and whose dtype is in `dtypes`.

        Raises
        ------
        ValueError
            If a pattern or a dtype selects nothing.
        """
        cases = list(self)
        if dtypes:
            for dt in dtypes:
                if dt not in FLOAT_DTYPES:
                    msg = f"`dtypes` entries must be among {', '.join(FLOAT_DTYPES)}, got {dt!r}"
                    raise ValueError(msg)
            cases = [c for c in cases if c.dtype in dtypes]
        if patterns:
            keep = select_ids([c.id for c in cases], patterns,
                              hint="`relpos-ref list` shows the case ids")
            cases = [c for c in cases if c.id in keep]
        if not cases:
            msg = "the selection contains no case"
            raise ValueError(msg)
        return cases


def _base_cases() -> list[tuple[str, str, Mapping[str, Any]]]:
    """(scheme, variant, parameters) of the default suite, one dtype each."""
    return [
        # absolute: a key-position row per key
        ("absolute", "plain", {"b": 2, "h": 3, "t_q": 9, "t_k": 9, "d": 16}),
        ("absolute", "cross-causal", {"h": 2, "t_q": 5, "t_k": 12, "d": 8, "rows": 16,
                                      "causal": True, "q_offset": 7, "per_head": True}),
        # shaw: clipped two-sided tables, keys and values
        ("shaw", "clip", {"b": 2, "h": 4, "t_q": 17, "t_k": 33, "d": 16, "K": 4}),
        ("shaw", "zero", {"b": 2, "h": 4, "t_q": 17, "t_k": 33, "d": 16, "K": 4,
                          "beyond": "zero"}),
        ("shaw", "error-edge", {"h": 2, "t_q": 9, "t_k": 9, "d": 8, "K": 8, "beyond": "error"}),
        ("shaw", "per-head-causal-end", {"h": 3, "t_q": 5, "t_k": 12, "d": 8, "K": 3,
                                         "per_head": True, "causal": True, "q_offset": 7}),
        ("shaw", "masked", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "K": 2, "masked": True}),
        ("shaw", "length-1", {"t_q": 1, "t_k": 1, "d": 4, "K": 2}),
        ("shaw", "keys-only", {"h": 2, "t_q": 6, "t_k": 6, "d": 8, "K": 2, "values": False}),
        # asymmetric clipping (wav2vec2-BERT's relative_key): rows r = -P .. K
        ("shaw", "asymmetric", {"h": 2, "t_q": 12, "t_k": 12, "d": 8, "K": 2, "P": 5}),
        # bias: learned scalar per distance, added after scaling
        ("bias", "clip", {"h": 3, "t_q": 7, "t_k": 11, "d": 8, "K": 3, "per_head": True}),
        ("bias", "zero-causal", {"h": 3, "t_q": 11, "t_k": 11, "d": 8, "K": 3, "beyond": "zero",
                                 "causal": True, "per_head": True}),
        ("bias", "decode-step", {"h": 2, "t_q": 1, "t_k": 16, "d": 8, "K": 4, "causal": True,
                                 "q_offset": 15, "scale": 1.0}),
        # ... and at the default scale 1/sqrt(d): a kernel that scales its bias fails here
        ("bias", "decode-step-scaled", {"h": 2, "t_q": 1, "t_k": 16, "d": 8, "K": 4,
                                        "causal": True, "q_offset": 15}),
        ("bias", "asymmetric-zero", {"h": 2, "t_q": 7, "t_k": 10, "d": 8, "K": 3, "P": 1,
                                     "beyond": "zero", "per_head": True}),
        # music: one-sided causal table through the skew
        ("music", "skew", {"h": 2, "t_q": 16, "t_k": 16, "d": 8, "M": 16, "values": True}),
        ("music", "clip-end-aligned", {"h": 3, "t_q": 5, "t_k": 20, "d": 8, "M": 8,
                                       "q_offset": 15, "per_head": True}),
        ("music", "zero", {"h": 2, "t_q": 12, "t_k": 12, "d": 8, "M": 6, "beyond": "zero",
                           "masked": True}),
        ("music", "start-aligned", {"t_q": 6, "t_k": 10, "d": 8, "M": 10}),
        # general: any t_q, t_k through stacked diagonals
        ("general", "full", {"h": 2, "t_q": 12, "t_k": 12, "d": 8, "t_max": 12}),
        ("general", "cross-future-to-past", {"h": 3, "t_q": 7, "t_k": 13, "d": 8, "t_max": 13,
                                             "q_offset": 3, "order": "future_to_past",
                                             "per_head": True}),
        ("general", "causal-end", {"h": 2, "t_q": 4, "t_k": 10, "d": 8, "t_max": 10,
                                   "q_offset": 6, "causal": True}),
        # grid2d: row and column tables on a row-major grid
        ("grid2d", "non-square", {"b": 2, "h": 2, "d": 8, "height": 3, "width": 5}),
        ("grid2d", "per-head-masked", {"h": 3, "d": 8, "height": 4, "width": 4,
                                       "per_head": True, "masked": True}),
        ("grid2d", "one-token", {"d": 4, "height": 1, "width": 1}),
        # t5: bucketed scalar bias, unscaled
        ("t5", "bidirectional", {"h": 3, "t_q": 20, "t_k": 40, "d": 8, "buckets": 32,
                                 "max_distance": 16, "per_head": True}),
        ("t5", "causal-decode", {"h": 2, "t_q": 4, "t_k": 64, "d": 8, "buckets": 32,
                                 "max_distance": 32, "bidirectional": False, "causal": True,
                                 "q_offset": 60, "per_head": True}),
        # T5 with a scale (a port that scales q k^T): the bias must stay unscaled
        ("t5", "causal-decode-scaled", {"h": 2, "t_q": 4, "t_k": 64, "d": 8, "buckets": 32,
                                        "max_distance": 32, "bidirectional": False,
                                        "causal": True, "q_offset": 60, "per_head": True,
                                        "scale": 0.5}),
        # alibi: linear biases, slopes for head counts that are not powers of two
        ("alibi", "symmetric", {"h": 6, "t_q": 9, "t_k": 13, "d": 8}),
        ("alibi", "causal-end", {"h": 5, "t_q": 4, "t_k": 12, "d": 8, "causal": True,
                                 "q_offset": 8, "symmetric": False}),
        # the slope rules disagree for every head count that is not a power of two: the
        # paper's (5 and 6 heads above) and attention-gym's 2^(-8 (h + 1) / h)
        *(("alibi", f"paper-h{h}", {"h": h, "t_q": 3, "t_k": 5, "d": 4, "causal": True,
                                     "q_offset": 2})
          for h in (3, 12, 20)),
        *(("alibi", f"power-of-two-h{h}", {"h": h, "t_q": 3, "t_k": 5, "d": 4, "causal": True,
                                            "q_offset": 2, "slope_rule": "power_of_two"})
          for h in (3, 5, 6, 12, 20)),
        # kerple: NeMo's initialization (r1 the ALiBi slopes, r2 = 1), both kernels
        ("kerple", "log-causal-end", {"h": 3, "t_q": 4, "t_k": 9, "d": 8, "causal": True,
                                      "q_offset": 5}),
        ("kerple", "power-masked", {"h": 3, "t_q": 7, "t_k": 7, "d": 8, "kernel": "power",
                                    "masked": True}),
        # sandwich: the paper's 128-wide sinusoids, and NeMo's first frequency
        ("sandwich", "causal-end", {"h": 4, "t_q": 4, "t_k": 9, "d": 8, "causal": True,
                                    "q_offset": 5}),
        ("sandwich", "nemo-d16", {"h": 3, "t_q": 5, "t_k": 7, "d": 8, "d_bar": 16, "start": 1,
                                  "q_offset": 1}),
        # swin: 2D bias table of a window, non-square
        ("swin", "non-square", {"b": 2, "h": 3, "d": 8, "height": 2, "width": 3,
                                "per_head": True}),
        ("swin", "masked", {"h": 2, "d": 8, "height": 3, "width": 3, "per_head": True,
                            "masked": True}),
        # rope: both pairings, partial rotation, an offset
        ("rope", "half-partial-end", {"h": 2, "t_q": 5, "t_k": 11, "d": 16, "rotary_dim": 8,
                                      "q_offset": 6, "causal": True}),
        ("rope", "interleaved", {"h": 2, "t_q": 9, "t_k": 9, "d": 8, "layout": "interleaved",
                                 "base": 100.0}),
        # rope frequency scaling, one case per rope_type (transformers 5's names and fields)
        ("rope", "linear", {"h": 2, "t_q": 6, "t_k": 10, "d": 8, "q_offset": 4, "causal": True,
                            "scaling": {"rope_type": "linear", "factor": 4.0}}),
        # dynamic NTK past its trained length 16: per call (transformers), a decode step of
        # 24 keys, and fixed for the deployment (vLLM: the length factor * 16)
        ("rope", "dynamic-decode", {"h": 2, "t_q": 1, "t_k": 24, "d": 8, "q_offset": 23,
                                    "causal": True, "base": 1000.0,
                                    "scaling": {"rope_type": "dynamic", "factor": 2.0,
                                                "original_max_position_embeddings": 16}}),
        ("rope", "dynamic-fixed", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "base": 1000.0,
                                   "scaling": {"rope_type": "dynamic", "factor": 2.0,
                                               "original_max_position_embeddings": 16,
                                               "policy": "fixed"}}),
        ("rope", "yarn", {"h": 2, "t_q": 5, "t_k": 12, "d": 16, "q_offset": 7, "causal": True,
                          "base": 100.0,
                          "scaling": {"rope_type": "yarn", "factor": 8.0,
                                      "original_max_position_embeddings": 64}}),
        # DeepSeek-V3: the mscale ratio on cos/sin, mscale**2 on the softmax scale, the
        # interleaved pairs, a rotated part narrower than the head
        ("rope", "yarn-deepseek", {"h": 2, "t_q": 6, "t_k": 6, "d": 16, "rotary_dim": 8,
                                   "layout": "interleaved", "base": 100.0, "causal": True,
                                   "scaling": {"rope_type": "yarn", "factor": 40.0,
                                               "original_max_position_embeddings": 64,
                                               "mscale": 0.707, "mscale_all_dim": 1.0,
                                               "softmax_mscale": True}}),
        # LongRoPE: a call of 12 positions reads the long factors (trained 8), one of 8 the
        # short ones; fixed for a deployment of 32 positions: the long ones at any length
        ("rope", "longrope-long", {"h": 2, "t_q": 4, "t_k": 12, "d": 8, "q_offset": 8,
                                   "causal": True, "base": 100.0,
                                   "scaling": {"rope_type": "longrope",
                                               "short_factor": [1.0, 1.2, 1.5, 2.0],
                                               "long_factor": [1.0, 3.0, 8.0, 16.0],
                                               "original_max_position_embeddings": 8,
                                               "max_position_embeddings": 32}}),
        ("rope", "longrope-short", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "base": 100.0,
                                    "scaling": {"rope_type": "longrope",
                                                "short_factor": [1.0, 1.2, 1.5, 2.0],
                                                "long_factor": [1.0, 3.0, 8.0, 16.0],
                                                "original_max_position_embeddings": 8,
                                                "max_position_embeddings": 32}}),
        ("rope", "longrope-fixed", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "base": 100.0,
                                    "scaling": {"rope_type": "longrope",
                                                "short_factor": [1.0, 1.2, 1.5, 2.0],
                                                "long_factor": [1.0, 3.0, 8.0, 16.0],
                                                "original_max_position_embeddings": 8,
                                                "max_position_embeddings": 32,
                                                "policy": "fixed"}}),
        ("rope", "llama3", {"h": 2, "t_q": 5, "t_k": 12, "d": 16, "q_offset": 7,
                            "causal": True, "base": 100.0,
                            "scaling": {"rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 64}}),
        # Gemma 4: the full head's exponent, a quarter of the pairs turning
        ("rope", "proportional", {"h": 2, "t_q": 6, "t_k": 6, "d": 16, "causal": True,
                                  "scaling": {"rope_type": "proportional",
                                              "partial_rotary_factor": 0.25}}),
        # exact angles against float32 ones: past 65536 and near 2**20, each in both modes
        *(("rope", variant, {"h": 2, "t_q": 4, "t_k": 8, "d": 16, "q_offset": offset,
                             "angles": angles})
          for variant, offset in (("past-65536", 131068), ("near-1m", 2**20 - 4))
          for angles in ("float64", "float32")),
        # multi-axis positions: M-RoPE's contiguous (Qwen2-VL) and interleaved (Qwen3-VL)
        # sections over 2 text tokens, a 2 x 2 image at time 2 and 2 more text tokens (the
        # interleaved one a decode step); axial RoPE of a 3 x 3 grid (Qwen2-VL's vision
        # tower), of EVA-02's interpolated grid and of FLUX's three axes; RoPE-Mixed's
        # learned per-head frequencies; 1-D positions of two packed sequences
        ("rope", "mrope", {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "causal": True, "base": 100.0,
                           "axes": {"axes_type": "mrope", "mrope_section": [2, 1, 1]},
                           "positions": _MROPE_POSITIONS}),
        ("rope", "mrope-interleaved-decode", {
            "h": 2, "t_q": 1, "t_k": 8, "d": 8, "q_offset": 7, "causal": True, "base": 100.0,
            "axes": {"axes_type": "mrope", "mrope_section": [2, 1, 1],
                     "mrope_interleaved": True},
            "positions": _MROPE_POSITIONS}),
        ("rope", "axial-2d", {"h": 2, "t_q": 9, "t_k": 9, "d": 16, "base": 100.0,
                              "axes": {"axes_type": "axial", "axes_dims": [8, 8]},
                              "positions": _GRID_3X3}),
        ("rope", "axial-eva", {"h": 2, "t_q": 9, "t_k": 9, "d": 8, "layout": "interleaved",
                               "axes": {"axes_type": "axial", "axes_dims": [4, 4],
                                        "position_scale": 0.75},
                               "positions": _GRID_3X3}),
        ("rope", "axial-3d", {"h": 2, "t_q": 6, "t_k": 6, "d": 16, "layout": "interleaved",
                              "axes": {"axes_type": "axial", "axes_dims": [4, 6, 6]},
                              "positions": [[0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1],
                                            [0, 1, 0, 0, 1, 0]]}),
        ("rope", "mixed", {"h": 2, "t_q": 9, "t_k": 9, "d": 8, "layout": "interleaved",
                           "axes": {"axes_type": "mixed", "frequencies": [
                               [[1.0, 0.0], [0.0, 1.0], [0.1, 0.05], [-0.05, 0.1]],
                               [[0.6, 0.8], [-0.8, 0.6], [0.02, -0.1], [0.1, 0.02]]]},
                           "positions": _GRID_3X3}),
        ("rope", "positions-1d-packed", {"h": 2, "t_q": 7, "t_k": 7, "d": 8, "causal": True,
                                         "base": 100.0,
                                         "positions": [[0, 1, 2, 0, 1, 2, 3]]}),
        # DeepSeek MLA: the rotated part at the tail of the head, interleaved pairs
        ("rope", "tail", {"h": 2, "t_q": 5, "t_k": 8, "d": 16, "rotary_dim": 8,
                          "rotary_at": "tail", "layout": "interleaved", "q_offset": 3,
                          "causal": True, "base": 100.0}),
        # transformer_xl: a memory before the segment, causal, through rel_shift
        ("transformer_xl", "memory", {"h": 2, "t_q": 6, "t_k": 16, "d": 8, "q_offset": 10,
                                      "per_head": True}),
        ("transformer_xl", "clamped", {"h": 3, "t_q": 8, "t_k": 12, "d": 8, "q_offset": 4,
                                       "clamp_len": 3, "masked": True}),
        ("transformer_xl", "bidirectional", {"h": 2, "t_q": 5, "t_k": 9, "d": 8, "q_offset": 4,
                                             "causal": False, "d_model": 6, "biases": False}),
        # deberta: c2p and p2c, log buckets, t_q != t_k
        ("deberta", "log-buckets", {"h": 2, "t_q": 24, "t_k": 24, "d": 8, "span": 8,
                                    "max_position": 16, "per_head": True}),
        ("deberta", "cross-offset", {"h": 3, "t_q": 5, "t_k": 11, "d": 8, "span": 4,
                                     "q_offset": 3, "masked": True}),
        ("deberta", "c2p-only", {"h": 2, "t_q": 7, "t_k": 7, "d": 8, "span": 3, "p2c": False,
                                 "causal": True}),
    ]


#: Qwen2-VL-like positions (time, height, width) of 8 tokens: text, a 2 x 2 image, text.
_MROPE_POSITIONS = [[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5]]
#: (row, column) of a 3 x 3 grid of patches, row-major.
_GRID_3X3 = [[0, 0, 0, 1, 1, 1, 2, 2, 2], [0, 1, 2, 0, 1, 2, 0, 1, 2]]


def default_cases() -> CaseRegistry:
    """The default suite: every scheme and its edge cases, in every float dtype.

    Examples
    --------
    >>> reg = default_cases()
    >>> len(reg), len({c.scheme for c in reg})
    (296, 14)
    >>> sorted({c.scheme for c in reg})[:6]
    ['absolute', 'alibi', 'bias', 'deberta', 'general', 'grid2d']
    """
    return CaseRegistry(
        Case.make(scheme, variant, dtype=dtype, **params)
        for scheme, variant, params in _base_cases()
        for dtype in FLOAT_DTYPES
    )
