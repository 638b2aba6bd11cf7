"""The benchmark command runs end to end at toy sizes (it asserts structure, never timings)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import relpos_ref as rp
from relpos_ref import backends, catalog

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    """benchmarks/run.py, loaded once as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_suite_runs_and_writes_its_json(bench, tmp_path, capsys):
    code = bench.main(["--t", "64", "--heads", "2", "--d", "8", "--k-max", "4", "--repeat", "1",
                       "--t-definition", "32", "--t-blocked", "256", "--block-size", "64",
                       "--t-unblocked", "128", "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "targets (issues 7, 14, 16, 28 and 30)" in printed and "vs plain" in printed
    assert "RoPE's scalings against plain RoPE" in printed
    assert "throughput >= 50% of unblocked t=128" in printed
    assert "backward pass (the public VJP)" in printed
    (path,) = tmp_path.glob("*-numpy-float32.json")
    report = json.loads(path.read_text())
    schemes = {row["scheme"].split()[0] for row in report["schemes"]}
    assert schemes == {"plain", *catalog.names()}
    assert all(row["seconds"] > 0 and row["peak_bytes"] > 0 for row in report["schemes"])
    assert all(row["definition_peak_bytes"] > row["efficient_peak_bytes"]
               for row in report["methods"])
    assert report["machine"]["backend"] == "numpy" and report["versions"]["numpy"]
    assert {t["target"].split()[0] for t in report["targets"]} >= {"general", "shaw", "blocked"}
    variants = {row["variant"] for row in report["rope"]}
    assert variants == {"linear", "dynamic", "yarn", "yarn-deepseek", "longrope", "llama3",
                        "proportional", "float32-angles", "mrope", "mrope-interleaved",
                        "axial-2d", "mixed", "tail"}
    assert all(row["ratio_to_rope"] > 0 for row in report["rope"])
    assert sum(t["target"].endswith("<= 1.1x plain rope") for t in report["targets"]) == 12
    assert {row["scheme"].split()[0] for row in report["backward"]} == schemes
    assert all(row["seconds"] > 0 and row["ratio_to_forward"] > 0 for row in report["backward"])
    assert "sdpa" not in report and "torch_bounds" not in report  # torch only
    blocked = {(row["scheme"], row["causal"]): row for row in report["blocked"]}
    assert set(blocked) == {("plain", False), ("plain", True), ("bias", False),
                            ("alibi", True), ("shaw", True)}
    assert all(row["kernel"] for row in blocked.values())  # NumPy's blocked kernels
    assert blocked["plain", False]["throughput_to_unblocked"] > 0
    assert report["unblocked"]["t"] == 128 and report["unblocked"]["seconds"] > 0
    peer = report["peer"]  # torch is installed with the test extra
    assert peer["seconds"] > 0 and peer["our_seconds"] > 0 and peer["ratio_to_our_shaw"] > 0
    assert peer["max_abs_difference"] < 1e-5  # it computes what our Shaw call computes


def test_benchmark_suite_on_torch_compares_with_sdpa(bench, tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch", reason="torch is not installed")
    blocked_calls = []
    dispatched = rp.blocked_attention

    def counted(*args, **kwargs):
        blocked_calls.append(kwargs["scheme"])
        return dispatched(*args, **kwargs)

    monkeypatch.setattr(rp, "blocked_attention", counted)
    # glibc's settings stay as they are in this test process (mallopt has no undo)
    monkeypatch.setattr(bench._sibling("torch_bounds"), "steady_allocator", lambda: "as is")
    # FlexAttention eager (its unfused path, quick to start; the suite compiles by default)
    # three schemes: the NumPy run above times every one; this checks torch's own sections
    code = bench.main(["--backend", "torch", "--t", "64", "--heads", "2", "--d", "8",
                       "--k-max", "4", "--repeat", "1", "--t-definition", "32",
                       "--t-blocked", "256", "--t-unblocked", "0", "--block-size", "64",
                       "--flex", "eager", "--schemes", "bias,shaw,deberta",
                       "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    listed = ", ".join(sorted(rp.kernels.blocked_kernels("torch")))
    assert f"kernels for torch: {listed})" in printed
    assert "scaled_dot_product_attention" in printed and "for reference only" in printed
    (path,) = tmp_path.glob("*-torch-float32.json")
    report = json.loads(path.read_text())
    # every timed scheme has a torch block kernel (Shaw's value table included)
    assert {row["scheme"] for row in report["blocked"] if row["kernel"]} == {
        "plain", "bias", "alibi", "shaw"}
    assert report["unblocked"] is None
    # each case timed after a warm-up (torch on the CPU reports no peak: no third call)
    assert blocked_calls == [s for s in ("plain", "plain", "bias", "alibi", "shaw")
                             for _ in range(2)]
    cases = {row["case"]: row for row in report["sdpa"]}
    assert set(cases) == {"plain", "bias, (1, h, t, t) attn_mask"}
    assert all(row["seconds"] > 0 and row["ratio_to_sdpa"] > 0 for row in cases.values())
    assert not any(target["applies"] for target in report["targets"])
    bounds = report["torch_bounds"]  # issue 30's bounds: every scheme, forward and VJP
    assert {row["scheme"].split()[0] for row in bounds["schemes"]} == {
        "plain", "bias", "shaw", "deberta"}
    assert {row["scheme"] for row in bounds["schemes"]} == {
        row["scheme"] for row in report["schemes"]}
    for row in bounds["schemes"]:
        assert row["seconds"] > 0 and row["sdpa_bias_seconds"] > 0 and row["vjp_seconds"] > 0
        assert row["sdpa_autograd_seconds"] > 0 and row["vjp_to_sdpa_autograd"] > 0
    assert set(bounds["reference"]) == {"plain", "bias"} and bounds["allocator"] == "as is"
    assert all(r["vjp_to_forward"] > 0 for r in bounds["reference"].values())
    assert bounds["products"]["seconds"] > 0 and bounds["products"]["to_forward"] > 0
    names = {t["target"] for t in report["targets"]}
    assert {f"{row['scheme'].split()[0]} forward <= 2x SDPA with a (1, h, t, t) bias"
            for row in bounds["schemes"]} <= names
    assert "issue 30's bounds on torch" in printed and "torch's own VJP / forward" in printed
    assert "a VJP's five products of the grid's size alone" in printed
    flex = report["flex"]
    assert "error" not in flex, flex
    assert flex["case"] == "bias (FlexAttention score_mod, eager)" and "ours/Flex" in printed
    assert flex["seconds"] > 0 and flex["flex_seconds"] > 0 and flex["ratio_to_flex"] > 0
    assert flex["max_abs_difference"] < 1e-5  # the same bias, looked up the same way
    export = {row["scheme"]: row for row in report["flex_export"]}
    assert set(export) == {"bias", "t5", "alibi"} and "exp/hand" in printed
    for row in export.values():
        assert "error" not in row, row
        assert row["seconds"] > 0 and row["hand_written_seconds"] > 0 and row["sdpa_seconds"] > 0
        assert row["within_10_percent"] == (row["ratio_to_hand_written"] <= 1.1)
        assert row["max_abs_difference"] < 1e-5 and row["max_abs_difference_sdpa"] < 1e-5
    assert {t["target"] for t in report["targets"]} >= {
        f"flex export {s} <= 1.1x hand-written score_mod" for s in export}


def test_sdpa_gets_the_bias_as_a_mask_of_four_axes(bench, monkeypatch):
    # with three, (h, t, t), torch's SDPA took a slow path on the CPU (3 to 4x plain)
    torch = pytest.importorskip("torch", reason="torch is not installed")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    masks = []

    def spy(*args, attn_mask=None, **kwargs):
        masks.append(None if attn_mask is None else tuple(attn_mask.shape))
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = _torch_inputs(3, 16, 4)
    rows = bench.sdpa_comparison(backends.get("torch"), q, k, v, _torch_table(3, 5), 2)
    assert [row["case"] for row in rows] == ["plain", "bias, (1, h, t, t) attn_mask"]
    assert set(masks) == {None, (1, 3, 16, 16)}


def test_torch_bounds_time_sdpa_with_the_mask_and_its_gradient(bench, monkeypatch):
    # the forward's baseline gets the (1, h, t, t) mask; the VJP's differentiates it too
    torch = pytest.importorskip("torch", reason="torch is not installed")
    bounds = bench._sibling("torch_bounds")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    seen = []

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append((None if attn_mask is None else tuple(attn_mask.shape),
                     attn_mask is not None and attn_mask.requires_grad, q.requires_grad))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(bounds, "steady_allocator", lambda: "as is")
    q, k, v = _torch_inputs(3, 16, 4)
    cases = bench.scheme_cases(lambda *s: torch.randn(*s), 3, 16, 4, 2,
                               schemes=("bias",))
    mask = rp.bias_logits(_torch_table(3, 5), 16, 16)[None]
    result = bounds.torch_bounds(bench._timed_against, backends.get("torch"), cases, q, k, v,
                                 torch.ones_like(q), mask, 2)
    assert {(None, False, False), (None, False, True), ((1, 3, 16, 16), False, False),
            ((1, 3, 16, 16), True, True)} <= set(seen)
    assert [row["scheme"].split()[0] for row in result["schemes"]] == ["plain", "bias"]
    met = {text: ok for text, _, ok in bounds.bound_targets(
        {"schemes": [{"scheme": "x K1", "ratio_to_sdpa_bias": 2.5, "vjp_to_sdpa_autograd": 0.9},
                     {"scheme": "y", "ratio_to_sdpa_bias": 1.5}]})}
    assert met == {"x forward <= 2x SDPA with a (1, h, t, t) bias": False,
                   "x VJP <= torch autograd through SDPA with the bias": True,
                   "y forward <= 2x SDPA with a (1, h, t, t) bias": True}


def test_the_peer_is_interleaved_with_our_shaw_call_and_computes_the_same(bench, monkeypatch):
    pytest.importorskip("torch", reason="torch is not installed")
    order = []
    peer, shaw = bench.bert_relative_key, rp.shaw_attention

    def spy(name, function):
        return lambda *args, **kwargs: order.append(name) or function(*args, **kwargs)

    monkeypatch.setattr(bench, "bert_relative_key", spy("peer", peer))
    monkeypatch.setattr(rp, "shaw_attention", spy("ours", shaw))
    row = bench.peer_comparison(backends.get("numpy"), "cpu", 2, 16, 4, "float32", 3, 4)
    assert row["max_abs_difference"] < 1e-6 and row["ratio_to_our_shaw"] > 0
    timed = order[2:]  # after the comparison of the outputs: warm-ups, then 4 pairs
    assert len(timed) == 10 and all(set(timed[i:i + 2]) == {"peer", "ours"}
                                    for i in range(0, 10, 2))
    assert timed[2:4] == ["peer", "ours"] and timed[4:6] == ["ours", "peer"]


def test_flex_score_mod_reads_the_bias_table_as_bias_attention_does(bench):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 3, n, 8, generator=gen, dtype=torch.float64) for n in (5, 9, 9))
    table = torch.randn(3, 2 * 2 + 1, generator=gen, dtype=torch.float64)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # eager FlexAttention
        got = flex.flex_attention(q, k, v, score_mod=bench.flex_bias_mod(table, 2))
    want = rp.bias_attention(q, k, v, table)
    assert torch.allclose(got, want, atol=1e-12)
    # a table reversed is another bias: the comparison would see it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        wrong = flex.flex_attention(q, k, v, score_mod=bench.flex_bias_mod(table.flip(-1), 2))
    assert not torch.allclose(wrong, want, atol=1e-6)


def test_flex_off_and_a_failing_flex_are_reported_not_raised(bench, tmp_path, capsys):
    pytest.importorskip("torch", reason="torch is not installed")
    args = ["--backend", "torch", "--t", "32", "--heads", "1", "--d", "4", "--k-max", "2",
            "--repeat", "1", "--t-definition", "0", "--t-blocked", "0", "--no-backward"]
    assert bench.main([*args, "--flex", "off", "--out", str(tmp_path / "off")]) == 0
    (path,) = (tmp_path / "off").glob("*.json")
    assert "flex" not in json.loads(path.read_text())
    capsys.readouterr()
    # a table one head short: FlexAttention fails inside; the row says why, the suite goes on
    row = bench.flex_comparison(backends.get("torch"), *(_torch_inputs(2, 16, 4)),
                                _torch_table(1, 5), 2, 1, "eager")
    assert row["error"].startswith(("IndexError", "RuntimeError")), row


def test_hand_written_score_mods_are_the_schemes_bias(bench):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    import warnings

    q, k, v = _torch_inputs(3, 12, 4)
    tables = {"bias": _torch_table(3, 5), "t5": _torch_table(3, 8),
              "alibi": torch.tensor(rp.alibi_slopes(3))}
    mods = bench.hand_written_mods(tables, 12, 2)
    with rp.kernels.disabled():
        want = {"bias": rp.bias_attention(q, k, v, tables["bias"]),
                "t5": rp.t5_attention(q, k, v, tables["t5"]),
                "alibi": rp.alibi_attention(q, k, v, slopes=tables["alibi"])}
    for scheme, mod in mods.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # eager FlexAttention
            got = flex.flex_attention(q, k, v, score_mod=mod, scale=1.0 if scheme == "t5" else None)
        torch.testing.assert_close(got, want[scheme], rtol=1e-5, atol=1e-6)
    # a failing export is reported in its row
    rows = bench.flex_export_comparison(backends.get("torch"), q, k, v,
                                        {**tables, "bias": _torch_table(1, 4)}, 2, 1, "eager")
    assert rows[0]["error"].startswith("ValueError: `table`"), rows[0]
    assert all("error" not in row for row in rows[1:])


def _torch_inputs(heads, t, d):
    import torch

    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, heads, t, d, generator=gen) for _ in range(3))


def _torch_table(heads, rows):
    import torch

    return torch.randn(heads, rows, generator=torch.Generator().manual_seed(1))


def test_benchmark_suite_refuses_an_unknown_device(bench, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "gpu7"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "`device` must be one of ['cpu'] for backend 'numpy', got 'gpu7'" in err


def test_benchmark_suite_distributed_section(bench, tmp_path, capsys):
    """``--t-distributed`` on a LocalCluster at toy sizes: time, worker peaks, bound, rows."""
    pytest.importorskip("dask.array", reason="dask[array] is not installed")
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    code = bench.main(["--distributed-only", "--t-distributed", "512", "--chunk", "128",
                       "--block-size", "32", "--d", "8", "--k-max", "4", "--workers", "1",
                       "--worker-memory", "512MiB", "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "dask.distributed LocalCluster" in printed and "targets (issue 17)" in printed
    (path,) = tmp_path.glob("*-distributed-float32.json")
    report = json.loads(path.read_text())
    rows = report["distributed"]
    assert [(r["scheme"], r["causal"]) for r in rows] == [("plain", False), ("shaw", True)]
    for row in rows:
        assert "error" not in row and row["workers_lost"] == 0 and row["seconds"] > 0
        assert row["max_abs_error"] < 1e-5 and len(row["checked_rows"]) >= 3
        assert row["bound_bytes"] > 0 and len(row["worker_peak_bytes"]) == 1
    assert report["versions"]["dask"] and report["versions"]["distributed"]
    assert {t["target"].split()[0] for t in report["targets"]} == {"distributed"}


def test_a_zero_length_skips_its_section_and_a_negative_one_is_refused(bench, tmp_path, capsys):
    code = bench.main(["--t", "32", "--heads", "1", "--d", "4", "--k-max", "2", "--repeat", "1",
                       "--t-definition", "0", "--t-blocked", "0", "--no-backward",
                       "--out", str(tmp_path)])
    assert code == 0
    assert "efficient vs definition" not in capsys.readouterr().out
    (path,) = tmp_path.glob("*.json")
    assert json.loads(path.read_text())["methods"] == []
    with pytest.raises(SystemExit):
        bench.main(["--t-definition", "-1", "--out", str(tmp_path)])
    assert "--t-definition: must be >= 0, got -1" in capsys.readouterr().err


def test_schemes_limits_the_tables_to_the_named_schemes_and_plain(bench, tmp_path, capsys):
    code = bench.main(["--t", "32", "--heads", "2", "--d", "4", "--k-max", "2", "--repeat", "1",
                       "--t-definition", "32", "--t-blocked", "0", "--schemes", "kerple,shaw",
                       "--out", str(tmp_path)])
    assert code == 0
    assert "RoPE's scalings" not in capsys.readouterr().out  # rope not named
    (path,) = tmp_path.glob("*.json")
    report = json.loads(path.read_text())
    for table in ("schemes", "backward"):
        assert {row["scheme"].split()[0] for row in report[table]} == {"plain", "kerple", "shaw"}
    assert {row["scheme"].split()[0] for row in report["methods"]} == {"shaw"}  # has methods
    assert report["rope"] == []
    targets = {t["target"].split()[0] for t in report["targets"]}
    assert "shaw" in targets and "general" not in targets
    with pytest.raises(SystemExit):
        bench.main(["--schemes", "kerple,fire-typo", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "--schemes" in err and "'fire-typo' not in the catalog" in err


def test_steady_allocator_sets_glibc_in_its_own_process():
    # run apart: mallopt's settings last for the process
    import platform
    import subprocess
    import sys

    path = str(ROOT / "benchmarks" / "torch_bounds.py")
    code = ("import importlib.util as u, sys; s = u.spec_from_file_location('b', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.steady_allocator())")
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                          check=True)
    if platform.libc_ver()[0] == "glibc":
        assert done.stdout.strip() == ("glibc: trim threshold and top pad 1 GiB, "
                                       "mmap threshold 32 MiB")
    else:
        assert done.stdout.startswith("default")
