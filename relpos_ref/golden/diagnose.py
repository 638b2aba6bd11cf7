"""What went wrong: an obtained output tried against the field's known convention mistakes.

When someone's ``output`` misses its golden, `diagnose_case` recomputes the
case (float64, on the stored inputs) with each mistake the field makes,
*planted on purpose*, and measures how far the obtained output is from each
of them, in units of the case's tolerance. A variant within its tolerance
names the bug. The variants, where they apply to a case:

- ``table-reversed``: the relative table read in reverse row order, which
  is the distance's sign flipped for two-sided tables (``j - i`` for ``i - j``;
  with asymmetric clipping, ``max_past`` and ``K`` trade places as well);
- ``t5-halves-swapped``: T5's bidirectional buckets with the halves for
  ``r < 0`` and ``r > 0`` exchanged; ``alibi-sign-flipped``: the slopes negated;
- ``clip-at-K-1``: the two-sided table clipped one distance early (on both
  sides: ``P - 1`` as well, with asymmetric clipping); ``clip-at-K+1``: one
  distance late, the table of ``2K + 3`` rows an implementation built for
  ``K + 1`` with ours copied into its middle and zero end rows, so every
  distance beyond ``K`` reads zero (where the case clips);
- ``start-aligned`` / ``end-aligned``: queries at ``q_offset = 0`` or
  ``t_k - t_q`` instead of the case's offset; ``q_offset+1`` / ``q_offset-1``:
  the offset one off, either way (where that is neither of those); in a
  decode case instead, ``decode-start-aligned`` (each step at ``q_offset =
  0``) and ``cache-length+1`` / ``cache-length-1`` (each step placed by a
  cache length one off), `relpos_ref.golden.decode.decode_variants`;
- ``t5-causal-sign-flipped``: a causal T5 (``bidirectional=False``) bucketing
  ``context - memory`` instead of ``memory - context``, so every past key
  falls in bucket 0 (a decoder's sign swapped);
- ``bias-scaled``: the scale applied to an additive bias as well;
  ``position-unscaled``: a position term added after scaling instead of before;
- ``scale-1`` / ``scale-1/sqrt(d)``: the other common logit scale;
- ``shared-table``: per-head tables read as one table (every head gets head 0's);
- ``causal-strict``: the causal mask keeping ``r < 0`` instead of ``r <= 0``;
  ``not-causal`` / ``causal``: the causal mask forgotten or added;
- RoPE's: the attention factor applied once or squared twice, YaRN's mscale
  missing, partial rotary over the whole head, the pairing swapped, the
  LongRoPE switch at the wrong length, float32 angles
  (`relpos_ref.golden.diagnose_rope`);
- xPos's: the pairing swapped, partial rotary over the whole head, the decay
  missing (plain RoPE) or inverted (queries scaled as keys, keys as queries).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import catalog
from .compare import to_numpy
from .decode import decode_variants
from .diagnose_rope import rope_variants, xpos_variants
from .diagnosis import MUCH_CLOSER, CaseDiagnosis, VariantResult, _ratio

__all__ = [
    "MUCH_CLOSER",
    "Call",
    "CaseDiagnosis",
    "VariantResult",
    "case_call",
    "diagnose",
    "diagnose_case",
    "variants",
]

#: Schemes whose tables are laid out by relative distance (reversing them flips the sign).
_RELATIVE_TABLES = ("shaw", "bias", "music", "general", "grid2d", "t5", "swin", "deberta")
#: Schemes whose tables go through ``clip(r, -K, K) + K``.
_CLIPPED = ("shaw", "bias")
#: Schemes with an additive bias after scaling, and with a position term inside it.
_BIASED = ("bias", "t5", "alibi", "swin")
_POSITIONED = ("absolute", "shaw", "music", "general", "grid2d")


@dataclass(frozen=True)
class Call:
    """One call of a scheme's public function: tables by name, the mask and keywords.

    With `bias` (a dense ``(..., t_q, t_k)`` array), the call is plain
    `relpos_ref.attention.attention` with that bias instead, for a mistake no
    argument of the scheme's function can express. With `decode` (a decode
    case's plan, `relpos_ref.golden.decode.decode_plan`), it is run as those
    calls, each on its rows and cache, their outputs concatenated.
    """

    q: Any
    k: Any
    v: Any
    tables: dict[str, Any]
    mask: Any
    kwargs: dict[str, Any]
    bias: Any = None
    decode: tuple[Any, ...] | None = None

    def replace(self, **changes: Any) -> Call:
        """This call with some fields changed."""
        return dataclasses.replace(self, **changes)


def _row_axis(table: catalog.Table) -> int:
    return -1 if table.width is None else -2


def _with_tables(call: Call, change: Callable[[catalog.Table, np.ndarray], np.ndarray],
                 entry: catalog.Scheme) -> Call:
    tables = {t.name: change(t, call.tables[t.name]) for t in entry.tables
              if t.name in call.tables}
    return call.replace(tables={**call.tables, **tables})


def variants(scheme: str, call: Call, params: Mapping[str, Any]) -> Iterator[tuple[str, Call]]:
    """The planted-mistake calls that apply to a case, as ``(name, call)``.

    Examples
    --------
    >>> import numpy as np
    >>> from relpos_ref.golden import Case
    >>> case = Case.make("bias", "x", t_q=3, t_k=5, K=2, q_offset=1)
    >>> x = case.inputs()
    >>> call = Call(x["q"], x["k"], x["v"], {"table": x["table"]}, None,
    ...             {"scale": case.parameters["scale"], "q_offset": 1})
    >>> [name for name, _ in variants("bias", call, case.parameters)][:4]
    ['table-reversed', 'clip-at-K-1', 'clip-at-K+1', 'start-aligned']
    """
    entry = catalog.get(scheme)
    kwargs = call.kwargs
    scale = float(kwargs["scale"])
    past = kwargs.get("max_past")  # asymmetric clipping: rows for r = -P .. K
    if scheme in _RELATIVE_TABLES:
        reversed_call = _with_tables(
            call, lambda t, a: np.flip(a, axis=_row_axis(t)).copy(), entry)
        if past is not None:  # reversed rows run from -K to P: the extents trade places
            reversed_call = reversed_call.replace(
                kwargs={**kwargs, "max_past": params["K"]})
        yield "table-reversed", reversed_call
    if scheme == "t5" and kwargs.get("bidirectional"):
        yield "t5-halves-swapped", _with_tables(call, lambda t, a: _halves_swapped(a), entry)
    if scheme == "t5" and not kwargs.get("bidirectional", True):
        yield "t5-causal-sign-flipped", _t5_flipped(call, params)
    if scheme == "alibi":
        slopes = _slopes(kwargs, params["h"])
        yield "alibi-sign-flipped", call.replace(kwargs={**kwargs, "slopes": -slopes})
    if scheme in _CLIPPED and params["K"] >= 2 and (past is None or past >= 1):
        early = _with_tables(
            call, lambda t, a: np.take(a, np.arange(1, a.shape[_row_axis(t)] - 1),
                                       axis=_row_axis(t)), entry)
        if past is not None:
            early = early.replace(kwargs={**early.kwargs, "max_past": past - 1})
        yield "clip-at-K-1", early
    if scheme in _CLIPPED and kwargs.get("beyond", "clip") == "clip":
        late = _with_tables(call, lambda t, a: _zero_ends(a, _row_axis(t)), entry)
        if past is not None:
            late = late.replace(kwargs={**late.kwargs, "max_past": past + 1})
        yield "clip-at-K+1", late
    if call.decode is not None:
        yield from decode_variants(call)
    elif "q_offset" in kwargs:
        t_q, t_k = params["t_q"], params["t_k"]
        if kwargs["q_offset"] != 0:
            yield "start-aligned", call.replace(kwargs={**kwargs, "q_offset": 0})
        if kwargs["q_offset"] != t_k - t_q:
            yield "end-aligned", call.replace(kwargs={**kwargs, "q_offset": t_k - t_q})
        for step in (1, -1):
            shifted = kwargs["q_offset"] + step
            if shifted not in (0, t_k - t_q):
                yield f"q_offset{step:+d}", call.replace(kwargs={**kwargs, "q_offset": shifted})
    if scale != 1.0 and scheme in _BIASED:
        if scheme == "alibi":
            slopes = _slopes(kwargs, params["h"])
            yield "bias-scaled", call.replace(kwargs={**kwargs, "slopes": slopes * scale})
        else:
            yield "bias-scaled", _with_tables(call, lambda t, a: a * scale, entry)
    if scale != 1.0 and scheme in _POSITIONED:
        yield "position-unscaled", _with_tables(  # the key-side tables, not the values'
            call, lambda t, a: a / scale if t.width == "d" else a, entry)
    d = params["d"]
    if scale == 1.0:
        yield "scale-1/sqrt(d)", call.replace(kwargs={**kwargs, "scale": 1 / math.sqrt(d)})
    else:
        yield "scale-1", call.replace(kwargs={**kwargs, "scale": 1.0})
    if params.get("per_head") and call.tables:
        yield "shared-table", _with_tables(
            call, lambda t, a: np.broadcast_to(a[:1], a.shape).copy(), entry)
    if scheme == "rope":
        yield from rope_variants(call, params)
    if scheme == "xpos":
        yield from xpos_variants(call, params)
    if "causal" in kwargs:
        if kwargs["causal"]:
            yield "not-causal", call.replace(kwargs={**kwargs, "causal": False})
            yield "causal-strict", call.replace(mask=_strict(call, params))
        else:
            yield "causal", call.replace(kwargs={**kwargs, "causal": True})


def _t5_flipped(call: Call, params: Mapping[str, Any]) -> Call:
    """A causal T5 call whose buckets are of ``-r``: the decoder's ``context - memory``."""
    from ..positions import relative_positions
    from ..schemes.t5 import t5_bucket

    (table,) = call.tables.values()
    r = np.asarray(relative_positions(params["t_q"], params["t_k"],
                                      q_offset=call.kwargs["q_offset"], xp=np))
    bucket = np.asarray(t5_bucket(-r, num_buckets=table.shape[-1],
                                  max_distance=call.kwargs["max_distance"],
                                  bidirectional=False))
    return call.replace(bias=np.take(table, bucket, axis=-1))


def _zero_ends(table: np.ndarray, axis: int) -> np.ndarray:
    # the table with a zero row before the first and after the last
    width = [(0, 0)] * table.ndim
    width[axis] = (1, 1)
    return np.pad(table, width)


def _halves_swapped(table: np.ndarray) -> np.ndarray:
    """A bidirectional T5 table read with ``i - j`` for ``j - i``: bucket ``b`` of ``r != 0``
    is the other half's ``b ± n/2``; ``r = 0`` keeps bucket 0 either way."""
    half = table.shape[-1] // 2
    out = np.roll(table, half, axis=-1)
    out[..., 0] = table[..., 0]
    return out


def _slopes(kwargs: Mapping[str, Any], heads: int) -> np.ndarray:
    """ALiBi's slopes of the call: given, or the default geometric ones."""
    from ..schemes.alibi import alibi_slopes

    given = kwargs.get("slopes")
    if given is None:
        given = alibi_slopes(heads, rule=kwargs.get("slope_rule", "paper"))
    return np.asarray(given, dtype=np.float64)


def _strict(call: Call, params: Mapping[str, Any]) -> np.ndarray:
    """The case's mask without the pairs at distance 0 (with ``causal``: ``r < 0`` only)."""
    t_q, t_k = params["t_q"], params["t_k"]
    r = np.arange(t_k)[None, :] - (np.arange(t_q)[:, None] + call.kwargs["q_offset"])
    keep = r != 0
    return keep if call.mask is None else keep & call.mask


def _run(scheme: str, call: Call) -> np.ndarray:
    import relpos_ref

    from ..attention import attention

    if call.decode is not None:  # each call on its rows and cache, at its offset
        parts = []
        for step in call.decode:
            x = step.inputs({"q": call.q, "k": call.k, "v": call.v, "mask": call.mask,
                             "bias": call.bias})
            parts.append(_run(scheme, call.replace(
                q=x["q"], k=x["k"], v=x["v"], mask=x["mask"], bias=x["bias"],
                kwargs=step.kwargs(call.kwargs), decode=None)))
        return np.concatenate(parts, axis=-2)
    entry = catalog.get(scheme)
    with np.errstate(all="ignore"):
        if call.bias is not None:
            common = {k: call.kwargs[k] for k in ("scale", "causal", "q_offset")
                      if k in call.kwargs}
            out = attention(call.q, call.k, call.v, mask=call.mask, bias=call.bias, **common)
        else:
            function = getattr(relpos_ref, f"{scheme}_attention")
            out = function(call.q, call.k, call.v, *entry.table_args(call.tables),
                           mask=call.mask, **call.kwargs)
    return np.asarray(out, dtype=np.float64)


def case_call(case: Any) -> Call:
    """A loaded case's call, in float64 (a decode case's with its plan)."""
    inputs = {n: (a if a.dtype == bool else a.astype(np.float64))
              for n, a in case.inputs.items()}
    entry = catalog.get(case.scheme)
    plan = tuple(case.decode_calls()) if case.kind == "decode" else None
    return Call(inputs["q"], inputs["k"], inputs["v"],
                {t.name: inputs[t.name] for t in entry.tables if t.name in inputs},
                inputs.get("mask"), dict(case.kwargs), decode=plan)


def diagnose_case(case: Any, output: Any) -> CaseDiagnosis:
    """Try the known convention mistakes on a loaded case against an obtained `output`.

    Parameters
    ----------
    case : relpos_ref.golden.GoldenCase
        A loaded case (``Suite.load`` or the plugin's ``golden_case``).
    output : array
        The obtained ``output``: NumPy, torch, CuPy or JAX, of the output's shape.

    Returns
    -------
    CaseDiagnosis
        The obtained output's distance from the golden and from each variant,
        in units of the case's ``output`` tolerance, nearest variant first.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> import relpos_ref as rp
    >>> from relpos_ref import golden
    >>> out = tempfile.mkdtemp() + "/golden"
    >>> cases = golden.default_cases().select(["bias/clip/*"], dtypes=["float64"])
    >>> _ = golden.generate(out, cases)
    >>> case = golden.load_suite(out).load(cases[0].id)
    >>> x = case.inputs  # a kernel that reads the table backwards:
    >>> wrong = rp.bias_attention(x["q"], x["k"], x["v"], np.flip(x["table"], -1),
    ...                           **case.kwargs)
    >>> found = diagnose_case(case, wrong)
    >>> found.variants[0].name, found.variants[0].matches
    ('table-reversed', True)
    """
    obtained = to_numpy(output).astype(np.float64)
    golden = case.golden("output")
    if obtained.shape != golden.shape:
        msg = f"`output` must have shape {golden.shape}, got {obtained.shape}"
        raise ValueError(msg)
    atol = case.limit("output")
    _, golden_ratio = _ratio(obtained, golden, atol)
    diagnosis = CaseDiagnosis(case.id, golden_ratio)
    call = case_call(case)
    for name, planted in variants(case.scheme, call, case.params):
        try:
            want = _run(case.scheme, planted)
        except ValueError:  # a mistake this case cannot make (beyond="error" refuses it)
            continue
        worst, ratio = _ratio(obtained, want, atol)
        diagnosis.variants.append(VariantResult(name, worst, ratio))
    diagnosis.variants.sort(key=lambda v: v.ratio)
    return diagnosis


def diagnose(golden: str | os.PathLike[str], obtained: str | os.PathLike[str], *,
             select: Sequence[str] | None = None) -> list[CaseDiagnosis]:
    """`diagnose_case` for every case of a suite with a result file holding ``output``.

    The results are read as `relpos_ref.golden.check` reads them (one file
    per case, named like the suite's); cases without a file are left out, a
    file without ``output`` is an error (`relpos_ref.golden.SuiteError`).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import numpy as np
    >>> from relpos_ref import golden
    >>> from relpos_ref.golden.fileformat import dumps
    >>> root = Path(tempfile.mkdtemp())
    >>> cases = golden.default_cases().select(["alibi/*"], dtypes=["float32"])
    >>> _ = golden.generate(root / "golden", cases)
    >>> suite = golden.load_suite(root / "golden")
    >>> (root / "mine").mkdir()
    >>> for cid in suite.cases:  # "results" that are the goldens themselves
    ...     case = suite.load(cid)
    ...     output = case.expected["output"].astype(np.float32)
    ...     data = dumps({"output": output}, "safetensors")
    ...     _ = (root / "mine" / case.entry["file"]).write_bytes(data)
    >>> found = diagnose(root / "golden", root / "mine")
    >>> len(found) == len(suite.cases), all(d.matches_golden for d in found)
    (True, True)
    """
    from .paths import SuiteError
    from .results import read_result, result_files
    from .suite import load_suite

    suite = load_suite(golden)
    obtained = Path(obtained)
    if not obtained.is_dir():
        msg = f"{obtained} is not a directory of results (one file per case)"
        raise SuiteError(msg)
    files = result_files(obtained, suite)
    out = []
    for entry in suite.select(select):
        cid = entry["id"]
        if cid not in files:
            continue
        path = obtained / files[cid]
        arrays = read_result(path, entry)
        if "output" not in arrays:
            msg = f"{path} holds no `output`; diagnose compares outputs"
            raise SuiteError(msg)
        out.append(diagnose_case(suite.load(cid), arrays["output"]))
    if not out:
        msg = f"{obtained} holds no result file for a selected case of {suite.path}"
        raise SuiteError(msg)
    return out
