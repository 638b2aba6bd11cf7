"""Issue 30's bounds on torch, each scheme against what a torch user would run instead.

`torch_bounds` times, for every scheme of the run, interleaved:

- its forward against ``scaled_dot_product_attention`` given a bias
  materialized as a ``(1, h, t, t)`` ``attn_mask`` (SDPA's fast form; built
  once, outside the timing): the bound is 2x;
- its VJP (`relpos_ref.<scheme>_attention_vjp`, which returns the gradient of
  every array of the call) against torch's autograd through that SDPA call, the
  mask requiring its gradient as a learned bias would: the cost of training
  the scheme with a materialized bias, before the bias's own gather and its
  backward.

And, for reference, torch's own ratio of VJP to forward for SDPA, plain
and with the bias, and the time of a VJP's five products of the grid's
size alone against SDPA's plain forward. A VJP computes the forward's
``q k^T`` again and four more products of the same size (``dO v^T``,
``G k``, ``G^T q``, ``w^T dO``) against the forward's two, so the issue's
other bound (every VJP within 2.5x its own forward) is the ratio of their
counts, and SDPA's forward on the CPU runs at the speed of its two products
(t = 1024, 8 heads, one thread: 23.3 ms against 11.8 + 12.3 ms for
``q k^T`` and ``w v`` alone): the five products alone took 64.5 ms, 2.74x
SDPA's forward, before any softmax gradient. The bound is below what any
VJP reaches on torch beside SDPA's forward.

The section first keeps glibc's allocator from handing memory back
(`steady_allocator`): torch takes its CPU arrays from ``malloc``, and under
glibc's defaults the baseline's ``(1, h, t, t)`` arrays were mapped and
page-faulted anew on every call, or not, by what the process had run before
(SDPA's autograd with the bias: 171 ms early in one run, 110 ms after CoPE's
calls had grown the heap, t = 1024, 8 heads).

Loaded by ``benchmarks/run.py`` from its own folder (a script, not a package).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FORWARD_BOUND", "bound_targets", "print_bounds", "steady_allocator",
           "torch_bounds"]

#: Issue 30: every forward within this factor of SDPA with a materialized bias.
FORWARD_BOUND = 2.0


#: glibc's ``mallopt`` parameters (M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD) and values:
#: free memory kept up to 1 GiB, the heap grown 1 GiB at a time (address space, not pages),
#: arrays up to 32 MiB (glibc's largest threshold) taken from the heap.
STEADY = ((-1, 2**30), (-2, 2**30), (-3, 32 * 2**20))


def steady_allocator() -> str:
    """Set `STEADY` where the C library is glibc; returns what was done, for the report."""
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "default (not glibc)"
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not all(libc.mallopt(param, value) == 1 for param, value in STEADY):
        return "default (mallopt refused)"
    return "glibc: trim threshold and top pad 1 GiB, mmap threshold 32 MiB"


def _sdpa_calls(q: Any, k: Any, v: Any, d_output: Any, bias: Any
                ) -> dict[str, Callable[[], Any]]:
    """SDPA plain and with `bias`, forward and autograd (the gradients of q, k, v, bias)."""
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def autograd(mask: Any) -> Callable[[], Any]:
        def run() -> Any:
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            if mask is not None:
                leaves.append(mask.detach().requires_grad_())
            out = sdpa(*leaves[:3], attn_mask=None if mask is None else leaves[3])
            return torch.autograd.grad(out, leaves, d_output)[0]
        return run

    lanes = q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:])
    weights = torch.randn(lanes[0].shape[0], q.shape[-2], k.shape[-2], dtype=q.dtype)
    values = v.reshape(-1, *v.shape[-2:])
    grid, rows = torch.empty_like(weights), torch.empty_like(lanes[0])  # (no fresh pages)

    def products() -> Any:  # a VJP's five products of the grid's size, each once
        torch.bmm(lanes[0], lanes[1].mT, out=grid)  # q k^T (the weights again)
        torch.bmm(lanes[0], values.mT, out=grid)  # dO v^T
        torch.bmm(weights, lanes[1], out=rows)  # G k
        torch.bmm(weights.mT, lanes[0], out=rows)  # G^T q
        return torch.bmm(weights.mT, values, out=rows)  # w^T dO

    return {"plain": lambda: sdpa(q, k, v), "plain autograd": autograd(None),
            "vjp products": products,
            "bias": lambda: sdpa(q, k, v, attn_mask=bias), "bias autograd": autograd(bias)}


def torch_bounds(timed_against: Callable[..., tuple[float, float, float]], backend: Any,
                 cases: dict[str, Any], q: Any, k: Any, v: Any, d_output: Any, bias: Any,
                 repeat: int, *, backward: bool = True) -> dict[str, Any]:
    """Every scheme's forward (and VJP) against SDPA with `bias` (and its autograd).

    `timed_against` is the suite's ``_timed_against`` (interleaved pairs, the
    median of their ratios); `cases` its ``scheme_cases``; `bias` the
    ``(1, h, t, t)`` mask. Returns ``{"reference": {...}, "products": {...}, "schemes":
    [...], "allocator": ...}``.
    """
    allocator = steady_allocator()
    sdpa = _sdpa_calls(q, k, v, d_output, bias)
    reference = {}
    for name in ("plain", "bias"):
        seconds, forward, ratio = timed_against(backend, sdpa[f"{name} autograd"], sdpa[name],
                                                repeat)
        reference[name] = {"vjp_seconds": seconds, "forward_seconds": forward,
                           "vjp_to_forward": ratio}
    seconds, forward, ratio = timed_against(backend, sdpa["vjp products"], sdpa["plain"], repeat)
    products = {"seconds": seconds, "forward_seconds": forward, "to_forward": ratio}
    rows = []
    for label, call in cases.items():
        seconds, base, ratio = timed_against(
            backend, lambda call=call: call(q, k, v, "efficient"), sdpa["bias"], repeat)
        row = {"scheme": label, "seconds": seconds, "sdpa_bias_seconds": base,
               "ratio_to_sdpa_bias": ratio}
        if backward:
            vjp, auto, vjp_ratio = timed_against(
                backend, lambda call=call: call.backward(q, k, v, d_output),
                sdpa["bias autograd"], repeat)
            row.update(vjp_seconds=vjp, sdpa_autograd_seconds=auto,
                       vjp_to_sdpa_autograd=vjp_ratio)
        rows.append(row)
    return {"reference": reference, "products": products, "schemes": rows,
            "allocator": allocator}


def print_bounds(result: dict[str, Any]) -> None:
    """The section's table, as ``benchmarks/run.py`` prints its others."""
    ref = result["reference"]
    print("\nissue 30's bounds on torch: each forward against SDPA with the bias as a "
          "(1, h, t, t) attn_mask,\neach VJP against torch's autograd through that call "
          "(q, k, v and the mask's gradients); interleaved pairs")
    print("reference, torch's own VJP / forward: SDPA plain "
          f"{ref['plain']['vjp_to_forward']:.2f}x ({ref['plain']['vjp_seconds'] * 1e3:.1f} "
          f"against {ref['plain']['forward_seconds'] * 1e3:.1f} ms), with the bias "
          f"{ref['bias']['vjp_to_forward']:.2f}x ({ref['bias']['vjp_seconds'] * 1e3:.1f} "
          f"against {ref['bias']['forward_seconds'] * 1e3:.1f} ms); allocator: "
          f"{result['allocator']}")
    products = result["products"]
    print("a VJP's five products of the grid's size alone (q k^T, dO v^T, G k, G^T q, w^T dO): "
          f"{products['seconds'] * 1e3:.1f} ms, {products['to_forward']:.2f}x SDPA's plain "
          "forward, the floor of a VJP / forward on torch")
    print(f"{'scheme':<28} {'fwd ms':>8} {'SDPA+b ms':>9} {'ratio':>7} {'VJP ms':>8} "
          f"{'autograd ms':>11} {'ratio':>7}")
    for row in result["schemes"]:
        line = (f"{row['scheme']:<28} {row['seconds'] * 1e3:8.1f} "
                f"{row['sdpa_bias_seconds'] * 1e3:9.1f} {row['ratio_to_sdpa_bias']:6.2f}x")
        if "vjp_seconds" in row:
            line += (f" {row['vjp_seconds'] * 1e3:8.1f} {row['sdpa_autograd_seconds'] * 1e3:11.1f}"
                     f" {row['vjp_to_sdpa_autograd']:6.2f}x")
        print(line)


def bound_targets(result: dict[str, Any]) -> list[tuple[str, float, bool]]:
    """``(text, value, met)`` per scheme: the forward bound, and the VJP against autograd."""
    out = []
    for row in result["schemes"]:
        name = row["scheme"].split()[0]
        ratio = row["ratio_to_sdpa_bias"]
        out.append((f"{name} forward <= {FORWARD_BOUND:g}x SDPA with a (1, h, t, t) bias",
                    ratio, ratio <= FORWARD_BOUND))
        if "vjp_to_sdpa_autograd" in row:
            ratio = row["vjp_to_sdpa_autograd"]
            out.append((f"{name} VJP <= torch autograd through SDPA with the bias", ratio,
                        ratio <= 1.0))
    return out
