"""Cases of your own, from a TOML file (``relpos-ref list/generate --cases FILE``).

The file is read only when it is a regular file of at most 16 MiB (a device
such as ``/dev/zero``, a named pipe or a directory is refused unread); every
problem is said with the file, the case's number and the key.
"""

from __future__ import annotations

import os
from pathlib import Path

from .cases import Case, CaseRegistry
from .dtypes import FLOAT_DTYPES

__all__ = ["cases_from_toml"]

_CASE_KEYS = {"scheme", "variant", "params", "dtypes", "seeds"}
#: A cases file larger than this is refused before it is read.
_MAX_CASES_BYTES = 2**24


def cases_from_toml(path: str | os.PathLike[str]) -> CaseRegistry:
    """Cases of your own from a TOML file: shapes, parameters, dtypes and seeds.

    Each ``[[case]]`` table names a ``scheme`` and a ``variant`` and may give
    ``params`` (any parameter of `Case.make`: ``t_q``, ``K``, ``causal``, ...),
    ``dtypes`` (default: all four) and ``seeds`` (default ``[0]``); one case
    is made per dtype and seed::

        [[case]]
        scheme = "shaw"
        variant = "long"
        dtypes = ["float32", "bfloat16"]
        seeds = [0, 1]
        params = { h = 4, t_q = 128, t_k = 256, K = 16, causal = true }

    Raises
    ------
    ValueError
        A file that is not TOML, a missing or unknown key, or a case that
        `Case.make` refuses; the message names the file and the case's number.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "cases.toml"
    >>> _ = path.write_text('''
    ... [[case]]
    ... scheme = "shaw"
    ... variant = "long"
    ... dtypes = ["float32"]
    ... seeds = [0, 1]
    ... params = { h = 4, t_q = 128, t_k = 256, K = 16, causal = true }
    ... ''')
    >>> [c.id for c in cases_from_toml(path)]  # doctest: +NORMALIZE_WHITESPACE
    ['shaw/long/b1-h4-q128-k256-d8-K16/float32/s0',
     'shaw/long/b1-h4-q128-k256-d8-K16/float32/s1']
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            msg = "--cases needs Python 3.11 or later, or the tomli package on Python 3.10"
            raise ValueError(msg) from None
    from .paths import SuiteError, read_plain

    path = Path(path)
    try:
        raw = read_plain(path, limit=_MAX_CASES_BYTES, what="a cases file", follow=True)
        if raw is None:
            msg = f"{path}: cannot read it (No such file or directory)"
            raise SuiteError(msg)
        data = tomllib.loads(raw.decode("utf-8"))
    except SuiteError as exc:
        msg = f"--cases {exc}"
        raise ValueError(msg) from None
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError, an endless integer
        why = "it holds an integer of more digits than Python converts (4300)" \
            if "integer string conversion" in str(exc) else str(exc)
        msg = f"--cases {path}: not a TOML file of cases ({why})"
        raise ValueError(msg) from None
    unknown = sorted(set(data) - {"case"})
    tables = data.get("case")
    if unknown or not isinstance(tables, list) or not tables:
        msg = (f"--cases {path}: expected one or more [[case]] tables and nothing else"
               + (f"; unknown top-level key(s) {', '.join(unknown)}" if unknown else ""))
        raise ValueError(msg)
    registry = CaseRegistry()
    for number, table in enumerate(tables, 1):
        where = f"--cases {path}: case {number}"
        missing = sorted({"scheme", "variant"} - set(table))
        extra = sorted(set(table) - _CASE_KEYS)
        if missing or extra:
            why = "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else [])
                + ([f"unknown key(s) {', '.join(extra)} (known: {', '.join(sorted(_CASE_KEYS))})"]
                   if extra else []))
            msg = f"{where}: {why}"
            raise ValueError(msg)
        params = table.get("params", {})
        dtypes = table.get("dtypes", list(FLOAT_DTYPES))
        seeds = table.get("seeds", [0])
        if not isinstance(params, dict):
            msg = f"{where}: `params` must be a table, got {params!r}"
            raise ValueError(msg)
        for key, value in (("dtypes", dtypes), ("seeds", seeds)):
            if not isinstance(value, list) or not value:
                msg = f"{where}: `{key}` must be a non-empty list, got {value!r}"
                raise ValueError(msg)
        for dtype in dtypes:
            for seed in seeds:
                try:
                    registry.add(Case.make(table["scheme"], table["variant"], dtype=dtype,
                                           seed=seed, **params))
                except (ValueError, TypeError) as exc:
                    msg = f"{where}: {exc}"
                    raise ValueError(msg) from None
    return registry
