"""torch kernels: every scheme's attention read from its distance form.

Each kernel validates its call with the scheme's own checks (so bad input gets
the specification's message), lowers it to the distance form
(`relpos_ref.lowering`, the catalog's ``lower``) and evaluates that form; no
scheme's terms are derived here. Three evaluators (`attend`):

- torch's `torch.nn.functional.scaled_dot_product_attention` (SDPA), fused on
  every device torch has, for the forms with no term of ``q`` or ``k`` and no
  relative value: plain attention (its dense ``position`` and ``bias``),
  RoPE and absolute (rotated ``q``, ``k``; ``k + R``), and the biases by
  distance (bias, T5, ALiBi) as one row of the call's distances read through
  a view (`relpos_ref.kernels._torch_sdpa`);
- the block engine (`relpos_ref.kernels._torch_form`) for the others (Shaw
  and Music with or without value tables, general, grid2d, Swin,
  Transformer-XL, DeBERTa): a block of query rows at a time, each term read
  from one product per call or per block through views, relative values
  binned by run, no ``(t_q, t_k)`` array;
- for a form of the engine without relative values or causal structure,
  whose terms fit in `relpos_ref.kernels._torch_sdpa.TERMS_BYTES`: its terms
  made by the engine's blocks into one ``(..., t_q, t_k)`` array, then SDPA
  with them (`relpos_ref.kernels._torch_sdpa.terms_attention`).

CoPE skips the lowering (``DIRECT``, `relpos_ref.kernels._torch_cope`): one
product of ``q`` and ``k`` serves its gates and its logits; so does the
forgetting bias (`relpos_ref.kernels._torch_forgetting`: its bias rounded
once into the call's dtype, no float64 ``(h, t_q, t_k)`` arrays).

``VJP_KERNELS`` compute each ``*_attention_vjp`` (CoPE's and the forgetting
bias's by their own, ``DIRECT_VJP``) by the block engine's
backward pass (`relpos_ref.kernels._torch_form_vjp`) for the form's arrays,
carried back through the lowering to the call's arguments by
`torch.autograd.grad` (plain attention's dense ``position`` and ``bias``
too: the engine adds a dense term to each block's scores and keeps each
block's gradient of it), after the specification's own checks of the call and of
``d_output``; ALiBi's slopes get their gradient when they were derived, as
the specification returns it. ``BLOCKED_KERNELS`` evaluate
`relpos_ref.blocked.blocked_attention` for every scheme that takes
``q_offset``: each of the specification's tiles of queries is its own call,
lowered and evaluated against the keys that tile visits
(`relpos_ref.kernels._blocked_rows`).

Every kernel returns ``NotImplemented`` (the specification runs) for what it
does not cover:

- ``return_weights=True``, ``method="definition"``;
- any non-finite value in ``q``, ``k``, ``v``, a table or a given term (the
  specification keeps a masked pair's NaN out of the output; an additive
  mask, or a weight times a value, cannot: ``NaN - inf`` is NaN);
- a call whose logits could overflow, by a bound from the largest
  magnitudes of ``q``, ``k`` and the tables (`relpos_ref.kernels._overflow`;
  one ``aminmax`` per array, one read back): a kernel would read an
  overflowed ``-inf`` as a masked key, the specification makes it NaN;
- an empty grid or feature axis, arrays of several devices or libraries, and
  calls under ``torch.compile`` or a ``torch.func`` transform (the checks read
  values back; the specification traces as it is).

A row with no allowed key gets zeros, as in the specification. 16-bit calls
run in float32 and return their dtype (`relpos_ref.calls.computes_in_float32`).

Gradients: a call that autograd records (grad mode on and an input that
requires gradients) or that carries forward-mode tangents runs a composition
of differentiable operations: SDPA's math backend, with the form's terms on
the whole grid (`relpos_ref.lowering.form_terms`) where the block engine
would run; a form with relative values then goes to the specification. A
VJP kernel hands back a call whose own inputs require gradients (the
specification's gradients are then differentiable in turn), one in inference
mode (autograd records nothing there), and a non-finite ``d_output``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .. import catalog
from .._adapters import Terms
from ..blocked import mask_tile
from ..calls import Call, check_terms, computes_in_float32
from ..gradients import check_d_output
from ..lowering import DistanceForm, form_terms
from ..schemes.rope_learned import learned_frequencies
from ._blocked_rows import (
    blocked_arguments,
    blocked_rows,
    check_blocked_arguments,
)
from ._torch_cope import cope_fused, cope_vjp_fused
from ._torch_cover import (
    all_tensors,
    bounded,
    differentiated,
    finite,
    is_array,
    one_device,
    traced,
)
from ._torch_fire import fire_fused, fire_vjp_fused
from ._torch_forgetting import forgetting_fused, forgetting_vjp_fused
from ._torch_form import form_attention
from ._torch_form_vjp import form_vjp
from ._torch_plan import fits
from ._torch_sdpa import by_sdpa, sdpa_form, sdpa_terms, terms_attention, with_terms_made
from ._torch_swinv2 import without_penalty

__all__ = ["BLOCKED_KERNELS", "KERNELS", "VJP_KERNELS"]

#: Scheme name (as in `relpos_ref.catalog`) -> its torch kernel.
KERNELS: dict[str, Callable[..., Any]] = {}

#: Scheme name -> its backward pass: torch autograd through the scheme's kernel.
VJP_KERNELS: dict[str, Callable[..., Any]] = {}

#: Scheme name -> `relpos_ref.blocked.blocked_attention` of that scheme through SDPA, a tile
#: of queries at a time (`NO_TERMS` and `DISTANCE_ONLY`).
BLOCKED_KERNELS: dict[str, Callable[..., Any]] = {}

#: Scheme name -> its evaluation without the lowering, for calls no gradient is taken of:
#: ``(q, k, v, named, call, mask) -> out`` (CoPE: one product of q and k, not two), ``named``
#: the tables and the options given; ``NotImplemented``: the specification evaluates it.
DIRECT: dict[str, Callable[..., Any]] = {"cope": cope_fused, "fire": fire_fused,
                                         "forgetting": forgetting_fused}

#: Scheme name -> its VJP without the lowering's autograd:
#: ``(q, k, v, named, call, mask, d_output) -> gradients by name``; ``NotImplemented``: the
#: specification's.
DIRECT_VJP: dict[str, Callable[..., Any]] = {"cope": cope_vjp_fused, "fire": fire_vjp_fused,
                                              "forgetting": forgetting_vjp_fused}

class _Arguments(NamedTuple):
    """A call's arguments by name, as a kernel reads them."""

    given: dict[str, Any]
    tables: dict[str, Any]  # the tables given, by name
    terms: dict[str, Any]  # plain attention's bias and position, when given
    floating: list[Any]  # every floating array argument


def _arguments(entry: Any, signature: inspect.Signature, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> _Arguments | None:
    # None where no kernel takes the call: one the signature refuses (the specification
    # says what is wrong), arrays that are not all torch tensors of one device, a trace
    try:
        given = dict(signature.bind(*args, **kwargs).arguments)
    except TypeError:
        return None
    tables = {t.name: given[t.name] for t in entry.tables if given.get(t.name) is not None}
    terms = {n: given[n] for n in ("bias", "position") if given.get(n) is not None}
    others = ("d_output", "mask", *(o.name for o in entry.options))
    arrays = [given["q"], given["k"], given["v"], *tables.values(), *terms.values(),
              *(given[n] for n in others if is_array(given.get(n)))]
    if not all_tensors(*arrays) or traced(*arrays) or not one_device(arrays):
        return None
    return _Arguments(given, tables, terms, [a for a in arrays if a.dtype.is_floating_point])


def _check_call(entry: Any, arguments: _Arguments) -> tuple[Call, dict[str, Any]]:
    # the specification's checks of the call (the scheme's own, and plain's terms)
    given = arguments.given
    call, options = entry.check_call(
        given["q"], given["k"], given["v"], arguments.tables, scale=given.get("scale"),
        mask=given.get("mask"), causal=given.get("causal"), q_offset=given.get("q_offset"),
        options={o.name: given[o.name] for o in entry.options if o.name in given})
    if entry.name == "plain":
        check_terms(given["q"], call, **arguments.terms)
    return call, options


def lowered(entry: Any, q: Any, k: Any, v: Any, tables: dict[str, Any], call: Call,
            options: dict[str, Any], *, mask: Any, terms: dict[str, Any]) -> DistanceForm:
    """The distance form of a call the scheme's checks accepted (`relpos_ref.lowering`)."""
    return entry.lower(q, k, v, tables, call=call, mask=mask, options={**options, **terms})


def attend(form: DistanceForm, *, fused: bool, flipped: tuple[Any, Any] | None = None,
           whole_terms: bool = True) -> Any:
    """Attention of a form: SDPA, the block engine, or ``NotImplemented``.

    `fused` (no gradient recorded): SDPA's fused kernels for the forms it
    takes (`relpos_ref.kernels._torch_sdpa.by_sdpa`); a form without relative
    values or causal structure, with its terms made by the block engine
    (`relpos_ref.kernels._torch_sdpa.terms_attention`, up to `TERMS_BYTES`
    of them, where `whole_terms`); the block engine
    (`relpos_ref.kernels._torch_form`) for the others. Otherwise (autograd
    records the call, or a forward-mode tangent rides on it) a composition
    of differentiable operations: SDPA's math backend with the form's terms
    on the whole grid (`relpos_ref.lowering.form_terms`); a form with
    relative values goes to the specification.

    Examples
    --------
    >>> import torch
    >>> import relpos_ref as rp
    >>> from relpos_ref.lowering import lower
    >>> q = k = v = torch.eye(4, dtype=torch.float64)[None]
    >>> table = torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4)
    >>> fast = attend(lower("shaw", q, k, v, table, table, causal=True), fused=True)
    >>> with rp.kernels.disabled():
    ...     bool(torch.allclose(fast, rp.shaw_attention(q, k, v, table, table, causal=True)))
    True
    """
    if by_sdpa(form):
        return sdpa_form(form, fused=fused, flipped=flipped)
    if not fused:
        if form.values:
            return NotImplemented
        terms = Terms(*form_terms(form))
        return sdpa_terms(form.q, form.k, form.v, form.call, terms=terms, mask=form.mask,
                          fused=False)
    if not fits(form):
        return NotImplemented
    if whole_terms and with_terms_made(form):
        return terms_attention(form, flipped)
    return form_attention(form, flipped)


def _given_options(options: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    # the options the caller passed, as passed
    return {n: given[n] for n in options if n in given}


def _rotated_bounded(entry: Any, call: Call, options: dict[str, Any], q: Any, k: Any) -> bool:
    # RoPE's rotated operands carry its attention factor (YaRN, LongRoPE): bound the logits
    # from them, not from the 2|x| a plain rotation gives
    if entry.rotate is None:
        return True
    q_rot, k_rot = entry.rotate(q, k, q_offset=call.q_offset, options=options)
    return bounded("plain", call, {"q": q_rot, "k": k_rot})


def _kernel(name: str) -> Callable[..., Any]:
    entry = catalog.get(name)
    signature = inspect.signature(entry.attention)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        arguments = _arguments(entry, signature, args, kwargs)
        if arguments is None:
            return NotImplemented
        call, options = _check_call(entry, arguments)
        given, named = arguments.given, arguments.tables
        q, k, v, mask = given["q"], given["k"], given["v"], given.get("mask")
        # anything but the defaults (a bad value too) goes to the specification, which
        # checks them in its own order
        if (given.get("return_weights", False) is not False
                or given.get("method", "efficient") != "efficient"
                or 0 in (call.t_q, call.t_k, q.shape[-1], v.shape[-1])
                or not bounded(name, call, {"q": q, "k": k, "v": v, **named, **arguments.terms,
                                             **{n: a for n, a in options.items()
                                                if is_array(a)}})
                or not _rotated_bounded(entry, call, options, q, k)):
            return NotImplemented
        fused = not differentiated(arguments.floating)
        if name in DIRECT and fused:
            # the options as given (the checks make c and L arrays of q's dtype, for the
            # gradients: the specification reads python numbers in float64)
            return DIRECT[name](q, k, v, {**named, **_given_options(options, given)}, call,
                                mask)
        form = lowered(entry, q, k, v, named, call, options, mask=mask, terms=arguments.terms)
        return attend(form, fused=fused)

    kernel.__name__ = kernel.__qualname__ = f"{name}_attention_torch"
    kernel.__doc__ = f"`{entry.attention.__name__}` on torch (see the module docstring)."
    return computes_in_float32(kernel)


def _vjp_kernel(name: str) -> Callable[..., Any]:
    entry = catalog.get(name)
    signature = inspect.signature(entry.vjp)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        arguments = _arguments(entry, signature, args, kwargs)
        if arguments is None:
            return NotImplemented
        if differentiated(arguments.floating):
            return NotImplemented  # the specification's gradients are differentiable
        if torch.is_inference_mode_enabled() or any(a.is_inference()
                                                    for a in arguments.floating):
            return NotImplemented  # autograd records nothing there
        # the specification's checks, in its order: the call, then the cotangent
        call, options = _check_call(entry, arguments)
        given = dict(arguments.given)
        d_output = given.pop("d_output")
        check_d_output(d_output, given["q"], call, given["v"].shape[-1], mask=given.get("mask"))
        if not finite([d_output]):
            return NotImplemented  # a NaN for a row with no key reaches dv in the specification
        if (given.get("method", "efficient") != "efficient"
                or 0 in (call.t_q, call.t_k, given["q"].shape[-1], given["v"].shape[-1])
                or not bounded(name, call, {"q": given["q"], "k": given["k"], "v": given["v"],
                                             **arguments.tables, **arguments.terms,
                                             **{n: a for n, a in options.items()
                                                if is_array(a)}})
                or not _rotated_bounded(entry, call, options, given["q"], given["k"])
                or learned_frequencies(options.get("axes")) is not None):
            return NotImplemented  # (RoPE-Mixed's learned frequencies: the specification's)
        if name in DIRECT_VJP:
            return DIRECT_VJP[name](given["q"], given["k"], given["v"],
                                    {**arguments.tables, **_given_options(options, given)},
                                    call, given.get("mask"), d_output)
        # every floating argument, and array options completed by the checks (ALiBi's
        # slopes when not given: the specification returns their gradient too); integer
        # ones (RoPE's positions) are no leaves
        leaves = {"q": given["q"], "k": given["k"], "v": given["v"], **arguments.tables,
                  **arguments.terms, **{n: a for n, a in options.items()
                                        if is_array(a) and a.dtype.is_floating_point}}
        return _form_gradients(entry, call, options, leaves, d_output, mask=given.get("mask"),
                               terms=tuple(arguments.terms))

    kernel.__name__ = kernel.__qualname__ = f"{name}_attention_vjp_torch"
    kernel.__doc__ = (f"`{entry.vjp.__name__}` on torch (see the module docstring).")
    return computes_in_float32(kernel)


def _form_gradients(entry: Any, call: Call, options: dict[str, Any], leaves: dict[str, Any],
                    d_output: Any, *, mask: Any, terms: tuple[str, ...]) -> Any:
    # the block engine's backward pass (`_torch_form_vjp`) by the form's arrays (dense terms
    # included: plain attention's `position` and `bias`, named by `terms`), carried back
    # through the lowering to `leaves` by autograd
    with torch.enable_grad():
        leaves = {n: a.detach().requires_grad_(True) for n, a in leaves.items()}
        tables = {t.name: leaves[t.name] for t in entry.tables if t.name in leaves}
        given = {n: leaves.get(n, a) for n, a in options.items()}
        form = lowered(entry, leaves["q"], leaves["k"], leaves["v"], tables, call, given,
                       mask=mask, terms={n: leaves[n] for n in terms})
    if not fits(form):
        return NotImplemented
    with torch.no_grad():
        grads = form_vjp(form, d_output)
    outputs, cotangents = [], []
    for array, grad in _form_arrays(form, grads):
        if array.requires_grad:
            outputs.append(array)
            cotangents.append(grad)
    found = torch.autograd.grad(outputs, list(leaves.values()), cotangents, allow_unused=True)
    return {n: torch.zeros_like(a) if f is None else f.detach()
            for (n, a), f in zip(leaves.items(), found, strict=True)}


def _form_arrays(form: DistanceForm, grads: dict[Any, Any]) -> list[tuple[Any, Any]]:
    # (array of the form, its gradient) for each array `form_vjp` differentiates
    pairs = [(form.q, grads["q"]), (form.k, grads["k"]), (form.v, grads["v"])]
    for side, terms in (("query", form.query_terms), ("key", form.key_terms)):
        for t, term in enumerate(terms):
            d_vectors, d_table = grads[side, t]
            pairs += [(term.vectors, d_vectors), (term.table, d_table)]
    pairs += [(term.table, grads["bias", t]) for t, term in enumerate(form.biases)]
    pairs += [(term.table, grads["values", t]) for t, term in enumerate(form.values)]
    if "dense" in grads:  # plain attention's position and bias
        pairs += [(x, d) for x, d in zip(form.dense, grads["dense"], strict=True)
                  if x is not None]
    return pairs


def _blocked_kernel(name: str) -> Callable[..., Any]:
    entry = catalog.get(name)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        arguments = blocked_arguments(args, kwargs, scheme=name)
        if arguments is None:
            return NotImplemented  # the specification says what is wrong
        given, arrays = arguments
        q, k, v, mask = given["q"], given["k"], given["v"], given["mask"]
        if not all_tensors(*arrays) or traced(*arrays) or not one_device(arrays):
            return NotImplemented
        checked = check_blocked_arguments(given)
        call, options, named = checked.call, checked.options, checked.tables
        floating = [a for a in arrays if a.dtype.is_floating_point]
        if (0 in (call.t_q, call.t_k, q.shape[-1], v.shape[-1])
                or not bounded(name, call, {"q": q, "k": k, "v": v, **named,
                                             **{n: a for n, a in options.items()
                                                if is_array(a)}})):
            return NotImplemented
        fused = not differentiated(floating)
        reversed_keys = (k.flip(-2), v.flip(-2))  # once for every tile

        def attend_tile(i0: int, i1: int, j1: int) -> Any:
            # queries i0 .. i1 - 1 against keys 0 .. j1 - 1: the tile's own call, lowered
            sub = call._replace(t_q=i1 - i0, t_k=j1, q_offset=call.q_offset + i0)
            keys, values = k[..., :j1, :], v[..., :j1, :]
            form = lowered(entry, q[..., i0:i1, :], keys, values, named, sub, options,
                           mask=mask_tile(mask, i0, i1, 0, j1), terms={})
            flipped = None
            if form.k is keys and form.v is values:  # the lowering kept them: reversed already
                flipped = tuple(x[..., call.t_k - j1:, :] for x in reversed_keys)
            # (no mask: no (rows, t_k) array of terms, the `lean` bound of blocked_rows)
            return attend(form, fused=fused, flipped=flipped, whole_terms=mask is not None)

        # no mask: a call reads one row of distances (SDPA), or blocks of rows (the engine)
        return blocked_rows(checked, q, v, name=name, lean=mask is None, attend=attend_tile)

    kernel.__name__ = kernel.__qualname__ = f"{name}_blocked_attention_torch"
    kernel.__doc__ = (f"`blocked_attention(..., scheme={name!r})` on torch, a block of "
                      "queries at a time (see the module docstring).")
    return computes_in_float32(kernel)


for _name in catalog.names(plain=True):
    KERNELS[_name] = _kernel(_name)
    VJP_KERNELS[_name] = _vjp_kernel(_name)
    if "q_offset" in inspect.signature(catalog.get(_name).attention).parameters:
        BLOCKED_KERNELS[_name] = _blocked_kernel(_name)
del _name


KERNELS["swinv2"] = without_penalty(KERNELS["swinv2"])
VJP_KERNELS["swinv2"] = without_penalty(VJP_KERNELS["swinv2"])
