"""The golden guide's table of case parameters and keyword arguments, from the catalog.

Generated at build time (``_generated/golden_params.md``) and tested against
real cases in ``tests/test_docs.py``.
"""

from __future__ import annotations

from relpos_ref import catalog

SCHEMES = tuple(catalog.names())


def golden_kwargs(entry: catalog.Scheme) -> list[str]:
    """The keyword arguments a golden case of `entry` passes, from the catalog: ``scale``,
    ``causal`` and ``q_offset`` where the scheme's function takes them, then every option a
    case records; an option named like a size left at ``None`` by default (``max_past``
    for ``P``) is marked with the cases that pass it."""
    import inspect

    accepts = inspect.signature(entry.attention).parameters
    out = ["`scale`", *(f"`{n}`" for n in ("causal", "q_offset") if n in accepts)]
    sizes = {s.name: s for s in entry.sizes}
    for option in entry.options:
        if not option.case_parameter:
            continue
        size = sizes.get(option.name)
        if size is not None and size.default is None and size.fit is None:
            out.append(f"`{option.name}` (cases with `{size.key}`: asymmetric)")
        else:
            out.append(f"`{option.name}`")
    return out


def golden_parameter_rows() -> str:
    """Per scheme: its golden case parameters, the kwargs, inputs and gradients of a case,
    and whether it has decode cases (`relpos_ref.golden.decode.decodes`).

    A Markdown table generated from the catalog and `relpos_ref.golden.Case`.
    """
    from relpos_ref.golden.cases import scheme_defaults
    from relpos_ref.golden.decode import decodes
    from relpos_ref.golden.pipeline import gradient_name

    head = ("| scheme | its `params` (besides the common ones) | `kwargs` | table inputs "
            "| gradients | decode cases (`steps`) |\n|---|---|---|---|---|---|")
    rows = [head]
    for name in SCHEMES:
        entry = catalog.get(name)
        meanings = {s.key: s.meaning for s in entry.sizes}
        meanings.update({o.name: o.meaning for o in entry.options})
        switched: dict[str, list[str]] = {}
        for t in entry.tables:
            if t.switch is not None:
                switched.setdefault(t.switch, []).append(f"`{t.name}`")
        meanings.update({k: f"whether {' and '.join(v)} {'is' if len(v) == 1 else 'are'} given"
                         for k, v in switched.items()})
        params = "; ".join(f"`{k}` ({meanings.get(k, '')}, default {v!r})"
                           for k, v in scheme_defaults(entry).items()).replace("|", "\\|")
        kwargs = golden_kwargs(entry)
        tables = [t.name for t in entry.tables]
        learned = {"alibi": ["slopes"], "kerple": ["r1", "r2"],
                   "fire": ["c", "L"]}.get(name, [])  # not inputs
        arguments = ["q", "k", "v", *tables, *learned]
        rows.append(
            f"| `{name}` | {params or '(none)'} | {', '.join(kwargs)} | "
            f"{', '.join(f'`{t}`' for t in tables) or '(none)'} | "
            f"{', '.join(f'`{gradient_name(a)}`' for a in arguments)} | "
            f"{'yes' if decodes(entry) else 'no (a whole grid)'} |"
        )
    return "\n".join(rows) + "\n"
