"""Gradient goldens: each case's ``d_output`` and its ``dq``, ``dk``, ``dv``, ``d_<table>``.

- every case of the default suite stores them, with the roles and shapes it should;
- they are the gradients PyTorch's autograd finds through the *forward*
  pass (``method="definition"``, float64): a derivation independent of the
  specified backward pass that computes them;
- the tolerance rule lets legitimate backward passes through (the specified
  VJP in the dtype under test; PyTorch autograd with every operation in
  float16 or bfloat16, the evidence behind ``m = 8``) and stops the backward
  pass's convention bugs by a wide margin;
- ``check(gradients=True)``, ``relpos-ref check --gradients``, the plugin's
  `GoldenCase` and `assert_matches` handle them; ``verify`` re-derives them.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from _golden import forge_arrays, make_suite, run_pytest, write_results

import relpos_ref
from relpos_ref import golden
from relpos_ref.golden import pipeline
from relpos_ref.golden.dtypes import numpy_dtype
from relpos_ref.testing import assert_matches


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """The whole default suite (every case, about a second to generate)."""
    out = tmp_path_factory.mktemp("gradients") / "golden"
    golden.generate(out, list(golden.default_cases()))
    return golden.load_suite(out)


def _cases(suite, dtypes=None):
    """The suite's forward cases (a decode case holds no cotangent and no gradients)."""
    for cid in suite.cases:
        case = suite.load(cid, rederive=False)
        if case.kind == "forward" and (dtypes is None or case.dtype in dtypes):
            yield case


def _case_of(case: golden.GoldenCase) -> golden.Case:
    e = case.entry
    return golden.Case.make(e["scheme"], e["variant"], dtype=e["dtype"], seed=e["seed"],
                            **e["params"])


def _within(case: golden.GoldenCase, grads: dict[str, Any]) -> list[str]:
    """Names of the gradients in `grads` that miss their tolerance."""
    return [r.summary() for r in case.compare(grads) if not r.passed]


# -- what is stored ----------------------------------------------------------------------


def test_every_case_stores_its_cotangent_and_every_gradient(suite):
    decode = [suite.load(c, rederive=False) for c, e in suite.cases.items()
              if e["kind"] == "decode"]
    assert len(decode) == 64 and not any(c.gradient_names for c in decode)
    with pytest.raises(ValueError, match=r"is a decode case: it has no cotangent `d_output`"):
        _ = decode[0].d_output
    for case in _cases(suite):
        tables = [n for n, info in case.entry["arrays"].items()
                  if info["role"] == "input" and n not in ("q", "k", "v", "mask")]
        want = ["dq", "dk", "dv", *(f"d_{t}" for t in tables)]
        # parameters that are not inputs but have a gradient: ALiBi's slopes, KERPLE's r1, r2
        want += {"alibi": ["d_slopes"], "kerple": ["d_r1", "d_r2"],
                 "fire": ["d_c", "d_L"]}.get(case.scheme, [])
        assert sorted(case.gradient_names) == sorted(want), case.id
        assert case.entry["arrays"]["d_output"]["role"] == "cotangent"
        assert case.d_output.dtype == numpy_dtype(case.dtype)
        assert case.d_output.shape == case.expected["output"].shape
        for name in want:
            argument = {"dq": "q", "dk": "k", "dv": "v"}.get(name, name[2:])
            if argument not in ("slopes", "r1", "r2", "c", "L"):
                assert case.expected[name].shape == case.inputs[argument].shape, (case.id, name)
            assert case.expected[name].dtype == np.float64
            assert np.isfinite(case.expected[name]).all(), (case.id, name)
        assert "d_output" not in case.inputs  # `my_kernel(**case.inputs)` stays a forward call


def test_the_cotangent_is_drawn_after_the_inputs_from_the_seed():
    case = golden.Case.make("bias", "clip", h=2, t_q=3, t_k=4, K=1, masked=True, seed=7)
    rng = np.random.Generator(np.random.PCG64(7))
    for shape in case.input_shapes().values():
        rng.standard_normal(shape)
    rng.random((3, 4))  # the mask
    want = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    np.testing.assert_array_equal(case.d_output(), want)
    # drawing it does not move the inputs
    again = golden.Case.make("bias", "clip", h=2, t_q=3, t_k=4, K=1, masked=True, seed=7)
    assert all(np.array_equal(a, again.inputs()[n]) for n, a in case.inputs().items())


# -- the goldens are right ------------------------------------------------------------------


def test_gradient_goldens_equal_autograd_through_the_forward_definition(suite):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    for case in _cases(suite, dtypes=("float32", "float64")):
        made = _case_of(case)
        leaves = {n: torch.tensor(a.astype(np.float64), requires_grad=True)
                  for n, a in case.inputs.items() if n != "mask"}
        arrays = dict(leaves)
        if "mask" in case.inputs:
            arrays["mask"] = torch.tensor(case.inputs["mask"])
        output, _ = pipeline.attention_of(made, arrays, method="definition")
        d_output = torch.tensor(case.d_output.astype(np.float64))
        (output * d_output).sum().backward()
        grads = {}
        for name, leaf in leaves.items():
            want = case.expected[pipeline.gradient_name(name)]
            got = leaf.grad.numpy() if leaf.grad is not None else np.zeros_like(want)
            top = max(float(np.abs(want).max()), 1.0)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * top,
                                       err_msg=f"{case.id} {name}")
            grads[pipeline.gradient_name(name)] = got
        if case.dtype == "float64":  # another float64 backward (autograd's order) passes
            assert not _within(case, grads), case.id


def test_the_specified_backward_passes_in_every_dtype(suite):
    # The public *_attention_vjp (kernels included where they apply) in the dtype under
    # test; NumPy has no bfloat16 arithmetic, so bfloat16 runs as computes_in_float32 does
    # elsewhere: the stored inputs widened to float32, the gradients rounded back.
    for case in _cases(suite):
        made = _case_of(case)
        entry = made.entry
        p = made.parameters
        inputs, d_output = case.inputs, case.d_output
        if case.dtype == "bfloat16":
            inputs = {n: a if a.dtype == bool else a.astype(np.float32) for n, a in inputs.items()}
            d_output = d_output.astype(np.float32)
        vjp = relpos_ref.attention_vjp if entry.name == "plain" else getattr(
            relpos_ref, f"{entry.name}_attention_vjp")
        accepts = inspect.signature(vjp).parameters
        kwargs = {"d_output": d_output, "scale": p["scale"], "mask": inputs.get("mask"),
                  **entry.options_from(p)}
        kwargs.update({n: p[n] for n in ("causal", "q_offset") if n in accepts})
        tables = {t.name: inputs[t.name] for t in entry.tables if t.name in inputs}
        grads = vjp(inputs["q"], inputs["k"], inputs["v"], *entry.table_args(tables), **kwargs)
        dtype = numpy_dtype(case.dtype)
        named = {pipeline.gradient_name(n): np.asarray(g).astype(dtype) for n, g in grads.items()}
        assert sorted(named) == sorted(case.gradient_names), case.id
        assert not _within(case, named), case.id


def _native_16_bit_gradients(torch: Any, case: golden.GoldenCase) -> dict[str, Any]:
    """PyTorch autograd through the forward specification with every operation in 16 bits."""
    from relpos_ref import backends

    made = _case_of(case)
    entry = made.entry
    p = made.parameters
    adapter = backends.get("torch")
    arrays = {n: adapter.from_numpy(a) for n, a in case.inputs.items()}
    leaves = {n: x.requires_grad_(True) for n, x in arrays.items() if n != "mask"}
    forward = inspect.unwrap(entry.attention)  # without computes_in_float32's widening
    accepts = inspect.signature(forward).parameters
    kwargs = {"scale": p["scale"], "mask": arrays.get("mask"), **entry.options_from(p)}
    kwargs.update({n: p[n] for n in ("causal", "q_offset") if n in accepts})
    tables = {t.name: arrays[t.name] for t in entry.tables if t.name in arrays}
    out = forward(arrays["q"], arrays["k"], arrays["v"], *entry.table_args(tables), **kwargs)
    assert out.dtype == arrays["q"].dtype  # computed in 16 bits
    out.backward(adapter.from_numpy(case.d_output))
    return {pipeline.gradient_name(n): x.grad for n, x in leaves.items()}


def test_a_native_16_bit_backward_passes_with_room_to_spare(suite):
    # The evidence behind m = 8 (relpos_ref.golden.tolerance): every operation rounded to
    # 16 bits, as a straightforward 16-bit autograd does, lands within half the tolerance.
    torch = pytest.importorskip("torch", reason="torch is not installed")
    worst = 0.0
    for case in _cases(suite, dtypes=("float16", "bfloat16")):
        if case.scheme == "cope":  # see test_cope_s_position_gradient_jumps_in_16_bits
            continue
        grads = _native_16_bit_gradients(torch, case)
        for r in case.compare(grads):
            worst = max(worst, r.max_error / r.atol if r.atol else 0.0)
    assert worst <= 0.56, worst  # Swin v2's bfloat16 dk: 0.551 (relpos_ref.golden.tolerance)


def test_cope_s_position_gradient_jumps_in_16_bits(suite):
    # CoPE's term is continuous in the position p, its derivative (q.e[ceil p] - q.e[floor p])
    # is not: it jumps at every integer, and is 0 there. A gate that rounds to 1 in 16 bits
    # (sigma(x) for x > 6 in bfloat16) puts positions on integers, where the float64 golden
    # has them just below: the position's gradient, and dq and dk with it, change. So a
    # backward pass with every operation in 16 bits is outside the tolerance (12.7 times it
    # on masked-bidirectional's bfloat16 dq); the specification, in float32 for 16-bit
    # inputs, passes (test_the_specified_backward_passes_in_every_dtype).
    torch = pytest.importorskip("torch", reason="torch is not installed")
    worst = {}
    for case in _cases(suite, dtypes=("float16", "bfloat16")):
        if case.scheme == "cope":
            for r in case.compare(_native_16_bit_gradients(torch, case)):
                worst[r.name] = max(worst.get(r.name, 0.0), r.max_error / r.atol)
    assert worst["dv"] < 0.5 and worst["d_table"] < 0.5, worst  # no position gradient there
    assert max(worst["dq"], worst["dk"]) > 1.0, worst


# -- convention bugs in a backward pass fail --------------------------------------------------


def _row_axis(case):  # Shaw's tables hold rows (2K + 1, d); the bias table scalars
    return -2 if case.scheme == "shaw" else -1


def _rows_reversed(case, name):  # table order (or the distance's sign) flipped
    return {name: np.flip(case.expected[name], axis=_row_axis(case)).copy()}


def _clipped_one_early(case, name):  # the scatter clips at K - 1: the end rows land inside
    axis = _row_axis(case)
    g = np.moveaxis(case.expected[name].copy(), axis, -1)
    g[..., 1] += g[..., 0]
    g[..., -2] += g[..., -1]
    g[..., 0] = g[..., -1] = 0.0
    return {name: np.moveaxis(g, -1, axis)}


def _unscaled(case, name):  # dq and dk without the logits' scale
    return {name: case.expected[name] / case.scale}


def _no_row_sum(case, name):  # the softmax backward without its row sum: w * dw
    w, v, d_out = case.expected["weights"], case.inputs["v"], case.d_output
    k = case.inputs["k"].astype(np.float64)
    dw = d_out.astype(np.float64) @ np.swapaxes(v.astype(np.float64), -1, -2)
    inner = np.sum(w * dw, axis=-1, keepdims=True)
    return {name: case.expected[name] + case.scale * (w * inner) @ k}


def _weights_not_transposed(case, name):  # dv = w dO instead of w^T dO (t_q == t_k)
    return {name: case.expected["weights"] @ case.d_output.astype(np.float64)}


PLANTED = {
    "table-order-reversed": (_rows_reversed, ("shaw/clip/*", "bias/clip/*"),
                             {"shaw": "d_key_table", "bias": "d_table"}),
    "clipped-at-K-minus-1": (_clipped_one_early, ("shaw/clip/*", "bias/clip/*"),
                             {"shaw": "d_key_table", "bias": "d_table"}),
    "scale-left-out": (_unscaled, ("shaw/clip/*", "deberta/cross-offset/*"),
                       {"shaw": "dq", "deberta": "dk"}),
    "softmax-without-row-sum": (_no_row_sum, ("bias/clip/*", "alibi/symmetric/*"),
                                {"bias": "dq", "alibi": "dq"}),
    "weights-not-transposed": (_weights_not_transposed, ("bias/zero-causal/*", "swin/masked/*"),
                               {"bias": "dv", "swin": "dv"}),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_convention_bug_in_the_backward_pass_fails_by_far(suite, bug):
    plant, patterns, names = PLANTED[bug]
    cases = suite.select(list(patterns))
    assert {e["dtype"] for e in cases} == {"float64", "float32", "float16", "bfloat16"}
    for entry in cases:
        case = suite.load(entry["id"], rederive=False)
        name = names[case.scheme]
        (result,) = case.compare(plant(case, name))
        assert not result.passed, (bug, case.id)
        assert result.max_error >= 10 * result.atol, (bug, case.id, result.summary())


# -- the tools -------------------------------------------------------------------------------


@pytest.fixture
def small(tmp_path):
    return make_suite(tmp_path / "golden")


def _right(case: golden.GoldenCase, *, with_gradients: bool) -> dict[str, np.ndarray]:
    names = ["output", *(case.gradient_names if with_gradients else ())]
    dtype = numpy_dtype(case.dtype)
    return {n: case.expected[n].astype(dtype) for n in names}


def test_check_requires_the_gradients_only_when_asked(small, tmp_path):
    forward_only = write_results(tmp_path / "fwd", small,
                                 lambda c: _right(c, with_gradients=False))
    assert golden.check(small, forward_only).ok
    report = golden.check(small, forward_only, gradients=True)
    assert not report.ok
    (cid, lacking), *_ = report.incomplete.items()
    assert lacking == golden.load_suite(small).load(cid).gradient_names
    assert "dq: MISSING" in "\n".join(report.lines())
    both = write_results(tmp_path / "both", small, lambda c: _right(c, with_gradients=True))
    assert golden.check(small, both, gradients=True).ok


def test_check_compares_the_gradients_a_file_holds(small, tmp_path):
    def wrong_dk(case):
        arrays = _right(case, with_gradients=True)
        arrays["dk"] = -arrays["dk"]
        return arrays

    report = golden.check(small, write_results(tmp_path / "bad", small, wrong_dk))
    assert not report.ok
    failing = {name for rs in report.results.values() for r in rs if not r.passed
               for name in [r.name]}
    assert failing == {"dk"}


def test_the_cli_check_takes_gradients(small, tmp_path):
    forward_only = write_results(tmp_path / "fwd", small,
                                 lambda c: _right(c, with_gradients=False))
    cli = [sys.executable, "-m", "relpos_ref", "check", str(small), str(forward_only)]
    assert subprocess.run(cli, capture_output=True, text=True).returncode == 0
    run = subprocess.run([*cli, "--gradients"], capture_output=True, text=True)
    assert run.returncode == 1
    assert "dq: MISSING" in run.stdout


def test_assert_matches_takes_gradients_and_requires_what_it_is_told(small):
    opened = golden.load_suite(small)
    case = opened.load(next(iter(opened.cases)))
    grads = _right(case, with_gradients=True)
    assert_matches(case, grads, require=("output", *case.gradient_names))
    with pytest.raises(AssertionError, match="lacks 'dk'"):
        assert_matches(case, {n: a for n, a in grads.items() if n != "dk"},
                       require=("output", *case.gradient_names))
    grads["d_key_table"] = grads["d_key_table"][..., ::-1, :].copy()
    with pytest.raises(AssertionError, match="d_key_table: MISMATCH"):
        assert_matches(case, grads)


def test_a_cotangent_result_must_be_in_the_case_dtype(small, tmp_path):
    opened = golden.load_suite(small)
    case = opened.load(next(iter(opened.cases)))
    with pytest.raises(golden.ObtainedError, match="`d_output` is an input stored in float32"):
        case.compare({"d_output": case.d_output.astype(np.float64)})


@pytest.mark.parametrize(
    ("array", "change", "text"),
    [
        ("d_output", lambda a: a * 2, "input `d_output` differs from its regeneration"),
        ("dq", lambda a: a + 1e-9, "`dq` differs from its recomputation"),
        ("d_value_table", lambda a: a[::-1].copy(), "`d_value_table` differs"),
    ],
)
def test_verify_reports_a_forged_gradient_or_cotangent(small, array, change, text):
    forge_arrays(small, 0, lambda arrays: arrays.__setitem__(array, change(arrays[array])))
    problems = golden.verify(small).problems
    assert any(text in p for p in problems), problems


def test_gradient_tolerances_have_their_ulp_floor(suite):
    from relpos_ref.golden.dtypes import ulp

    wider = {"bfloat16": 8.0, "float16": 8.0, "float64": 64.0, "float32": 2.0}
    for case in _cases(suite):
        for name, info in case.entry["arrays"].items():
            if info["role"] != "golden":
                continue
            tol = info["tolerance"]
            m = wider[case.dtype] if pipeline.is_gradient(name) else 2.0
            assert tol["ulp_floor"] == m * ulp(tol["max_abs_golden"], case.dtype), (case.id, name)


def test_the_plugin_hands_a_backward_test_its_cotangent(small, tmp_path):
    # a consumer project's backward test: right gradients pass, one flipped sign fails
    project = tmp_path / "consumer"
    project.mkdir()
    (project / "test_backward.py").write_text(textwrap.dedent("""
        import numpy as np
        from relpos_ref.golden.dtypes import numpy_dtype
        from relpos_ref.testing import assert_matches

        def _mine(case, flip):
            dtype = numpy_dtype(case.dtype)
            out = {n: case.expected[n].astype(dtype) for n in ("output", *case.gradient_names)}
            assert case.d_output.shape == out["output"].shape
            if flip:
                out["dv"] = -out["dv"]
            return out

        def test_right(golden_case):
            assert_matches(golden_case, _mine(golden_case, False),
                           require=("output", *golden_case.gradient_names))

        def test_flipped(golden_case):
            assert_matches(golden_case, _mine(golden_case, True))
    """))
    run = run_pytest(project, f"--golden-dir={small}")
    assert run.returncode == 1, run.stdout
    assert "4 failed, 4 passed" in run.stdout
    assert "dv: MISMATCH" in run.stdout
