"""The prepared GPU run (`benchmarks/gpu_check.py`): what it writes and how it runs the tests.

Its measurements need a GPU; here its table and its test commands are
checked, so that a lent GPU's minutes are not spent on a run that cannot
report (the first run's test sections failed to start: pytest-benchmark's
warning under xdist is an error under ``filterwarnings = error``).
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from unittest import mock

import pytest

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_table_has_every_section(gpu_check):
    rows = [{"library": "torch", "dtype": "float16", "scheme": s, "seconds": 0.001 * (i + 1)}
            for i, s in enumerate(gpu_check.SCHEMES)]
    results = {
        "t": 16384, "heads": 8,
        "device": {"name": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "cupy": "14.2"},
        "benchmark": {"rows": rows, "baselines": [
            {"baseline": "sdpa", "dtype": "float16", "seconds": 0.00114, "ours_max_diff": 6e-5},
            {"baseline": "flex bias, exported score_mod (compiled)", "dtype": "float16",
             "error": "RuntimeError: no"}]},
        "backward": [{"scheme": "bias", "dtype": "float16", "kernel": "bias_attention_vjp_triton",
                      "seconds": 0.012, "ratio_to_forward": 1.9}],
        "blocked": [{"scheme": "plain", "dtype": "float16", "t": 262144, "seconds": 0.96,
                     "extra_bytes": 64 * 2**20}],
        "kernels": {"summary": ["54 passed in 40s"], "seconds": 41.0},
    }
    table = gpu_check._markdown(results)
    assert "on NVIDIA H200 (torch 2.11, triton 3.6, cupy 14.2), t = 16384" in table
    assert "| torch | float16 | 1.00 | 2.00 | 3.00 | 4.00 | 5.00 | 6.00 | 7.00 |" in table
    assert "| sdpa | float16 | 1.14 | 6e-05 |" in table
    assert "| flex bias, exported score_mod (compiled) | float16 | RuntimeError: no |" in table
    assert "VJP bias float16 (bias_attention_vjp_triton): 12.00 ms, 1.90x its forward" in table
    assert "blocked plain float16 t = 262144: 0.96 s, 64.0 MiB beyond inputs" in table
    assert "kernels: 54 passed in 40s (41 s)" in table


def test_its_test_runs_can_start_on_a_gpu_machine(gpu_check, tmp_path):
    done = subprocess.CompletedProcess([], 0, stdout="1 passed\n", stderr="")
    with mock.patch.object(gpu_check.subprocess, "run", return_value=done) as run:
        found = gpu_check._pytest(["tests/x.py"], {"A": "1"}, timeout=5, workers=6,
                                  log=tmp_path / "log")
    command = run.call_args.args[0]
    # without pytest-benchmark, whose warning under xdist stops the run under -W error
    assert command[command.index("-p", command.index("no:cacheprovider")) + 1] == "no:benchmark"
    assert command[-3:] == ["-n", "6", "tests/x.py"]
    assert run.call_args.kwargs["env"]["A"] == "1"
    assert found["summary"] == ["1 passed"] and (tmp_path / "log").read_text() == "1 passed\n"
    assert gpu_check.GPU_SHARED == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def test_the_masked_bias_call_makes_its_mask_once_and_masks(gpu_check, monkeypatch):
    # the calls on CPU torch tensors (the GPU run puts them on CUDA): the mask is boolean,
    # made on the first call only, and masks what the specification masks
    torch = pytest.importorskip("torch")
    import numpy as np

    import relpos_ref as rp

    made = []

    def cpu_arrays(library, dtype, heads, t, d, seed=0):
        rng = np.random.default_rng(seed)

        def put(a):
            made.append(a.shape)
            return torch.from_numpy(np.ascontiguousarray(a)).to(getattr(torch, dtype))

        return put, [put(rng.standard_normal((heads, t, d), dtype=np.float32))
                     for _ in range(3)]

    monkeypatch.setattr(gpu_check, "_arrays", cpu_arrays)
    calls = gpu_check._calls("torch", "float32", 2, 32, 8)
    first = calls["bias masked"]()
    assert calls["bias masked"]().equal(first) and made.count((32, 32)) == 1
    q, k, v, table = calls["_arrays"]()
    keep = torch.from_numpy(np.random.default_rng(2).random((32, 32), dtype=np.float32) >= 0.1)
    with rp.kernels.disabled():
        want = rp.bias_attention(q, k, v, table, mask=keep)
    assert not keep.all() and torch.allclose(first, want, atol=1e-6)


def test_the_tiles_section_times_each_call_with_and_without_the_bias_ends(gpu_check,
                                                                         monkeypatch):
    # the section on CPU torch tensors through Triton's interpreter, t = 32: every row timed
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    import numpy as np

    from relpos_ref.kernels import triton as kt

    def cpu_arrays(library, dtype, heads, t, d, seed=0):
        rng = np.random.default_rng(seed)

        def put(a):
            return torch.from_numpy(np.ascontiguousarray(a)).to(getattr(torch, dtype))

        return put, [put(rng.standard_normal((heads, t, d), dtype=np.float32))
                     for _ in range(3)]

    monkeypatch.setattr(gpu_check, "_arrays", cpu_arrays)
    monkeypatch.setattr(gpu_check, "_sync", lambda library: None)
    args = gpu_check.argparse.Namespace(heads=2, t=32, repeat=1)
    with kt.interpreted():
        rows = gpu_check.tiles(args)
    assert all("seconds" in r for r in rows), [r for r in rows if "seconds" not in r]
    ends = {(r["dtype"], r["scheme"], tuple(r["ends_itemsizes"]))
            for r in rows if "ends_itemsizes" in r}
    assert ends == {(dtype, scheme, widths) for dtype in ("float16", "float32")
                    for scheme in ("bias", "t5", "bias vjp") for widths in ((2, 4), ())}
