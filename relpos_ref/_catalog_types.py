"""The records of `relpos_ref.catalog`: a scheme, its sizes, tables and options."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ._adapters import Terms
from .calls import PLAIN, Call, Defaults

__all__ = ["Option", "Scheme", "Size", "Table"]


@dataclass(frozen=True)
class Size:
    """An integer that fixes the shape of a scheme's tables.

    Attributes
    ----------
    key : str
        Its name in golden case parameters and ids (``"K"``).
    name : str
        The argument it is to the scheme's functions (``"max_distance"``),
        and the command line's flag.
    default : int or None
        Default of golden cases; ``None``: `fit`.
    meaning : str
    fit : callable, optional
        ``(t_q, t_k) -> int``: the smallest size covering a grid.
    minimum : int
        The smallest value golden cases accept (1; 0 for ``P``, a table
        with no row for the past).
    """

    key: str
    name: str
    default: int | None
    meaning: str
    fit: Callable[[int, int], int] | None = None
    minimum: int = 1


@dataclass(frozen=True)
class Table:
    """One table argument of a scheme.

    Attributes
    ----------
    name : str
        The positional argument's name.
    rows : callable
        ``sizes -> int``: its rows from the scheme's sizes (by `Size.key`, and
        ``"d"`` for the feature width).
    rows_text : str
        The same as a formula, for the docs (``"2K + 1"``).
    width : {"d", "d_v"}, int or None
        Feature width of a row (an int: fixed, Swin v2's coordinates); ``None``
        for one scalar per row.
    meaning : str
    switch : str, optional
        For an optional table: the golden case parameter that includes it.
    switch_default : bool
        Whether golden cases include it unless told otherwise.
    """

    name: str
    rows: Callable[[Mapping[str, Any]], int]
    rows_text: str
    width: str | int | None
    meaning: str
    switch: str | None = None
    switch_default: bool = True

    @property
    def required(self) -> bool:
        """Whether ``*_attention`` needs it."""
        return self.switch is None

    def shape(
        self, sizes: Mapping[str, Any], *, d: int, d_v: int, heads: int | None = None
    ) -> tuple[int, ...]:
        """``(rows,)`` or ``(rows, width)``, with ``heads`` first when given."""
        head = () if heads is None else (heads,)
        width = (self.width,) if isinstance(self.width, int) else {
            "d": (d,), "d_v": (d_v,), None: ()}[self.width]
        return (*head, self.rows({"d": d, **sizes}), *width)


@dataclass(frozen=True)
class Option:
    """A keyword argument of a scheme besides the ones every attention function takes.

    Attributes
    ----------
    name : str
    meaning : str
    choices : tuple
        The values it takes when it is one of a few (empty otherwise).
    grid : bool
        Whether it changes the integer intermediates (``indices``).
    positive : bool
        Whether it is an integer ``>= 1`` when given.
    case_parameter : bool
        Whether golden cases record it (``False`` for an array).
    cli : bool
        Whether ``relpos-ref show`` takes it as a flag although it is not
        `grid` (what the scheme's `Scheme.show` prints depends on it).
    parse : callable, optional
        The command line's reader of its flag's text (default: an integer).
    """

    name: str
    meaning: str
    choices: tuple[Any, ...] = ()
    grid: bool = False
    positive: bool = False
    case_parameter: bool = True
    cli: bool = False
    parse: Callable[[str], Any] | None = None

    @property
    def flag(self) -> bool:
        """Whether ``relpos-ref show`` has a flag for it (`grid` or `cli`)."""
        return self.grid or self.cli


@dataclass(frozen=True)
class Scheme:
    """One scheme of the catalog (see the module docstring for each field's use)."""

    name: str
    title: str
    summary: str
    module: ModuleType | None
    attention: Callable[..., Any]
    check: Callable[..., tuple[Call, dict[str, Any]]]
    terms: Callable[..., Terms]
    indices: Callable[..., dict[str, Any]]
    label: Callable[[Mapping[str, Any]], str]
    sizes: tuple[Size, ...] = ()
    tables: tuple[Table, ...] = ()
    options: tuple[Option, ...] = ()
    values: Callable[..., Any] | None = None
    rotate: Callable[..., tuple[Any, Any]] | None = None
    grid: Callable[[Mapping[str, Any]], int] | None = None
    benchmark: Callable[[int], dict[str, Any]] = field(default=lambda t: {})
    vjp: Callable[..., dict[str, Any]] | None = None
    lower: Callable[..., Any] | None = None
    shifted_terms: Callable[..., Terms] | None = None
    show: Callable[..., list[str]] | None = None

    @property
    def attention_terms(self) -> Callable[..., Terms]:
        """The terms as attention evaluates them: `terms`, or `shifted_terms` where given.

        `shifted_terms` (ALiBi) differ from the definition's `terms` by a
        constant that is the same for every pair of the call, so that softmax
        gives the same weights, chosen so that the values stay exact at any
        offset; it is a function of the ``q_offset`` passed (the whole call's),
        never of a tile's ``i0``, ``j0``. The golden intermediates record
        `terms`; the attention paths (the blocked loop, the torch kernels)
        evaluate these.
        """
        return self.terms if self.shifted_terms is None else self.shifted_terms

    @property
    def defaults(self) -> Defaults:
        """What ``None`` means for ``scale``, ``causal`` and ``q_offset`` here."""
        return PLAIN if self.module is None else self.module.DEFAULTS

    @property
    def methods(self) -> bool:
        """Whether the scheme takes ``method="efficient"`` or ``"definition"``."""
        return "method" in inspect.signature(self.attention).parameters

    def option_defaults(self) -> dict[str, Any]:
        """Each option's default, from the ``*_attention`` signature (required ones left out)."""
        parameters = inspect.signature(self.attention).parameters
        return {
            o.name: parameters[o.name].default
            for o in self.options
            if parameters[o.name].default is not inspect.Parameter.empty
        }

    def check_call(
        self, q: Any, k: Any, v: Any, tables: Mapping[str, Any], *, scale: float | None = None,
        mask: Any = None, causal: bool | None = None, q_offset: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[Call, dict[str, Any]]:
        """Validate a call as ``*_attention`` would; return it and every option.

        Unknown options are a `TypeError` naming the known ones; omitted ones
        take their defaults, and a required one left out is a `TypeError`.
        """
        given = dict(options or {})
        known = [o.name for o in self.options]
        unknown = sorted(set(given) - set(known))
        if unknown:
            msg = (f"unknown parameter(s) {', '.join(unknown)} for scheme {self.name!r}; "
                   f"known: {', '.join(known) or 'none'}")
            raise TypeError(msg)
        complete = {**self.option_defaults(), **given}
        missing = [f"`{name}`" for name in known if name not in complete]
        if missing:
            msg = f"scheme {self.name!r} needs {', '.join(missing)}"
            raise TypeError(msg)
        return self.check(q, k, v, tables, scale=scale, mask=mask, causal=causal,
                          q_offset=q_offset, options=complete)

    def options_from(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A call's options from golden case parameters (an option named like a size reads it).

        A size left at ``None`` (``P``, when a table is symmetric) gives no
        option, so the call is the one written without it.
        """
        by_size = {s.name: params[s.key] for s in self.sizes
                   if params.get(s.key) is not None}
        named = {o.name: by_size.get(o.name, params.get(o.name)) for o in self.options}
        return {name: value for name, value in named.items()
                if name in by_size or name in params}

    def sizes_from(self, params: Mapping[str, Any]) -> dict[str, int]:
        """The sizes among golden case parameters, ``None`` ones fitted to the grid."""
        out = {}
        for size in self.sizes:
            value = params.get(size.key)
            if value is None and size.fit is not None:
                value = size.fit(params["t_q"], params["t_k"])
            out[size.key] = value
        return out

    def table_shapes(
        self, sizes: Mapping[str, Any], *, d: int, d_v: int, heads: int | None = None,
        include: Mapping[str, bool] | None = None,
    ) -> dict[str, tuple[int, ...]]:
        """Shapes of the tables by name; optional ones as `include` says (by switch)."""
        include = {} if include is None else include
        return {t.name: t.shape(sizes, d=d, d_v=d_v, heads=heads) for t in self.tables
                if t.required or include.get(t.switch, t.switch_default)}

    def scale(self, d: int, tables: Mapping[str, Any], scale: float | None = None) -> float:
        """The scale of a call with these tables (by name): `scale`, or the scheme's rule."""
        return self.defaults.resolve_scale(scale, d, [tables.get(t.name) for t in self.tables])

    def table_args(self, tables: Mapping[str, Any]) -> list[Any]:
        """The tables as the positional arguments of ``*_attention`` (``None`` in gaps)."""
        args = [tables.get(t.name) for t in self.tables]
        while args and args[-1] is None:
            args.pop()
        return args
