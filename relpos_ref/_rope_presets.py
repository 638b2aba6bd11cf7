"""RoPE from a transformers config: `rope_from_config`, re-exported by `relpos_ref.presets`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._validate import as_float, check_bool, check_choice, positive_int
from .schemes.rope_axes import check_axes
from .schemes.rope_scaling import POLICIES, check_scaling

__all__ = ["rope_from_config"]

#: The fields of transformers' ``rope_parameters`` each rope_type reads (besides
#: ``rope_type``, ``rope_theta`` and ``partial_rotary_factor``).
_READS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
             "mscale", "mscale_all_dim", "attention_factor"),
    "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings",
                 "attention_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "proportional": ("factor",),
}


def _need(value: Any, name: str, kind: str) -> Any:
    if value is None:
        msg = f"rope_type {kind!r} needs `{name}`, got None"
        raise ValueError(msg)
    return value


def rope_from_config(
    rope_parameters: Mapping[str, Any] | None,
    /,
    *,
    head_dim: int,
    partial_rotary_factor: float | None = None,
    max_position_embeddings: int | None = None,
    rope_theta: float | None = None,
    policy: str = "per_call",
    layout: str = "half",
    softmax_mscale: bool = False,
) -> dict[str, Any]:
    r"""The keyword arguments of `relpos_ref.rope_rotate` and ``rope_attention`` for a config.

    Reads a ``rope_parameters`` dict of transformers 5 (or a 4.x ``rope_scaling``
    dict, with ``type`` for ``rope_type``) as ``modeling_rope_utils`` does:

    - ``base`` is ``rope_theta`` (from the dict, else the argument, else 10000);
    - ``rotary_dim`` is ``int(head_dim * partial_rotary_factor)`` (from the
      dict, else the argument, else 1), except for ``proportional``, which
      pairs the whole head and passes ``partial_rotary_factor`` on in
      ``scaling``;
    - ``scaling`` holds the rule's fields. ``dynamic`` reads the config's
      ``max_position_embeddings`` as its trained length (transformers
      does); ``yarn``, ``longrope`` and ``llama3`` take
      ``original_max_position_embeddings`` from the dict, else
      `max_position_embeddings`; a missing ``factor`` of ``yarn`` or
      ``longrope`` is ``max_position_embeddings / original``.

    Parameters
    ----------
    rope_parameters : mapping or None
        ``config.rope_parameters`` (``None`` or ``{}``: plain RoPE).
    head_dim : int
        The config's head dimension (``head_dim``, or ``hidden_size //
        num_attention_heads``; DeepSeek's ``qk_rope_head_dim`` for its rotated part).
    partial_rotary_factor : float, optional
        Where the config keeps it outside ``rope_parameters``.
    max_position_embeddings : int, optional
        The config's; needed by ``dynamic``, and where the dict lacks a field
        that defaults to it.
    rope_theta : float, optional
        Where the config keeps it outside ``rope_parameters``.
    policy : {"per_call", "fixed"}, optional
        For ``dynamic`` and ``longrope``: the length from each call
        (transformers) or fixed for the deployment (vLLM: ``dynamic`` at
        ``factor * max_position_embeddings``, ``longrope`` at
        `max_position_embeddings`, the deployment's longest sequence).
    layout : {"half", "interleaved"}, optional
        ``"half"`` for ``rotate_half`` (most models), ``"interleaved"`` for
        GPT-J-style pairs (DeepSeek with ``rope_interleave``).
    softmax_mscale : bool, optional
        DeepSeek-V2/V3: also multiply the softmax scale by
        :math:`(0.1\, \text{mscale\_all\_dim} \ln s + 1)^2` (their attention
        does, when ``mscale_all_dim`` is set; without it, nothing).

    Returns
    -------
    dict
        ``base``, ``rotary_dim``, ``layout`` and ``scaling``; with an
        ``mrope_section`` (Qwen2-VL; ``mrope_interleaved``, Qwen3-VL) also
        ``axes``, M-RoPE's sections, and the call then takes ``positions``
        ``(3, ..., L)`` (time, height, width).

    Examples
    --------
    >>> kw = rope_from_config({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
    ...     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    ...     "original_max_position_embeddings": 8192}, head_dim=128)
    >>> kw["base"], kw["rotary_dim"], kw["scaling"]["rope_type"]
    (500000.0, 128, 'llama3')
    >>> rope_from_config({"rope_type": "default", "mrope_section": [16, 24, 24],
    ...                   "mrope_interleaved": True}, head_dim=128)["axes"]
    {'axes_type': 'mrope', 'mrope_section': (16, 24, 24), 'mrope_interleaved': True}
    >>> rope_from_config({"type": "linear", "factor": 2.0}, head_dim=64,
    ...                  partial_rotary_factor=0.5)["scaling"]
    {'rope_type': 'linear', 'factor': 2.0}
    """
    head_dim = positive_int("head_dim", head_dim)
    check_choice("policy", policy, POLICIES)
    softmax_mscale = check_bool("softmax_mscale", softmax_mscale)
    if max_position_embeddings is not None:
        max_position_embeddings = positive_int("max_position_embeddings",
                                               max_position_embeddings)
    given = dict(rope_parameters or {})
    kind = given.pop("rope_type", None) or given.pop("type", None) or "default"
    given.pop("type", None)
    if kind == "mrope":  # transformers 4.x's Qwen2-VL: "mrope" meant default frequencies
        kind = "default"
    axes = _mrope_axes(given)
    if kind not in _READS:
        listed = ", ".join(repr(k) for k in _READS)
        msg = f"`rope_parameters['rope_type']` must be one of {listed}, got {kind!r}"
        raise ValueError(msg)
    theta = given.pop("rope_theta", None)
    base = as_float("rope_theta", theta if theta is not None else rope_theta
                    if rope_theta is not None else 10000.0)
    if base <= 0:
        msg = f"`rope_theta` must be > 0, got {base!r}"
        raise ValueError(msg)
    fraction = given.pop("partial_rotary_factor", None)
    fraction = as_float("partial_rotary_factor", fraction if fraction is not None
                        else partial_rotary_factor if partial_rotary_factor is not None else 1.0)
    if not 0 < fraction <= 1:
        msg = f"`partial_rotary_factor` must be in (0, 1], got {fraction!r}"
        raise ValueError(msg)
    unknown = sorted(set(given) - set(_READS[kind]))
    if unknown:
        msg = (f"`rope_parameters` of rope_type {kind!r} has field(s) {', '.join(unknown)} "
               f"that it does not read; its fields: {', '.join(_READS[kind]) or 'none'}")
        raise ValueError(msg)
    rotary_dim = head_dim if kind == "proportional" else int(head_dim * fraction)
    if rotary_dim % 2:
        msg = (f"the rotated width int(head_dim * partial_rotary_factor) = int({head_dim} * "
               f"{fraction!r}) = {rotary_dim} must be even (its features turn in pairs)")
        raise ValueError(msg)
    scaling = _scaling(kind, given, fraction, max_position_embeddings, policy, softmax_mscale)
    check_scaling(scaling)
    out = {"base": base, "rotary_dim": rotary_dim, "layout": layout, "scaling": scaling}
    if axes is not None:
        pairs = sum(axes["mrope_section"])
        if pairs != rotary_dim // 2:
            msg = (f"`rope_parameters['mrope_section']` must share out the {rotary_dim // 2} "
                   f"pairs of a rotary dimension of {rotary_dim}, got "
                   f"{list(axes['mrope_section'])} (sum {pairs})")
            raise ValueError(msg)
        out["axes"] = axes
    return out


def _mrope_axes(given: dict[str, Any]) -> dict[str, Any] | None:
    """Qwen2-VL's ``mrope_section`` (and Qwen3-VL's ``mrope_interleaved``), taken from `given`,
    as `relpos_ref.rope_rotate`'s ``axes``; ``None`` without a section."""
    section = given.pop("mrope_section", None)
    interleaved = given.pop("mrope_interleaved", None)
    if section is None:
        if interleaved:
            msg = "`rope_parameters['mrope_interleaved']` needs `mrope_section`, got none"
            raise ValueError(msg)
        return None
    return check_axes({"axes_type": "mrope", "mrope_section": list(section),
                       "mrope_interleaved": bool(interleaved)})


def _scaling(kind: str, given: dict[str, Any], fraction: float, max_positions: int | None,
             policy: str, softmax_mscale: bool) -> dict[str, Any] | None:
    if kind == "default":
        return None
    out: dict[str, Any] = {"rope_type": kind}
    if kind in ("linear", "llama3", "dynamic"):
        out["factor"] = _need(given.get("factor"), "factor", kind)
    if kind == "dynamic":
        out["original_max_position_embeddings"] = _need(max_positions,
                                                        "max_position_embeddings", kind)
        out["policy"] = policy
        return out
    if kind in ("yarn", "longrope", "llama3"):
        original = given.get("original_max_position_embeddings") or max_positions
        out["original_max_position_embeddings"] = _need(
            original, "original_max_position_embeddings", kind)
    if kind == "llama3":
        out.update(low_freq_factor=given.get("low_freq_factor"),
                   high_freq_factor=given.get("high_freq_factor"))
    elif kind == "proportional":
        out.update(partial_rotary_factor=fraction, factor=given.get("factor") or 1.0)
    elif kind == "yarn":
        factor = given.get("factor")
        if factor is None:
            factor = _need(max_positions, "max_position_embeddings", kind) / original
        out.update(factor=factor, beta_fast=given.get("beta_fast") or 32.0,
                   beta_slow=given.get("beta_slow") or 1.0,
                   truncate=given.get("truncate", True),
                   mscale=given.get("mscale"), mscale_all_dim=given.get("mscale_all_dim"),
                   attention_factor=given.get("attention_factor"),
                   softmax_mscale=bool(softmax_mscale and given.get("mscale_all_dim")))
    elif kind == "longrope":
        out.update(short_factor=list(given.get("short_factor") or ()),
                   long_factor=list(given.get("long_factor") or ()),
                   factor=given.get("factor"), attention_factor=given.get("attention_factor"),
                   max_position_embeddings=max_positions, policy=policy)
        if out["factor"] is None and max_positions is None:
            _need(None, "max_position_embeddings", kind)
    return out
