"""Peak extra memory of the efficient and definition paths (NumPy, tracemalloc).

Run: ``python benchmarks/peak_memory.py [--t 1024] [--d 64] [--heads 1]``.
NumPy reports its buffers to tracemalloc, so the peak is the largest amount
of memory allocated at once during the call, inputs excluded.
"""

from __future__ import annotations

import argparse
import json
import tracemalloc

import numpy as np

import relpos_ref as rp


def peak_bytes(fn) -> int:
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    result = fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del result
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--t", type=int, default=1024)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--max-distance", type=int, default=16)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    t, d, h, k = args.t, args.d, args.heads, args.max_distance
    q, kk, v = (rng.standard_normal((h, t, d)).astype(args.dtype) for _ in range(3))
    a_k = rng.standard_normal((2 * k + 1, d)).astype(args.dtype)
    a_v = rng.standard_normal((2 * k + 1, d)).astype(args.dtype)
    e = rng.standard_normal((t, d)).astype(args.dtype)
    cases = {
        "shaw (keys and values)": lambda m: rp.shaw_attention(q, kk, v, a_k, a_v, method=m),
        "music": lambda m: rp.music_attention(q, kk, v, e, method=m),
        "plain attention": lambda m: rp.attention(q, kk, v),
    }
    rows = []
    for name, call in cases.items():
        for method in ("efficient", "definition"):
            if name == "plain attention" and method == "definition":
                continue
            peak = peak_bytes(lambda call=call, method=method: call(method))
            rows.append({"case": name, "method": method, "peak_MiB": round(peak / 2**20, 1)})
    print(f"t={t} d={d} heads={h} K={k} dtype={args.dtype}")
    for r in rows:
        print(f"{r['case']:<24} {r['method']:<11} {r['peak_MiB']:>9.1f} MiB")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
