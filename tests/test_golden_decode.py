"""Decode cases (issue 29, item 9): a prefill, then one query at a time against a cache.

Each step of every default decode case equals the corresponding row of the
full causal call, on every backend; a decode case is checked when made,
stored without a cotangent, verified, selected by the plugin's marker; and
``diagnose`` names a decoder, written here as a loop over a growing cache,
that places its steps start-aligned or by a cache length one off.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import relpos_ref
from relpos_ref import catalog, golden
from relpos_ref.golden.decode import decode_plan
from relpos_ref.golden.diagnose import diagnose_case
from relpos_ref.golden.dtypes import numpy_dtype
from relpos_ref.golden.pipeline import call_keywords, golden_arrays

DECODE = [c for c in golden.default_cases() if c.kind == "decode"]
FLOAT64 = [c for c in DECODE if c.dtype == "float64"]


def test_every_scheme_that_decodes_has_a_decode_case():
    grids = {n for n in catalog.names() if catalog.get(n).grid is not None}
    assert grids == {"grid2d", "swin", "swinv2"}
    assert {c.scheme for c in FLOAT64} == set(catalog.names()) - grids
    assert len(DECODE) == 4 * len(FLOAT64) == 64
    xl = next(c for c in FLOAT64 if c.scheme == "transformer_xl").parameters
    assert xl["t_k"] - xl["t_q"] == xl["q_offset"] == 4  # a memory before the prefill
    assert any(c.parameters["masked"] for c in FLOAT64)


def _decode(function, arrays, plan, kwargs, tables):
    """The case's calls: each on its rows and cache, at its offset."""
    outs = []
    for call in plan:
        x = call.inputs(arrays)
        outs.append(function(x["q"], x["k"], x["v"], *tables, mask=x.get("mask"),
                             **call.kwargs(kwargs)))
    return outs


#: JAX compiles every operation for each step's new shapes (5 to 15 s a case here): it runs
#: a sample, as conftest's EXAMPLE_SHARE does for hypothesis; the others run every case.
SAMPLE = {"jax": ("alibi",)}


@pytest.mark.parametrize("case", FLOAT64, ids=lambda c: c.id)
def test_each_step_equals_the_row_of_the_full_causal_call(backend, case):
    sample = SAMPLE.get(backend.adapter.name)
    if sample is not None and case.scheme not in sample:
        pytest.skip(f"{backend.adapter.name} runs the sample {', '.join(sample)} (compile time)")
    p = case.parameters
    entry = case.entry
    inputs = case.inputs()
    arrays = {n: backend.asarray(a) for n, a in inputs.items()}
    tables = entry.table_args({t.name: arrays[t.name] for t in entry.tables if t.name in arrays})
    function = getattr(relpos_ref, f"{case.scheme}_attention")
    kwargs = call_keywords(entry, p)
    assert kwargs["causal"] is True and kwargs["q_offset"] == p["t_k"] - p["t_q"]
    plan = decode_plan(t_q=p["t_q"], t_k=p["t_k"], steps=p["steps"])
    assert [c.q_offset for c in plan[1:]] == [p["t_k"] - p["steps"] + s
                                              for s in range(p["steps"])]
    outs = [backend.to_numpy(o) for o in _decode(function, arrays, plan, kwargs, tables)]
    full = backend.to_numpy(function(arrays["q"], arrays["k"], arrays["v"], *tables,
                                     mask=arrays.get("mask"), **kwargs))
    for call, out in zip(plan, outs, strict=True):
        assert out.shape[-2] == call.rows.stop - call.rows.start
        np.testing.assert_allclose(out, full[..., call.rows, :], rtol=1e-12, atol=1e-13,
                                   err_msg=f"{case.id}: {call.name}")
    want = golden_arrays(case, inputs)["output"]
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(
    ("scheme", "params", "match"),
    [
        ("grid2d", {"steps": 1}, r"`steps` \(a decode case\) needs a scheme whose attention "
                                 r"takes `causal` and `q_offset`; 'grid2d' attends"),
        ("swin", {"steps": 1}, r"'swin' attends over a whole grid, got steps=1"),
        ("shaw", {"t_q": 4, "t_k": 4, "steps": 4}, r"`steps` must be an integer in 1 \.\. "
                                                   r"t_q - 1 = 3 .*, got 4"),
        ("shaw", {"t_q": 4, "t_k": 4, "steps": 0}, r"`steps` must be an integer .*got 0"),
        ("shaw", {"t_q": 4, "t_k": 4, "steps": True}, r"`steps` must be an integer .*got True"),
        ("bias", {"t_q": 4, "t_k": 4, "steps": 2, "causal": False},
         r"`causal` must be True in a decode case \(steps=2\), got False"),
        ("transformer_xl", {"t_q": 4, "t_k": 6, "steps": 2, "q_offset": 0},
         r"`q_offset` must be t_k - t_q = 2 in a decode case .*got 0"),
    ],
)
def test_a_decode_case_is_checked_when_made(scheme, params, match):
    with pytest.raises(ValueError, match=match):
        golden.Case.make(scheme, "decode", **params)


def test_a_decode_case_on_disk(tmp_path):
    cases = [c for c in DECODE if c.dtype == "bfloat16"][:3]
    out = tmp_path / "golden"
    golden.generate(out, cases)
    assert golden.verify(out).ok
    manifest = json.loads((out / "manifest.json").read_text())
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    jsonschema.validate(manifest, json.loads(golden.schema_path().read_text()))
    entry = manifest["cases"][0]
    assert entry["kind"] == "decode" and entry["params"]["steps"] == 3
    assert "-n3-" in entry["id"]
    roles = {n: a["role"] for n, a in entry["arrays"].items()}
    assert sorted(n for n, r in roles.items() if r != "input") == ["output", "weights"]
    case = golden.load_suite(out).load(entry["id"])
    assert case.kind == "decode" and case.gradient_names == []
    with pytest.raises(ValueError, match="is a decode case: it has no cotangent"):
        case.inputs_as("numpy", cotangent=True)
    # the weights: each call's row, padded with zeros past its cache
    w = case.expected["weights"]
    for call in case.decode_calls():
        assert not w[..., call.rows, call.keys:].any()
    # a manifest that calls it a forward case is refused on reading
    from _golden import write_manifest

    entry["kind"] = "forward"
    write_manifest(out, manifest)
    assert any("kind 'forward' is not the case's 'decode'" in p
               for p in golden.verify(out).problems)
    entry["kind"] = "encode"
    write_manifest(out, manifest)
    with pytest.raises(golden.SuiteError, match="unknown kind 'encode' \\(known: forward, "):
        golden.load_suite(out)


def test_the_marker_selects_decode_cases():
    from relpos_ref.pytest_plugin import _marked

    entries = [{"id": "a", "scheme": "t5", "dtype": "float32", "kind": "decode"},
               {"id": "b", "scheme": "t5", "dtype": "float32", "kind": "forward"},
               {"id": "c", "scheme": "t5", "dtype": "float32"}]  # a suite before decode
    keep, written = _marked(entries, pytest.mark.golden(kind="decode").mark)
    assert [e["id"] for e in keep] == ["a"] and written == "@pytest.mark.golden(kind='decode')"
    keep, _ = _marked(entries, pytest.mark.golden(kind=["forward"]).mark)
    assert [e["id"] for e in keep] == ["b", "c"]
    with pytest.raises(pytest.UsageError, match="unknown kind 'prefill' \\(known: forward"):
        _marked(entries, pytest.mark.golden(kind="prefill").mark)


# -- diagnose: a decoder with a cache, planted with each mistake --------------------------


def cache_decoder(case: golden.GoldenCase, bug: str | None) -> np.ndarray:
    """A decoder: the prefill in one call, then each token appended to a key/value cache
    and attended from a position; `bug` places that position wrongly."""
    x = {n: (a if a.dtype == bool else a.astype(np.float64)) for n, a in case.inputs.items()}
    p = case.params
    entry = catalog.get(case.scheme)
    tables = entry.table_args({t.name: x[t.name] for t in entry.tables if t.name in x})
    function = getattr(relpos_ref, f"{case.scheme}_attention")
    kwargs = dict(case.kwargs)
    mask = x.get("mask")
    memory, steps = p["t_k"] - p["t_q"], p["steps"]
    prefill = p["t_q"] - steps
    keys = [x["k"][..., j, :] for j in range(memory + prefill)]
    values = [x["v"][..., j, :] for j in range(memory + prefill)]
    outs = [function(x["q"][..., :prefill, :], x["k"][..., : memory + prefill, :],
                     x["v"][..., : memory + prefill, :], *tables,
                     mask=None if mask is None else mask[:prefill, : memory + prefill],
                     **{**kwargs, "q_offset": memory})]
    for i in range(prefill, p["t_q"]):
        before = len(keys)
        keys.append(x["k"][..., memory + i, :])
        values.append(x["v"][..., memory + i, :])
        position = {"decode-start-aligned": 0, "cache-length+1": len(keys),
                    "cache-length-1": before - 1}.get(bug, before)
        k, v = np.stack(keys, axis=-2), np.stack(values, axis=-2)
        outs.append(function(x["q"][..., i : i + 1, :], k, v, *tables,
                             mask=None if mask is None else mask[i : i + 1, : len(keys)],
                             **{**kwargs, "q_offset": position}))
    return np.concatenate(outs, axis=-2).astype(numpy_dtype(case.dtype))


BUGS = ["decode-start-aligned", "cache-length+1", "cache-length-1"]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out = tmp_path_factory.mktemp("decode") / "golden"
    golden.generate(out, [c for c in DECODE if c.dtype == "float32"])
    opened = golden.load_suite(out)
    return {cid.split("/")[0]: opened.load(cid) for cid in opened.cases}


def test_a_right_decoder_matches_every_golden(suite):
    assert len(suite) == len(FLOAT64) == 16
    for scheme, case in suite.items():
        found = diagnose_case(case, cache_decoder(case, None))
        assert found.matches_golden, (scheme, found.verdict)


@pytest.mark.parametrize("bug", BUGS)
@pytest.mark.parametrize("scheme", ["shaw", "t5", "rope", "transformer_xl", "deberta",
                                    "alibi", "music"])
def test_a_planted_decoder_mistake_is_named_alone(suite, scheme, bug):
    case = suite[scheme]
    found = diagnose_case(case, cache_decoder(case, bug))
    if scheme == "alibi" and bug == "cache-length+1":
        # the causal form m r: every key allowed either way, a shift of every bias by m,
        # which the softmax does not see
        assert found.matches_golden
        return
    assert not found.matches_golden, found.verdict
    assert [v.name for v in found.variants if v.matches] == [bug], list(found.lines())
