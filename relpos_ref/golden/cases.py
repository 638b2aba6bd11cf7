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
        steps = params.pop("steps", None)
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
        if steps is not None:
            from .decode import check_decode

            full["steps"] = steps
            check_decode(entry, full)
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
    def kind(self) -> str:
        """``"decode"`` for a case with ``steps`` (`relpos_ref.golden.decode`), else
        ``"forward"``: one call."""
        return "decode" if "steps" in self.parameters else "forward"

    @property
    def id(self) -> str:
        """``scheme/variant/shape/dtype/seed``; a decode case's shape has ``n<steps>``
        after the width."""
        p = self.parameters
        steps = f"-n{p['steps']}" if "steps" in p else ""
        shape = (f"b{p['b']}-h{p['h']}-q{p['t_q']}-k{p['t_k']}-d{p['d']}{steps}-"
                 f"{self.entry.label(p)}")
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
        if self.kind == "decode":
            msg = f"case {self.id} is a decode case: it has no cotangent (decoding is inference)"
            raise ValueError(msg)
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


def default_cases() -> CaseRegistry:
    """The default suite: every scheme and its edge cases, in every float dtype.

    Examples
    --------
    >>> reg = default_cases()
    >>> len(reg), len({c.scheme for c in reg}), len([c for c in reg if c.kind == "decode"])
    (400, 19, 64)
    >>> sorted({c.scheme for c in reg})[:6]
    ['absolute', 'alibi', 'bias', 'cope', 'deberta', 'fire']
    """
    from .decode import decode_base_cases
    from .default_suite import base_cases

    return CaseRegistry(
        Case.make(scheme, variant, dtype=dtype, **params)
        for scheme, variant, params in [*base_cases(), *decode_base_cases()]
        for dtype in FLOAT_DTYPES
    )
