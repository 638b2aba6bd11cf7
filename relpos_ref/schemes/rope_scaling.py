r"""RoPE's frequency scaling: the rules models ship with, as one option of the RoPE scheme.

Scaling changes the frequencies :math:`\theta_c` of the rotation (and, for
YaRN and LongRoPE, multiplies its cosines and sines by an attention factor);
nothing else. The option is a mapping named like the ``rope_parameters`` of
transformers 5 (``modeling_rope_utils``): ``{"rope_type": "yarn", "factor":
4.0, "original_max_position_embeddings": 4096}``, without ``rope_theta`` and
``partial_rotary_factor``, which are `relpos_ref.rope_rotate`'s ``base`` and
``rotary_dim`` (`relpos_ref.presets.rope_from_config` converts a config).
Everything here runs on the host, on Python floats, in float64.

With :math:`\theta_c = \text{base}^{-2c/R}` (``R = rotary_dim``, ``c = 0 ..
R/2 - 1``), :math:`s` the ``factor`` and :math:`L_0` the
``original_max_position_embeddings``:

==============  ===================================================================
``rope_type``   scaled frequency :math:`\theta'_c`
==============  ===================================================================
``default``     :math:`\theta_c`
``linear``      :math:`\theta_c / s`
``dynamic``     :math:`{\text{base}'}^{-2c/R}`, :math:`\text{base}' = \text{base}\,
                (s L / L_0 - (s - 1))^{R / (R - 2)}`, :math:`L = \max(L_\text{call}, L_0)`
                (``policy="per_call"``) or the deployment's length (``"fixed"``)
``yarn``        :math:`\theta_c (1 - \rho_c + \rho_c / s)`, :math:`\rho_c` a ramp from 0
                at the dimension of ``beta_fast`` turns to 1 at that of ``beta_slow``
``longrope``    :math:`\theta_c / e_c`, :math:`e` = ``long_factor`` when the length
                exceeds :math:`L_0`, else ``short_factor``
``llama3``      :math:`\theta_c` for wavelengths below :math:`L_0/h`, :math:`\theta_c/s`
                above :math:`L_0/l`, between them :math:`(1 - \sigma)\theta_c/s +
                \sigma\theta_c`, :math:`\sigma = (L_0/\lambda_c - l)/(h - l)`
``proportional``:math:`\theta_c / s` for the first :math:`\lfloor f R / 2\rfloor`
                pairs, 0 (the pair passes through) for the others
==============  ===================================================================

The attention factor :math:`a` (YaRN: :math:`0.1 \ln s + 1`, or the ratio of
two such with ``mscale`` and ``mscale_all_dim``; LongRoPE: :math:`\sqrt{1 +
\ln s / \ln L_0}`; given as ``attention_factor``, either) multiplies the
cosines and sines, so it multiplies the rotated features of ``q`` and ``k``
by :math:`a` and their part of every logit by :math:`a^2`; features beyond
``rotary_dim`` are not multiplied. DeepSeek's YaRN also multiplies the
softmax scale by :math:`(0.1\, \text{mscale\_all\_dim} \ln s + 1)^2`
(``softmax_mscale=True``), on every feature.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .._validate import as_float, check_bool, check_choice, positive_int

__all__ = [
    "POLICIES",
    "ROPE_TYPES",
    "attention_factor",
    "call_length",
    "check_scaling",
    "reads_length",
    "scaled_frequencies",
    "softmax_factor",
]

#: The frequency rules, named as transformers' ``rope_type``.
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")

#: When the length-dependent rules (``dynamic``, ``longrope``) read the length:
#: ``"per_call"`` from each call's positions (transformers), ``"fixed"`` once for the
#: deployment (vLLM).
POLICIES = ("per_call", "fixed")

_REQUIRED = object()

#: Each rule's fields and their defaults (`_REQUIRED`: no default).
_FIELDS: dict[str, dict[str, Any]] = {
    "default": {},
    "linear": {"factor": _REQUIRED},
    "dynamic": {"factor": _REQUIRED, "original_max_position_embeddings": _REQUIRED,
                "policy": "per_call", "max_position_embeddings": None},
    "yarn": {"factor": _REQUIRED, "original_max_position_embeddings": _REQUIRED,
             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "mscale": None,
             "mscale_all_dim": None, "attention_factor": None, "softmax_mscale": False},
    "longrope": {"short_factor": _REQUIRED, "long_factor": _REQUIRED,
                 "original_max_position_embeddings": _REQUIRED, "factor": None,
                 "max_position_embeddings": None, "attention_factor": None,
                 "policy": "per_call"},
    "llama3": {"factor": _REQUIRED, "low_freq_factor": _REQUIRED, "high_freq_factor": _REQUIRED,
               "original_max_position_embeddings": _REQUIRED},
    "proportional": {"partial_rotary_factor": 1.0, "factor": 1.0},
}


def _field(name: str) -> str:
    return f'`scaling["{name}"]`'


# Each check takes the name shown in messages (``scaling["factor"]``) and the value.


def _positive(name: str, value: Any) -> float:
    out = as_float(name, value)
    if not out > 0:
        msg = f"`{name}` must be > 0, got {value!r}"
        raise ValueError(msg)
    return out


def _nonnegative(name: str, value: Any) -> float:
    out = as_float(name, value)
    if out < 0:
        msg = f"`{name}` must be >= 0, got {value!r}"
        raise ValueError(msg)
    return out


def _fraction(name: str, value: Any) -> float:
    out = as_float(name, value)
    if not 0 <= out <= 1:
        msg = f"`{name}` must be in [0, 1], got {value!r}"
        raise ValueError(msg)
    return out


def _factors(name: str, value: Any) -> tuple[float, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        msg = f"`{name}` must be a list of numbers > 0, got {value!r}"
        raise ValueError(msg)
    return tuple(_positive(f"{name}[{i}]", x) for i, x in enumerate(value))


def _optional(check: Any) -> Any:
    return lambda name, value: None if value is None else check(name, value)


_CHECKS = {
    "factor": _positive, "original_max_position_embeddings": positive_int,
    "max_position_embeddings": _optional(positive_int), "beta_fast": _positive,
    "beta_slow": _positive, "truncate": check_bool, "softmax_mscale": check_bool,
    "mscale": _optional(_nonnegative), "mscale_all_dim": _optional(_nonnegative),
    "attention_factor": _optional(_positive), "short_factor": _factors,
    "long_factor": _factors, "low_freq_factor": _positive, "high_freq_factor": _positive,
    "partial_rotary_factor": _fraction,
    "policy": lambda name, value: check_choice(name, value, POLICIES),
}


def check_scaling(scaling: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate a `scaling` option and complete it with its rule's defaults.

    Parameters
    ----------
    scaling : mapping or None
        ``rope_type`` (one of `ROPE_TYPES`) and that rule's fields; ``None``
        is ``{"rope_type": "default"}``.

    Returns
    -------
    dict
        A new dict: every field of the rule, defaults filled in, lists as tuples.

    Raises
    ------
    ValueError
        Naming the field: an unknown ``rope_type`` or field, a missing one,
        a value out of range.

    Examples
    --------
    >>> check_scaling({"rope_type": "linear", "factor": 2})
    {'rope_type': 'linear', 'factor': 2.0}
    >>> check_scaling({"rope_type": "linear"})
    Traceback (most recent call last):
    ...
    ValueError: `scaling` of rope_type 'linear' needs `scaling["factor"]`
    """
    if scaling is None:
        return {"rope_type": "default"}
    if not isinstance(scaling, Mapping):
        msg = f"`scaling` must be a mapping with a 'rope_type' (or None), got {scaling!r}"
        raise ValueError(msg)
    kind = check_choice('scaling["rope_type"]', scaling.get("rope_type"), ROPE_TYPES)
    fields = _FIELDS[kind]
    extra = sorted(set(scaling) - set(fields) - {"rope_type"}, key=str)
    if extra:
        hint = ("; pass rope_theta as `base` and partial_rotary_factor as `rotary_dim` "
                "(relpos_ref.presets.rope_from_config converts a config)"
                if {"rope_theta", "partial_rotary_factor"} & set(extra) else "")
        known = ", ".join(fields) or "none"
        msg = (f"`scaling` of rope_type {kind!r} takes the fields {known}; got "
               f"{', '.join(repr(e) for e in extra)}{hint}")
        raise ValueError(msg)
    out: dict[str, Any] = {"rope_type": kind}
    for name, default in fields.items():
        if scaling.get(name) is None:  # absent or None: the default
            if default is _REQUIRED:
                msg = f"`scaling` of rope_type {kind!r} needs {_field(name)}"
                raise ValueError(msg)
            out[name] = default
            continue
        out[name] = _CHECKS[name](_field(name)[1:-1], scaling[name])
    _check_together(out)
    return out


def _check_together(s: dict[str, Any]) -> None:
    kind = s["rope_type"]
    if kind == "llama3" and not s["high_freq_factor"] > s["low_freq_factor"]:
        msg = (f"{_field('high_freq_factor')} must be > {_field('low_freq_factor')}, got "
               f"{s['high_freq_factor']} and {s['low_freq_factor']}")
        raise ValueError(msg)
    if kind == "longrope":
        if s["factor"] is None and s["max_position_embeddings"] is None:
            msg = (f"`scaling` of rope_type 'longrope' needs {_field('factor')} or "
                   f"{_field('max_position_embeddings')} (factor = max / original)")
            raise ValueError(msg)
        if s["policy"] == "fixed" and s["max_position_embeddings"] is None:
            msg = (f"{_field('policy')} 'fixed' needs {_field('max_position_embeddings')}, "
                   "the deployment's longest sequence")
            raise ValueError(msg)
    if kind == "yarn" and s["softmax_mscale"] and not s["mscale_all_dim"]:
        msg = (f"{_field('softmax_mscale')} needs {_field('mscale_all_dim')} > 0, got "
               f"{s['mscale_all_dim']!r}")
        raise ValueError(msg)


def reads_length(scaling: Mapping[str, Any]) -> bool:
    """Whether the frequencies depend on the call's length (``dynamic``, ``longrope`` per call).

    Examples
    --------
    >>> reads_length(check_scaling({"rope_type": "dynamic", "factor": 2.0,
    ...                             "original_max_position_embeddings": 16}))
    True
    """
    return scaling["rope_type"] in ("dynamic", "longrope") and scaling["policy"] == "per_call"


def call_length(t_q: int, t_k: int, q_offset: int) -> int:
    """The length a call covers: its largest position plus one, ``max(t_k, q_offset + t_q)``.

    Keys sit at ``0 .. t_k - 1`` and queries at ``q_offset .. q_offset + t_q - 1``.
    A decoding step (``t_q = 1``, ``q_offset = t_k - 1``) has the length of
    the full forward over its ``t_k`` tokens, so both read the same frequencies.

    Examples
    --------
    >>> call_length(1, 10, 9), call_length(10, 10, 0), call_length(4, 2, 0)
    (10, 10, 4)
    """
    return max(t_k, q_offset + t_q, 0)


def _mscale(s: float, k: float = 1.0) -> float:
    # YaRN's 0.1 k ln s + 1, 1 when s <= 1
    return 1.0 if s <= 1 else 0.1 * k * math.log(s) + 1.0


def _longrope_factor(s: Mapping[str, Any]) -> float:
    if s["factor"] is not None:
        return s["factor"]
    return s["max_position_embeddings"] / s["original_max_position_embeddings"]


def attention_factor(scaling: Mapping[str, Any]) -> float:
    r"""The attention factor :math:`a` that multiplies the cosines and sines (1: none).

    .. math:: a_\text{yarn} = \begin{cases} \text{attention\_factor} & \text{if given} \\
              m(s, \text{mscale}) / m(s, \text{mscale\_all\_dim}) & \text{if both are} > 0 \\
              m(s, 1) & \text{otherwise} \end{cases}, \quad m(s, k) = 0.1 k \ln s + 1
              \ (1 \text{ for } s \le 1)

    and :math:`a_\text{longrope} = \sqrt{1 + \ln s / \ln L_0}` (1 for
    :math:`s \le 1`; :math:`s` = ``factor``, or ``max_position_embeddings /
    original_max_position_embeddings``), or ``attention_factor`` if given.

    Parameters
    ----------
    scaling : mapping
        Checked (`check_scaling`).

    Examples
    --------
    >>> round(attention_factor(check_scaling({"rope_type": "yarn", "factor": 4.0,
    ...     "original_max_position_embeddings": 64})), 6)  # 0.1 ln 4 + 1
    1.138629
    """
    kind = scaling["rope_type"]
    given = scaling.get("attention_factor")
    if kind not in ("yarn", "longrope"):
        return 1.0
    if given is not None:
        return given
    if kind == "yarn":
        s, m, m_all = scaling["factor"], scaling["mscale"], scaling["mscale_all_dim"]
        if m and m_all:
            return _mscale(s, m) / _mscale(s, m_all)
        return _mscale(s)
    s, l0 = _longrope_factor(scaling), scaling["original_max_position_embeddings"]
    return 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(l0))


def softmax_factor(scaling: Mapping[str, Any]) -> float:
    r"""What the softmax scale is multiplied by: DeepSeek's :math:`m(s, \text{mscale\_all\_dim})^2`.

    1 unless ``rope_type="yarn"`` with ``softmax_mscale=True``; it applies to
    the whole logit (every feature), on top of the attention factor.

    Examples
    --------
    >>> softmax_factor(check_scaling({"rope_type": "yarn", "factor": 40.0,
    ...     "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0,
    ...     "softmax_mscale": True})) == (0.1 * __import__("math").log(40.0) + 1) ** 2
    True
    """
    if scaling["rope_type"] != "yarn" or not scaling["softmax_mscale"]:
        return 1.0
    return _mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2


def dynamic_span(s: Mapping[str, Any], length: int) -> float:
    """The length ``dynamic`` reads: the call's (``per_call``) or the deployment's, >= L0."""
    factor, l0 = s["factor"], s["original_max_position_embeddings"]
    if s["policy"] == "fixed":
        span = factor * l0 if s["max_position_embeddings"] is None else s["max_position_embeddings"]
    else:
        span = length
    return max(span, l0)  # never below the trained length: base' >= base


def _dynamic_base(base: float, rd: int, s: Mapping[str, Any], length: int) -> float:
    factor, l0 = s["factor"], s["original_max_position_embeddings"]
    span = dynamic_span(s, length)
    return base * (factor * span / l0 - (factor - 1)) ** (rd / (rd - 2))


def yarn_range(base: float, rd: int, s: Mapping[str, Any]) -> tuple[float, float]:
    """YaRN's ramp: from the pair of ``beta_fast`` turns in L0 to that of ``beta_slow``."""
    l0 = s["original_max_position_embeddings"]
    if not base > 1:
        msg = f"yarn scaling needs `base` > 1 (it divides by ln base), got {base}"
        raise ValueError(msg)

    def dimension(turns: float) -> float:  # the pair index whose wavelength is L0 / turns
        return rd * math.log(l0 / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension(s["beta_fast"]), dimension(s["beta_slow"])
    if s["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rd - 1)
    if low == high:
        high += 0.001
    return low, high


def _yarn(theta: list[float], base: float, rd: int, s: Mapping[str, Any]) -> list[float]:
    low, high = yarn_range(base, rd, s)
    ramp = [min(max((c - low) / (high - low), 0.0), 1.0) for c in range(len(theta))]
    return [t * (1 - r) + t / s["factor"] * r for t, r in zip(theta, ramp, strict=True)]


def _llama3(theta: list[float], s: Mapping[str, Any]) -> list[float]:
    factor, l0 = s["factor"], s["original_max_position_embeddings"]
    low, high = s["low_freq_factor"], s["high_freq_factor"]
    out = []
    for t in theta:
        wavelength = 2 * math.pi / t
        if wavelength < l0 / high:
            out.append(t)
        elif wavelength > l0 / low:
            out.append(t / factor)
        else:
            smooth = (l0 / wavelength - low) / (high - low)
            out.append((1 - smooth) * t / factor + smooth * t)
    return out


def longrope_factors(n: int, rd: int, s: Mapping[str, Any], length: int) -> tuple[float, ...]:
    """The LongRoPE factors a call reads: long past L0 (its length, or the deployment's)."""
    l0 = s["original_max_position_embeddings"]
    span = length if s["policy"] == "per_call" else s["max_position_embeddings"]
    for field in ("short_factor", "long_factor"):  # both, whichever this call reads
        if len(s[field]) != n:
            msg = (f"{_field(field)} must have rotary_dim / 2 = {n} entries, got "
                   f"{len(s[field])} (`rotary_dim` = {rd})")
            raise ValueError(msg)
    return s["long_factor" if span > l0 else "short_factor"]


def proportional_pairs(rd: int, s: Mapping[str, Any]) -> int:
    """How many pairs turn under ``proportional``: ``floor(partial_rotary_factor R / 2)``."""
    return int(s["partial_rotary_factor"] * rd // 2)


def scaled_frequencies(rotary_dim: int, /, *, base: float, scaling: Mapping[str, Any],
                       length: int) -> tuple[float, ...]:
    r"""The scaled frequencies :math:`\theta'_c` of the module docstring (host floats).

    Parameters
    ----------
    rotary_dim : int
        ``R``, even, ``>= 0``.
    base : float
        ``> 0``.
    scaling : mapping
        Checked (`check_scaling`).
    length : int
        The call's length (`call_length`), read by the ``per_call`` rules only.

    Returns
    -------
    tuple of float
        ``R / 2`` frequencies, computed in float64.

    Examples
    --------
    >>> scaled_frequencies(4, base=100.0, scaling=check_scaling(
    ...     {"rope_type": "linear", "factor": 2.0}), length=8)
    (0.5, 0.05)
    """
    kind = scaling["rope_type"]
    n = rotary_dim // 2
    if kind == "dynamic" and rotary_dim > 2:
        base = _dynamic_base(base, rotary_dim, scaling, length)
    theta = [base ** (-2.0 * c / rotary_dim) for c in range(n)]
    if kind == "linear":
        theta = [t / scaling["factor"] for t in theta]
    elif kind == "yarn":
        theta = _yarn(theta, base, rotary_dim, scaling)
    elif kind == "longrope":
        factors = longrope_factors(n, rotary_dim, scaling, length)
        theta = [t / e for t, e in zip(theta, factors, strict=True)]
    elif kind == "llama3":
        theta = _llama3(theta, scaling)
    elif kind == "proportional":
        rotated = proportional_pairs(rotary_dim, scaling)
        theta = [t / scaling["factor"] if c < rotated else 0.0 for c, t in enumerate(theta)]
    return tuple(theta)
