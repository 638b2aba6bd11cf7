"""The benchmark command runs end to end at toy sizes (it asserts structure, never timings)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from relpos_ref import catalog

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
                       "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "targets (issues 7, 14 and 16)" in printed and "vs plain" in printed
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
    assert {row["scheme"].split()[0] for row in report["backward"]} == schemes
    assert all(row["seconds"] > 0 and row["ratio_to_forward"] > 0 for row in report["backward"])
    assert "sdpa" not in report  # torch only


def test_benchmark_suite_on_torch_compares_with_sdpa(bench, tmp_path, capsys):
    pytest.importorskip("torch", reason="torch is not installed")
    code = bench.main(["--backend", "torch", "--t", "64", "--heads", "2", "--d", "8",
                       "--k-max", "4", "--repeat", "1", "--t-definition", "32",
                       "--t-blocked", "0", "--out", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "scaled_dot_product_attention" in printed and "for reference only" in printed
    (path,) = tmp_path.glob("*-torch-float32.json")
    report = json.loads(path.read_text())
    cases = {row["case"]: row for row in report["sdpa"]}
    assert set(cases) == {"plain", "bias (additive attn_mask)"}
    assert all(row["seconds"] > 0 and row["ratio_to_sdpa"] > 0 for row in cases.values())
    assert not any(target["applies"] for target in report["targets"])


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
