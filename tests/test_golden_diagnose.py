"""``relpos-ref diagnose`` and the plugin's diagnosis line, on planted bugs of each kind.

The buggy implementations here are loops written from the papers with one
convention mistake switched on, independent of how `relpos_ref.golden.diagnose`
builds its variants; each must be named, and only the right output may match
the golden.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _golden import write_results

from relpos_ref import golden
from relpos_ref.cli import main
from relpos_ref.golden.diagnose import diagnose_case
from relpos_ref.golden.dtypes import numpy_dtype
from relpos_ref.schemes.t5 import t5_bucket
from relpos_ref.testing import assert_matches

CASES = [
    golden.Case.make("bias", "diagnose", h=2, t_q=6, t_k=9, d=8, K=3, causal=True, q_offset=2,
                     per_head=True),
    golden.Case.make("shaw", "diagnose", h=2, t_q=5, t_k=8, d=8, K=3),
    # asymmetric clipping: rows for r = -4 .. 2
    golden.Case.make("shaw", "diagnose-asymmetric", h=2, t_q=6, t_k=9, d=8, K=2, P=4,
                     q_offset=1),
    golden.Case.make("t5", "diagnose", h=2, t_q=6, t_k=12, d=8, buckets=8, max_distance=8),
    # a causal decoder's T5, scaled (issue 26): the decoder's sign swapped is named
    golden.Case.make("t5", "diagnose-causal", h=2, t_q=4, t_k=10, d=8, buckets=8,
                     max_distance=8, bidirectional=False, causal=True, q_offset=6, scale=0.5),
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("diagnose") / "golden"
    golden.generate(out, CASES)
    return out


def _softmax_rows(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    out = np.zeros_like(logits)
    if allowed.any():
        x = np.where(allowed, logits, -np.inf)
        e = np.exp(x - x[allowed].max())
        out = np.where(allowed, e, 0.0) / e[allowed].sum()
    return out


def loop_attention(case: golden.GoldenCase, bug: str | None) -> np.ndarray:
    """Attention written as loops, with one of the field's mistakes when `bug` names it."""
    a = {n: (x if x.dtype == bool else x.astype(np.float64)) for n, x in case.inputs.items()}
    p = case.params
    scale, K = case.scale, p.get("K")
    P = K if p.get("P") is None else p["P"]  # the past's extent: rows for r = -P .. K
    q_offset = {"end-aligned": p["t_k"] - p["t_q"], "start-aligned": 0,
                "q_offset+1": p["q_offset"] + 1, "q_offset-1": p["q_offset"] - 1,
                }.get(bug, p["q_offset"])
    b, h, t_q, d = a["q"].shape
    t_k = a["k"].shape[2]
    out = np.zeros((b, h, t_q, d))
    for n in range(b):
        for head in range(h):
            def table_of(name, head=head):
                t = a[name]
                if t.ndim == (3 if case.scheme == "shaw" else 2):  # per head
                    return t[0] if bug == "shared-table" else t[head]
                return t

            for i in range(t_q):
                logits, allowed, rows = np.zeros(t_k), np.zeros(t_k, bool), []
                for j in range(t_k):
                    r = j - (i + q_offset)
                    seen = -r if bug == "table-reversed" else r
                    logit = scale * a["q"][n, head, i] @ a["k"][n, head, j]
                    if case.scheme in ("bias", "shaw"):
                        step = {"clip-at-K-1": -1, "clip-at-K+1": 1}.get(bug, 0)
                        row = int(np.clip(seen, -(P + step), K + step)) + P

                        def entry(name, row=row):  # rows a table of 2K + 1 lacks read 0
                            t = table_of(name)
                            return t[row] if 0 <= row < len(t) else np.zeros_like(t[0])
                    if case.scheme == "bias":
                        bias = entry("table")
                        logit += scale * bias if bug == "bias-scaled" else bias
                    elif case.scheme == "shaw":
                        logit += scale * a["q"][n, head, i] @ entry("key_table")
                        rows.append(entry("value_table"))
                    else:  # t5: HF's bucket of memory - context; i - j by mistake
                        flipped = bug in ("t5-halves-swapped", "t5-causal-sign-flipped")
                        bucket = int(t5_bucket(np.asarray(-r if flipped else r),
                                               bidirectional=p["bidirectional"],
                                               num_buckets=p["buckets"],
                                               max_distance=p["max_distance"]))
                        bias = table_of("table")[bucket]
                        logit += scale * bias if bug == "bias-scaled" else bias
                    logits[j] = logit
                    allowed[j] = not p["causal"] or (r < 0 if bug == "causal-strict" else r <= 0)
                w = _softmax_rows(logits, allowed)
                out[n, head, i] = w @ a["v"][n, head]
                if rows:
                    out[n, head, i] += w @ np.stack(rows)
    return out.astype(numpy_dtype(case.dtype))


BUGS = {
    "bias": ["table-reversed", "clip-at-K-1", "clip-at-K+1", "end-aligned", "bias-scaled",
             "shared-table", "causal-strict", "q_offset-1"],
    "shaw": ["table-reversed", "clip-at-K-1", "clip-at-K+1", "end-aligned", "q_offset+1"],
    "shaw/diagnose-asymmetric": ["table-reversed", "clip-at-K-1", "clip-at-K+1",
                                 "start-aligned", "end-aligned", "q_offset+1"],
    "t5": ["t5-halves-swapped", "end-aligned", "q_offset+1"],
    "t5/diagnose-causal": ["t5-causal-sign-flipped", "start-aligned", "q_offset-1",
                           "q_offset+1", "bias-scaled"],
}


def _load(suite, scheme):
    # "shaw" is shaw/diagnose/...; "shaw/diagnose-asymmetric" names its variant
    prefix = f"{scheme}/" if "/" in scheme else f"{scheme}/diagnose/"
    opened = golden.load_suite(suite)
    return opened.load(next(c for c in opened.cases if c.startswith(prefix)))


@pytest.mark.parametrize(("scheme", "bug"), [(s, b) for s, bugs in BUGS.items() for b in bugs])
def test_a_planted_bug_is_named(suite, scheme, bug):
    case = _load(suite, scheme)
    found = diagnose_case(case, loop_attention(case, bug))
    assert not found.matches_golden
    matched = [v.name for v in found.variants if v.matches]
    assert matched == [bug], found.verdict
    assert found.variants[0].name == bug and found.variants[1].ratio > 100, list(found.lines())
    assert f"matches {bug}" in found.verdict


@pytest.mark.parametrize("scheme", sorted(BUGS))
def test_a_right_output_matches_the_golden(suite, scheme):
    case = _load(suite, scheme)
    found = diagnose_case(case, loop_attention(case, None))
    assert found.matches_golden and found.verdict.endswith("x the tolerance)")
    assert list(found.lines()) == [found.verdict]


def test_the_cli_diagnoses_a_directory_of_results(suite, tmp_path, capsys):
    bugs = {"bias": "bias-scaled", "shaw": None, "t5": "t5-halves-swapped"}
    mine = write_results(tmp_path / "mine", suite,
                         lambda c: {"output": loop_attention(
                             c, bugs[c.scheme] if c.entry["variant"] != "diagnose-causal"
                             else "t5-causal-sign-flipped")})
    assert main(["diagnose", str(suite), str(mine)]) == 1
    out = capsys.readouterr().out
    assert "matches bias-scaled" in out and "matches t5-halves-swapped" in out
    assert "matches t5-causal-sign-flipped" in out
    assert "shaw/" not in out  # only the mismatching cases, unless --all (issue 26)
    assert out.rstrip().endswith("2 of 5 case(s) match their golden")  # both Shaw cases
    assert main(["diagnose", str(suite), str(mine), "--all"]) == 1
    out = capsys.readouterr().out
    assert "shaw/diagnose/" in out and "matches the golden" in out
    assert main(["diagnose", str(suite), str(mine), "--json", "--select", "t5/diagnose/*"]) == 1
    (t5,) = json.loads(capsys.readouterr().out)
    assert t5["matches_golden"] is False
    assert t5["variants"][0] == {**t5["variants"][0], "name": "t5-halves-swapped",
                                 "matches": True}


def test_the_cli_says_what_it_cannot_diagnose(suite, tmp_path, capsys):
    assert main(["diagnose", str(suite), str(tmp_path / "absent")]) == 2
    assert "is not a directory of results" in capsys.readouterr().err
    empty = write_results(tmp_path / "weights", suite, lambda c: {"weights": c.expected["weights"]})
    assert main(["diagnose", str(suite), str(empty)]) == 2
    assert "holds no `output`; diagnose compares outputs" in capsys.readouterr().err


def test_assert_matches_names_the_mistake(suite):
    case = _load(suite, "bias")
    with pytest.raises(AssertionError, match=r"diagnosis: the output matches the mistake "
                                             r"clip-at-K-1"):
        assert_matches(case, {"output": loop_attention(case, "clip-at-K-1")})
    with pytest.raises(AssertionError, match=r"diagnosis: no known convention mistake matches"):
        assert_matches(case, {"output": loop_attention(case, None)[..., ::-1].copy()})


def test_every_variant_of_the_default_suite_is_told_apart(tmp_path):
    # Each variant's own output, fed back, matches that variant (and not the golden, unless
    # the mistake changes nothing for the case: a single token, a decode step).
    from relpos_ref.golden.diagnose import _run, case_call, variants

    out = tmp_path / "suite"
    golden.generate(out, golden.default_cases().select(dtypes=["float32"]))
    opened = golden.load_suite(out)
    tried = 0
    for cid in opened.cases:
        case = opened.load(cid, rederive=False)
        call = case_call(case)  # a decode case's with its plan
        for name, planted in variants(case.scheme, call, case.params):
            try:
                wrong = _run(case.scheme, planted).astype(np.float32)
            except ValueError:
                continue  # beyond="error" refuses the mistake
            found = diagnose_case(case, wrong)
            if found.matches_golden:
                continue
            tried += 1
            assert name in [v.name for v in found.variants if v.matches], (cid, name)
    assert tried > 150
