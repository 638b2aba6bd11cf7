"""The GPU run: one prepared command that proves and measures the Triton kernels on a GPU.

Run ``python benchmarks/gpu_check.py --out DIR`` on a machine with one CUDA
GPU (torch, triton; CuPy where installed). In order, each section written to
``DIR/gpu_check.json`` as soon as it ends (so a run stopped by its time limit
keeps what it measured):

1. ``device``: the GPU and the library versions;
2. ``benchmark``: at ``--t`` queries and keys (16384), ``--heads`` heads (8),
   ``d = 64``, the dispatched ``*_attention`` (the Triton kernel) on torch and
   CuPy for plain, bias, T5, ALiBi, RoPE, Shaw keys+values and DeBERTa in
   float32, float16 and bfloat16, against torch's SDPA, SDPA with the bias
   materialized as a ``(1, h, t, t)`` mask, FlexAttention (compiled) with a
   hand-written bias ``score_mod`` and with the one `relpos_ref.flex` exports,
   and the array-API specification on CuPy (plain and
   bias, float32); the largest difference of each against its reference;
3. ``backward``: the VJPs of plain, bias, ALiBi and RoPE (the fused backward
   kernels) against their forward passes, float16 and float32;
4. ``tiles``: bias (with and without a mask), Shaw and DeBERTa under other tiles,
   warps and pipeline stages, to choose the defaults
   (`relpos_ref.kernels._triton_tiling.TILES`), and the bias's VJP under
   other tiles of the backward kernels
   (`relpos_ref.kernels._triton_tiling.BACKWARD_TILES`); bias, T5 and the bias's VJP
   with the tiles past a bias's ends reading one entry per query, and without
   (`relpos_ref.kernels._triton_launch.ENDS_ITEMSIZES`);
5. ``blocked``: `relpos_ref.blocked_attention` at ``--t-blocked`` (262144),
   one head, time and the GPU memory it takes beyond its inputs;
6. ``kernels``: the Triton kernels' proofs (``tests/test_kernels_triton.py``,
   ``tests/test_lowering.py``) compiled on the GPU;
7. ``suite``: the backend-parametrized tests of the specification and the
   kernels with ``RELPOS_BACKENDS=cupy,torch``, for what is left of
   ``--budget`` seconds.

It also writes ``DIR/gpu_check.md``, the table for ``benchmarks/RESULTS.md``,
and the whole output of each test run (``kernels.log``, ``suite.log``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCHEMES = ("plain", "bias", "t5", "alibi", "rope", "shaw", "deberta")
LABELS = {"shaw": "shaw K+V"}
#: Test workers share one GPU: JAX must not take 75 % of its memory at start.
GPU_SHARED = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
SUITE = ["tests/test_attention.py", "tests/test_schemes.py", "tests/test_kernels_torch.py",
         "tests/test_blocked.py", "tests/test_fresh_arrays.py", "tests/test_gradients.py",
         "tests/test_layouts.py", "tests/test_positions.py", "tests/test_numerics.py"]


def _sync(library: str) -> None:
    if library == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()
    else:
        import torch

        torch.cuda.synchronize()


def _timed(library: str, fn: Callable[[], Any], repeat: int) -> float:
    fn()  # compilation, caches
    _sync(library)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        _sync(library)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _arrays(library: str, dtype: str, heads: int, t: int, d: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    data = [rng.standard_normal((heads, t, d), dtype=np.float32) for _ in range(3)]

    def put(a):
        if library == "cupy":
            import cupy

            return cupy.asarray(a).astype(dtype)
        import torch

        return torch.from_numpy(np.ascontiguousarray(a)).cuda().to(getattr(torch, dtype))

    return put, [put(a) for a in data]


def _calls(library: str, dtype: str, heads: int, t: int, d: int) -> dict[str, Callable]:
    import relpos_ref as rp

    put, (q, k, v) = _arrays(library, dtype, heads, t, d)
    rng = np.random.default_rng(1)
    k_max = 16
    bias_table = put(rng.standard_normal((heads, 2 * k_max + 1), dtype=np.float32))
    t5_table = put(rng.standard_normal((heads, 32), dtype=np.float32))
    shaw_k = put(rng.standard_normal((2 * k_max + 1, d), dtype=np.float32) / 8)
    shaw_v = put(rng.standard_normal((2 * k_max + 1, d), dtype=np.float32))
    span = t // 4
    c2p = put(rng.standard_normal((heads, 2 * span, d), dtype=np.float32) / 8)
    p2c = put(rng.standard_normal((heads, 2 * span, d), dtype=np.float32) / 8)
    d_output = put(rng.standard_normal((heads, t, d), dtype=np.float32))
    made = {}

    def bias_masked():
        # a (t, t) mask, one pair in ten masked, made on first use (the tiles section's)
        if "mask" not in made:
            noise = np.random.default_rng(2).random((t, t), dtype=np.float32)
            made["mask"] = put(noise) >= 0.1
        return rp.bias_attention(q, k, v, bias_table, mask=made["mask"])

    return {
        "plain": lambda: rp.attention(q, k, v),
        "bias": lambda: rp.bias_attention(q, k, v, bias_table),
        "t5": lambda: rp.t5_attention(q, k, v, t5_table),
        "alibi": lambda: rp.alibi_attention(q, k, v),
        "rope": lambda: rp.rope_attention(q, k, v),
        "shaw": lambda: rp.shaw_attention(q, k, v, shaw_k, shaw_v),
        "deberta": lambda: rp.deberta_attention(q, k, v, c2p, p2c, max_position=t // 2),
        "bias masked": bias_masked,
        "_arrays": lambda: (q, k, v, bias_table),
        "plain vjp": lambda: rp.attention_vjp(q, k, v, d_output=d_output),
        "bias vjp": lambda: rp.bias_attention_vjp(q, k, v, bias_table, d_output=d_output),
        "alibi vjp": lambda: rp.alibi_attention_vjp(q, k, v, d_output=d_output),
        "rope vjp": lambda: rp.rope_attention_vjp(q, k, v, d_output=d_output),
    }


def _torch_baselines(dtype: str, heads: int, t: int, d: int, k_max: int, calls, repeat: int):
    import torch
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v, table = calls["_arrays"]()
    q4, k4, v4 = (x[None] for x in (q, k, v))
    rows = []
    plain = calls["plain"]()
    reference = sdpa(q4, k4, v4)[0]
    rows.append({"baseline": "sdpa", "dtype": dtype,
                 "seconds": _timed("torch", lambda: sdpa(q4, k4, v4), repeat),
                 "ours_max_diff": float((plain.float() - reference.float()).abs().max())})
    r = torch.arange(t, device="cuda")[None, :] - torch.arange(t, device="cuda")[:, None]
    index = r.clamp(-k_max, k_max) + k_max
    mask = table[:, index][None].to(q.dtype)  # (1, h, t, t)
    del r, index
    ours = calls["bias"]()
    with_bias = sdpa(q4, k4, v4, attn_mask=mask)[0]
    rows.append({"baseline": "sdpa+bias (1,h,t,t)", "dtype": dtype,
                 "seconds": _timed("torch", lambda: sdpa(q4, k4, v4, attn_mask=mask), repeat),
                 "ours_max_diff": float((ours.float() - with_bias.float()).abs().max())})
    mask = None  # 4 to 8 GB
    try:
        from torch.nn.attention.flex_attention import flex_attention

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + table[h, (kv_idx - q_idx).clamp(-k_max, k_max) + k_max]

        flex = torch.compile(flex_attention)
        out = flex(q4, k4, v4, score_mod=score_mod)[0]
        rows.append({"baseline": "flex bias (compiled)", "dtype": dtype,
                     "seconds": _timed("torch", lambda: flex(q4, k4, v4, score_mod=score_mod),
                                       repeat),
                     "ours_max_diff": float((ours.float() - out.float()).abs().max())})
    except Exception as exc:  # recorded, not raised: FlexAttention varies by version
        rows.append({"baseline": "flex bias (compiled)", "dtype": dtype,
                     "error": f"{type(exc).__name__}: {exc}"[:300]})
    try:  # the exported score_mod (relpos_ref.flex), read from the distance form
        from torch.nn.attention.flex_attention import flex_attention

        from relpos_ref.flex import flex_attention_args

        exported = flex_attention_args("bias", q, k, v, table)
        flex = torch.compile(flex_attention)
        out = flex(exported.q, exported.k, exported.v, **exported.kwargs)
        rows.append({"baseline": "flex bias, exported score_mod (compiled)", "dtype": dtype,
                     "seconds": _timed("torch", lambda: flex(exported.q, exported.k, exported.v,
                                                             **exported.kwargs), repeat),
                     "ours_max_diff": float((ours.float() - exported.output(out).float())
                                            .abs().max())})
    except Exception as exc:
        rows.append({"baseline": "flex bias, exported score_mod (compiled)", "dtype": dtype,
                     "error": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def backward(args) -> list[dict[str, Any]]:
    """Each VJP of the bias family on torch CUDA against its forward (issue 27's 2.5x)."""
    from relpos_ref import kernels

    found = []
    for dtype in ("float16", "float32"):
        calls = _calls("torch", dtype, args.heads, args.t, 64)
        q = calls["_arrays"]()[0]
        for scheme in ("plain", "bias", "alibi", "rope"):
            row = {"scheme": scheme, "dtype": dtype,
                   "kernel": getattr(kernels.kernel_for(scheme, (q,), vjp=True), "__name__",
                                     "specification")}
            try:
                row["forward"] = _timed("torch", calls[scheme], args.repeat)
                row["seconds"] = _timed("torch", calls[f"{scheme} vjp"], args.repeat)
                row["ratio_to_forward"] = row["seconds"] / row["forward"]
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            found.append(row)
            print(row, flush=True)
        del calls
    return found


def benchmark(args) -> dict[str, Any]:
    import relpos_ref as rp

    rows, baselines = [], []
    libraries = ["torch"] + (["cupy"] if _has_cupy() else [])
    for library in libraries:
        for dtype in ("float32", "float16", "bfloat16"):
            if library == "cupy" and dtype == "bfloat16":
                continue  # CuPy has no bfloat16
            calls = _calls(library, dtype, args.heads, args.t, 64)
            for scheme in SCHEMES:
                start = time.perf_counter()
                try:
                    seconds = _timed(library, calls[scheme], args.repeat)
                    rows.append({"library": library, "dtype": dtype, "scheme": scheme,
                                 "seconds": seconds,
                                 "first_call": time.perf_counter() - start - seconds * args.repeat,
                                 "kernel": _kernel_name(scheme, calls)})
                except Exception as exc:
                    rows.append({"library": library, "dtype": dtype, "scheme": scheme,
                                 "error": f"{type(exc).__name__}: {exc}"[:300]})
                print(rows[-1], flush=True)
            if library == "torch":
                baselines += _torch_baselines(dtype, args.heads, args.t, 64, 16, calls,
                                              args.repeat)
                print(baselines[-4:], flush=True)
            if library == "cupy" and dtype == "float32":
                with rp.kernels.disabled():
                    for scheme in ("plain", "bias"):
                        baselines.append({"baseline": f"specification {scheme} (cupy)",
                                          "dtype": dtype, "seconds": _timed(
                                              library, calls[scheme], max(2, args.repeat // 2))})
            del calls
    return {"rows": rows, "baselines": baselines}


def _kernel_name(scheme: str, calls) -> str:
    from relpos_ref import kernels

    q = calls["_arrays"]()[0]
    found = kernels.kernel_for(scheme, (q,))
    return getattr(found, "__name__", "specification")


def _has_cupy() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _timed_row(row: dict[str, Any], call: Callable[[], Any], repeat: int) -> dict[str, Any]:
    # the row with the call's median time on torch, or the error that stopped it; printed
    try:
        row["seconds"] = _timed("torch", call, repeat)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
    print(row, flush=True)
    return row


def tiles(args) -> list[dict[str, Any]]:
    from unittest import mock

    from relpos_ref.kernels import _triton_launch, _triton_tiling
    from relpos_ref.kernels import triton as kt

    found = []
    grid = {("float16", "bias"): [(64, 64, 4, s) for s in (2, 3, 4)] + [(128, 64, 8, 3)],
            # the 16-bit window variants: their defaults (`_triton_tiling.TILES`: the largest
            # tiles whose builds spill nothing; Shaw's 32 queries do not use wgmma) against
            # 64 x 64 and 8 warps (Shaw spilled 40 to 56 bytes there, DeBERTa 0 to 8, triton 3.9), 4
            # warps, and the tiles of 32 the H200 chose while triton 3.6 could not pipeline 64
            ("float16", "shaw"): [(32, 64, 8, 3), (64, 64, 8, 3), (64, 64, 4, 3), (64, 64, 8, 2),
                                  (32, 32, 4, 3), (64, 32, 8, 3)],
            ("float16", "deberta"): [(64, 32, 8, 3), (64, 64, 8, 3), (64, 64, 4, 3),
                                     (32, 32, 4, 3)],
            ("float32", "bias"): [(128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3)],
            ("float32", "shaw"): [(32, 16, 8, 3), (32, 32, 4, 3), (64, 32, 4, 2)],
            # masked: float32's build at 128 x 64 and three stages exceeds an H100's shared
            # memory (`python -m relpos_ref.kernels._triton_variants`)
            ("float16", "bias masked"): [(64, 64, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3),
                                         (32, 32, 4, 3)],
            ("float32", "bias masked"): [(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3)]}
    for dtype in ("float16", "float32"):
        calls = _calls("torch", dtype, args.heads, args.t, 64)
        for (kind, scheme), configs in grid.items():
            if kind != dtype:
                continue
            for bm, bn, warps, stages in configs:
                tile = dict.fromkeys(_triton_tiling.TILES, (bm, bn, warps))
                row = {"dtype": dtype, "scheme": scheme, "tile": [bm, bn], "warps": warps,
                       "stages": stages, "precision": kt.PRECISION}
                with mock.patch.dict(_triton_tiling.TILES, tile), \
                        mock.patch.object(_triton_launch, "STAGES", stages):
                    found.append(_timed_row(row, calls[scheme], args.repeat))
        # the backward kernels' tiles (`_triton_tiling.BACKWARD_TILES`: the largest whose builds
        # spill nothing) against 64 x 64 for both kernels (dQ spilled up to 240 bytes in 16-bit,
        # dK/dV 1.3 to 1.7 KB in float32) and the tiles of the tutorial's FlashAttention-2
        backward = {"float16": [((64, 32), (32, 64), 8), ((64, 64), (64, 64), 8),
                                ((128, 32), (32, 128), 8)],
                    "float32": [((16, 64), (16, 32), 8), ((64, 64), (64, 64), 8),
                                ((32, 32), (32, 32), 4)]}
        for choice in backward[dtype]:
            row = {"dtype": dtype, "scheme": "bias vjp", "backward_tiles": choice,
                   "precision": kt.PRECISION}
            with mock.patch.dict(_triton_tiling.BACKWARD_TILES,
                                 dict.fromkeys(_triton_tiling.BACKWARD_TILES, choice)):
                found.append(_timed_row(row, calls["bias vjp"], args.repeat))
        # tiles wholly past a bias's ends read one entry per query (`ENDS_ITEMSIZES`, 16-bit
        # by default): each call with that path on for every width, and off
        for scheme in ("bias", "t5", "bias vjp"):
            for ends in (frozenset({2, 4}), frozenset()):
                row = {"dtype": dtype, "scheme": scheme, "ends_itemsizes": sorted(ends),
                       "precision": kt.PRECISION}
                with mock.patch.object(_triton_launch, "ENDS_ITEMSIZES", ends):
                    found.append(_timed_row(row, calls[scheme], args.repeat))
        del calls
    return found


def blocked(args) -> list[dict[str, Any]]:
    import torch

    import relpos_ref as rp

    found = []
    for dtype in ("float16", "float32"):
        for scheme in ("plain", "bias"):
            put, (q, k, v) = _arrays("torch", dtype, 1, args.t_blocked, 64)
            tables = [put(np.linspace(-1, 1, 33, dtype=np.float32)[None])] \
                if scheme == "bias" else []
            # the kernel built first: a short call of the same variant, so the time is the run's
            rp.blocked_attention(q[:, :1024], k[:, :1024], v[:, :1024], *tables, scheme=scheme,
                                 causal=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            start = time.perf_counter()
            out = rp.blocked_attention(q, k, v, *tables, scheme=scheme, causal=True)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            extra = torch.cuda.max_memory_allocated() - before
            found.append({"scheme": scheme, "dtype": dtype, "t": args.t_blocked,
                          "seconds": seconds, "extra_bytes": int(extra),
                          "finite": bool(torch.isfinite(out).all())})
            print(found[-1], flush=True)
            del q, k, v, out
    return found


def _pytest(paths: list[str], env: dict[str, str], timeout: float, workers: int,
            log: Path | None = None) -> dict:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "no:benchmark", "--tb=short", "-n", str(workers), *paths]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, text=True,
                              capture_output=True, timeout=timeout)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or "") if isinstance(exc.stdout, str) else ""
        code = "timeout"
    if log is not None:
        log.write_text(output)  # the whole output, failures' tracebacks included
    lines = output.strip().splitlines()
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return {"command": " ".join(command), "returncode": code,
            "seconds": time.perf_counter() - start, "summary": lines[-1:] if lines else [],
            "failures": failures[:200], "tail": lines[-60:]}


def _markdown(results: dict[str, Any]) -> str:
    device = results.get("device", {})
    lines = [f"GPU run of `benchmarks/gpu_check.py` on {device.get('name')} "
             f"(torch {device.get('torch')}, triton {device.get('triton')}, "
             f"cupy {device.get('cupy')}), t = {results['t']}, {results['heads']} heads, "
             "d = 64, median of the timed calls (ms).", ""]
    bench = results.get("benchmark", {})
    rows = bench.get("rows", [])
    if rows:
        lines += ["| library | dtype | " + " | ".join(LABELS.get(s, s) for s in SCHEMES) + " |",
                  "|---|---|" + "---|" * len(SCHEMES)]
        for library in ("torch", "cupy"):
            for dtype in ("float32", "float16", "bfloat16"):
                cells = {r["scheme"]: r for r in rows
                         if r["library"] == library and r["dtype"] == dtype}
                if cells:
                    lines.append(f"| {library} | {dtype} | " + " | ".join(
                        f"{cells[s]['seconds'] * 1e3:.2f}" if "seconds" in cells.get(s, {})
                        else "error" for s in SCHEMES) + " |")
        lines += ["", "| baseline | dtype | ms | largest difference from ours |",
                  "|---|---|---|---|"]
        for b in bench.get("baselines", []):
            ms = f"{b['seconds'] * 1e3:.2f}" if "seconds" in b else b.get("error", "")
            lines.append(f"| {b['baseline']} | {b['dtype']} | {ms} | "
                         f"{b.get('ours_max_diff', '')} |")
    for b in results.get("backward", []) if isinstance(results.get("backward"), list) else []:
        if "seconds" in b:
            lines.append(f"\nVJP {b['scheme']} {b['dtype']} ({b['kernel']}): "
                         f"{b['seconds'] * 1e3:.2f} ms, {b['ratio_to_forward']:.2f}x its forward")
    for b in results.get("blocked", []):
        lines.append(f"\nblocked {b['scheme']} {b['dtype']} t = {b['t']}: "
                     f"{b['seconds']:.2f} s, {b['extra_bytes'] / 2**20:.1f} MiB beyond inputs")
    for name in ("kernels", "suite"):
        section = results.get(name)
        if section:
            lines.append(f"\n{name}: {' '.join(section['summary'])} "
                         f"({section['seconds']:.0f} s)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--t", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--t-blocked", type=int, default=262144)
    parser.add_argument("--budget", type=float, default=420.0,
                        help="seconds for the whole run; the suite gets what is left")
    parser.add_argument("--sections", default="benchmark,backward,tiles,blocked,kernels,suite")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch
    import triton

    results: dict[str, Any] = {"t": args.t, "heads": args.heads, "device": {
        "name": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": triton.__version__, "cupy": _cupy_version()}}

    def save() -> None:
        (args.out / "gpu_check.json").write_text(json.dumps(results, indent=1))
        (args.out / "gpu_check.md").write_text(_markdown(results))

    sections = args.sections.split(",")
    steps = [("benchmark", lambda: benchmark(args)), ("backward", lambda: backward(args)),
             ("tiles", lambda: tiles(args)), ("blocked", lambda: blocked(args))]
    for name, step in steps:
        if name in sections:
            try:
                results[name] = step()
            except Exception as exc:
                results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            results.setdefault("elapsed", {})[name] = time.perf_counter() - start
            save()
    if "kernels" in sections:
        results["kernels"] = _pytest(["tests/test_kernels_triton.py", "tests/test_lowering.py"],
                                     {"TRITON_INTERPRET": "0", **GPU_SHARED},
                                     timeout=max(60.0, args.budget / 3), workers=6,
                                     log=args.out / "kernels.log")
        save()
    if "suite" in sections:
        left = args.budget - (time.perf_counter() - start)
        results["suite"] = _pytest(SUITE, {"RELPOS_BACKENDS": "cupy,torch",
                                           "TRITON_INTERPRET": "0", **GPU_SHARED},
                                   timeout=max(30.0, left), workers=6,
                                   log=args.out / "suite.log")
        save()
    print(_markdown(results))
    return 0


def _cupy_version() -> str | None:
    try:
        import cupy

        return cupy.__version__
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
