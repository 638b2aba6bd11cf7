"""Decode cases: a prefill, then one query at a time against a growing cache.

A case with ``steps = n`` is of kind ``"decode"``. Its ``t_k`` keys are a
memory of ``m = t_k - t_q`` tokens (Transformer-XL's; 0 for the others),
``t_q - n`` prefill queries, and ``n`` decoded tokens; its ``q_offset`` is
``m`` (end-aligned) and it is causal. It is computed as a decoder with a
cache computes it (`decode_plan`):

- the **prefill**: queries ``0 .. t_q - n - 1`` at ``q_offset = m`` against
  the ``t = t_k - n`` keys before the first step;
- **step** ``s`` (``s = 0 .. n - 1``): query ``t_q - n + s``, one row, at
  ``q_offset = t + s``, against the cache of ``t + s + 1`` keys (the
  ``t + s`` before it and its own).

Its goldens are the ``output`` of those calls, rows in order ``(b, h,
t_q, d)``, and their ``weights``, each call's row padded with zeros to the
``t_k`` keys. A mask ``(t_q, t_k)`` is read at each call's rows and keys.
Wherever the frequencies do not depend on the call's length (every scheme
but RoPE's ``dynamic`` and ``longrope`` rules per call), the goldens equal
the full causal call's rows, which the tests prove on every backend.
Decode cases hold no cotangent and no gradients (decoding is inference).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import catalog
from .manifest import KINDS

__all__ = [
    "KINDS",
    "DecodeCall",
    "check_decode",
    "decode_base_cases",
    "decode_plan",
    "decode_variants",
    "decodes",
    "evaluate_decode",
]

@dataclass(frozen=True)
class DecodeCall:
    """One call of a decode: the prefill, or one step.

    Attributes
    ----------
    name : str
        ``"prefill"`` or ``"step s"``.
    rows : slice
        The query rows it computes: of ``q``, of the mask and of the output.
    keys : int
        The cache it attends to: keys and values ``0 .. keys - 1``.
    q_offset : int
        The position of its first query.
    """

    name: str
    rows: slice
    keys: int
    q_offset: int

    def inputs(self, arrays: Mapping[str, Any]) -> dict[str, Any]:
        """`arrays` (a case's inputs, of any library) as this call reads them.

        ``q`` at its rows, ``k`` and ``v`` cut to its cache, a ``mask`` (or a
        dense ``bias``) at both; the tables unchanged.

        Examples
        --------
        >>> import numpy as np
        >>> call = decode_plan(t_q=6, t_k=6, steps=2)[1]
        >>> x = call.inputs({"q": np.zeros((6, 4)), "k": np.zeros((6, 4)), "table": None})
        >>> call.name, call.q_offset, x["q"].shape, x["k"].shape, x["table"]
        ('step 0', 4, (1, 4), (5, 4), None)
        """
        out = dict(arrays)
        for name, x in arrays.items():
            if name == "q":
                out[name] = x[..., self.rows, :]
            elif name in ("k", "v"):
                out[name] = x[..., : self.keys, :]
            elif name in ("mask", "bias") and x is not None:
                out[name] = x[..., self.rows, : self.keys]
        return out

    def kwargs(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """A case's keyword arguments (`relpos_ref.golden.GoldenCase.kwargs`) for this call."""
        return {**kwargs, "q_offset": self.q_offset}


def decode_plan(*, t_q: int, t_k: int, steps: int) -> list[DecodeCall]:
    """The calls of a decode case: the prefill, then ``steps`` single-query steps.

    Examples
    --------
    >>> [(c.name, c.q_offset, c.keys) for c in decode_plan(t_q=4, t_k=6, steps=2)]
    [('prefill', 2, 4), ('step 0', 4, 5), ('step 1', 5, 6)]
    """
    memory, prefill = t_k - t_q, t_q - steps
    t = memory + prefill  # the cache before the first step
    calls = [DecodeCall("prefill", slice(0, prefill), t, memory)]
    calls += [DecodeCall(f"step {s}", slice(prefill + s, prefill + s + 1), t + s + 1, t + s)
              for s in range(steps)]
    return calls


def decodes(entry: catalog.Scheme) -> bool:
    """Whether a scheme has decode cases: its attention takes ``causal`` and ``q_offset``
    and is not over a grid (grid2d and Swin attend over a whole grid or window).

    Examples
    --------
    >>> decodes(catalog.get("t5")), decodes(catalog.get("swin"))
    (True, False)
    """
    accepts = inspect.signature(entry.attention).parameters
    return "q_offset" in accepts and "causal" in accepts and entry.grid is None


def check_decode(entry: catalog.Scheme, p: dict[str, Any]) -> None:
    """Complete and check a decode case's parameters `p` (before their defaults are resolved).

    ``causal`` and ``q_offset`` left out become ``True`` and ``t_k - t_q``.

    Raises
    ------
    ValueError
        Naming the parameter: a scheme whose function takes no ``q_offset``
        (the grids), ``causal=False``, another ``q_offset``, or ``steps``
        outside ``1 .. t_q - 1``.
    """
    steps = p["steps"]
    if not decodes(entry):
        msg = (f"`steps` (a decode case) needs a scheme whose attention takes `causal` and "
               f"`q_offset`; {entry.name!r} attends over a whole grid, got steps={steps!r}")
        raise ValueError(msg)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps < p["t_q"]:
        msg = (f"`steps` must be an integer in 1 .. t_q - 1 = {p['t_q'] - 1} (the prefill "
               f"keeps a query), got {steps!r}")
        raise ValueError(msg)
    if p["causal"] is None:
        p["causal"] = True
    if p["causal"] is not True:
        msg = f"`causal` must be True in a decode case (steps={steps}), got {p['causal']!r}"
        raise ValueError(msg)
    memory = p["t_k"] - p["t_q"]
    if p["q_offset"] is None:
        p["q_offset"] = memory
    if p["q_offset"] != memory:
        msg = (f"`q_offset` must be t_k - t_q = {memory} in a decode case (the memory before "
               f"the prefill), got {p['q_offset']!r}")
        raise ValueError(msg)


def evaluate_decode(case: Any, xp: Any, arrays: Mapping[str, Any],
                    evaluate: Callable[..., dict[str, Any]], **options: Any) -> dict[str, Any]:
    """``output`` and ``weights`` of a decode case: `evaluate` run on each call of its plan.

    Each call is the case's forward case at that call's rows, keys and
    offset (the sizes fixed as the whole case resolves them); `options` go
    to `evaluate` (``method``, ``store``, ``matmul``).
    """
    p = case.parameters
    sizes = case.entry.sizes_from(p)
    outputs, weights = [], []
    for call in decode_plan(t_q=p["t_q"], t_k=p["t_k"], steps=p["steps"]):
        rows = call.rows.stop - call.rows.start
        params = {k: v for k, v in p.items() if k != "steps"}
        params.update(sizes, t_q=rows, t_k=call.keys, q_offset=call.q_offset)
        single = dataclasses.replace(case, params=tuple(sorted(params.items())))
        found = evaluate(single, xp, call.inputs(arrays), **options)
        outputs.append(found["output"])
        w = found["weights"]
        pad = xp.zeros((*w.shape[:-1], p["t_k"] - call.keys), dtype=w.dtype,
                       device=_device(w))
        weights.append(xp.concat([w, pad], axis=-1))
    return {"weights": xp.concat(weights, axis=-2), "output": xp.concat(outputs, axis=-2)}


def _device(x: Any) -> Any:
    from .._xp import device

    return device(x)


def decode_base_cases() -> list[tuple[str, str, Mapping[str, Any]]]:
    """(scheme, variant, parameters) of the default suite's decode cases: one per scheme
    whose attention decodes (every scheme but the grids), three steps each."""
    small = {"h": 2, "t_q": 8, "t_k": 8, "d": 8, "steps": 3}
    return [
        ("absolute", "decode", small),
        ("shaw", "decode-masked", {**small, "K": 2, "masked": True}),
        ("bias", "decode", {**small, "h": 3, "K": 3, "per_head": True}),
        ("music", "decode", {**small, "M": 8, "values": True}),
        ("general", "decode", {**small, "t_max": 8}),
        ("t5", "decode", {**small, "t_q": 10, "t_k": 10, "buckets": 8, "max_distance": 8,
                          "bidirectional": False, "per_head": True}),
        ("alibi", "decode", {**small, "h": 3, "symmetric": False}),
        ("kerple", "decode-log", {**small, "h": 3}),
        ("sandwich", "decode", {**small, "h": 3}),
        ("forgetting", "decode", {**small, "h": 3, "per_head": True}),
        ("fire", "decode-beyond-l", {**small, "h": 3, "hidden": 16, "per_head": True,
                                     "c": 1.0, "L": 4.0}),
        ("cope", "decode", {**small, "h": 3, "npos": 6, "per_head": True}),
        ("rope", "decode-yarn", {**small, "d": 16, "rotary_dim": 8, "base": 100.0,
                                 "scaling": {"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 16}}),
        ("xpos", "decode", {**small, "scale_base": 16.0, "center": "middle_up"}),
        # a memory of 4 tokens before a segment of 6: the prefill reads it, the steps too
        ("transformer_xl", "decode-memory", {**small, "t_q": 6, "t_k": 10,
                                             "per_head": True}),
        ("deberta", "decode", {**small, "span": 4, "max_position": 8}),
    ]


def decode_variants(call: Any) -> Iterator[tuple[str, Any]]:
    """A decode case's planted decode mistakes, each in every step (the prefill as it is).

    ``decode-start-aligned``: each step's query at ``q_offset = 0`` (a
    one-query causal call aligned at the top left, as
    ``scaled_dot_product_attention(is_causal=True)`` aligns it);
    ``cache-length+1`` / ``cache-length-1``: each step's query placed by a
    cache length one off, at ``t + s + 1`` (the length after its own token
    is appended) or ``t + s - 1``.

    Parameters
    ----------
    call : relpos_ref.golden.diagnose.Call
        The case's call, with its plan (``call.decode``).
    """
    def moved(name: str, offset: Callable[[DecodeCall], int]) -> tuple[str, Any]:
        plan = tuple(c if c.name == "prefill" else dataclasses.replace(c, q_offset=offset(c))
                     for c in call.decode)
        return name, call.replace(decode=plan)

    yield moved("decode-start-aligned", lambda c: 0)
    yield moved("cache-length+1", lambda c: c.q_offset + 1)
    yield moved("cache-length-1", lambda c: c.q_offset - 1)
