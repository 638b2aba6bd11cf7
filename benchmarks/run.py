"""relpos_ref benchmark suite: every ratio measured in one run, on one backend.

Run ``python benchmarks/run.py`` (``--help`` for options). It prints a table and
writes a JSON file (machine, library versions, date, every measurement) to
``benchmarks/results/``. Reported:

1. each scheme's attention against plain `relpos_ref.attention` (same backend,
   dtype and shapes), median of ``--repeat`` timed calls after a warm-up;
2. ``method="efficient"`` against ``method="definition"`` at ``--t-definition``
   (the definition builds ``(t_q, t_k, d)`` tensors: it does not fit at 1024);
3. the peer baseline: HF BERT ``relative_key``, which gathers a
   ``(t_q, t_k, d)`` embedding tensor and contracts it with einsum (torch, CPU),
   its calls interleaved with our Shaw call that computes the same;
4. peak memory: tracemalloc on NumPy, the allocator's peak on torch CUDA and CuPy;
5. `relpos_ref.blocked_attention` (the dispatched one: a library's blocked
   kernel where it has one) at ``--t-blocked`` (one head), time, peak memory
   and, for plain attention, its throughput (pairs per second) against the
   unblocked call at ``--t-unblocked`` (issue 17's target, set for CuPy);
6. with ``--t-distributed``, `relpos_ref.blocked` over Dask arrays on a
   ``dask.distributed`` LocalCluster of worker processes with a memory limit
   (issue 17): wall time, each worker's peak resident memory against the bound
   stated in `relpos_ref._blocked_dask`, and rows checked against NumPy
   (``--distributed-only`` runs this section alone);
7. torch only: our calls against ``scaled_dot_product_attention``, and FlexAttention
   (``--flex``): a hand-written bias score_mod against our bias attention, and the
   score_mods `relpos_ref.flex` exports for bias, T5 and ALiBi against hand-written
   ones and against SDPA with the bias materialized as ``(1, h, t, t)`` (issue 30);
   every scheme's forward against SDPA with a ``(1, h, t, t)`` bias, its VJP against torch's
   autograd through that call (``benchmarks/torch_bounds.py``, issue 30's bounds);
8. RoPE's frequency scalings, float32 angles and axis layouts (issue 28) against plain
   RoPE, each timed interleaved with `relpos_ref.rope_attention` unscaled
   (`rope_variants`, `rope_axis_variants`);
9. the targets of issues 7, 14, 16, 17, 28 and 30, each marked met or missed.

The schemes, their tables and their benchmark sizes come from `relpos_ref.catalog`;
``--schemes kerple,xpos`` limits the scheme and backward tables to those (and plain
attention), and runs RoPE's variants only when ``rope`` is named; the other sections
(the peer, SDPA, blocked) run as usual unless switched off by their own options.

Timings are for comparing within one run; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import relpos_ref as rp
from relpos_ref import backends, catalog


def _timed(backend: Any, fn: Callable[[], Any], repeat: int) -> float:
    backend.synchronize(fn())  # warm-up (and compilation, caches)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        backend.synchronize(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _timed_against(backend: Any, fn: Callable[[], Any], baseline: Callable[[], Any],
                   repeat: int) -> tuple[float, float, float]:
    """Median times of `fn` and `baseline`, and the median of their paired ratios.

    Calls are interleaved so that both see the same load, each going first
    in every other pair; the ratio of each pair is taken before the median,
    which a drifting load on a shared machine moves less than a ratio of
    medians.
    """
    backend.synchronize(fn())
    backend.synchronize(baseline())
    ours, base = [], []
    for i in range(repeat):
        # Alternate which goes first: on this machine the first call of a pair ran up
        # to 10 % slower, which biased a ratio of plain against itself to 1.1.
        pair = ((fn, ours), (baseline, base))
        for call, into in pair if i % 2 == 0 else pair[::-1]:
            start = time.perf_counter()
            backend.synchronize(call())
            into.append(time.perf_counter() - start)
    ratio = statistics.median(a / b for a, b in zip(ours, base, strict=True))
    return statistics.median(ours), statistics.median(base), ratio


def _sibling(name: str) -> Any:
    """A module of this script's folder (benchmarks/ is not a package), loaded once."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _peak_bytes(backend: Any, fn: Callable[[], Any], device: str = "cpu") -> int | None:
    # gc.collect() only before a GPU's count (it frees device arrays held in cycles): a call
    # took 0.08 s in a fresh process and 0.21 s after one torch.compile, so the NumPy suite's
    # 57 peaks were most of a small run (t = 64: 6.2 s with it, 0.5 s without) and more in
    # a long test process (the suite's test: 8.5 s alone, 64 s in the full test run)
    if backend.name == "numpy":
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        del result
        return peak
    if backend.name == "torch":
        import torch

        if not device.startswith("cuda"):
            return None  # no allocator statistics for torch on the CPU
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        backend.synchronize(fn())
        return torch.cuda.max_memory_allocated() - base
    if backend.name == "cupy":
        import cupy

        gc.collect()
        pool = cupy.get_default_memory_pool()
        pool.free_all_blocks()
        base = pool.used_bytes()
        result = fn()
        backend.synchronize(result)
        peak = pool.total_bytes() - base
        del result
        return peak
    return None


def _inputs(backend, dtype, heads, t, d, seed=0, device=None):
    rng = np.random.default_rng(seed)

    def arr(*shape):
        return backend.from_numpy(rng.standard_normal(shape).astype(dtype), device)

    return arr, tuple(arr(1, heads, t, d) for _ in range(3))


def scheme_cases(arr, heads: int, t: int, d: int, k_max: int,
                 schemes: tuple[str, ...] | None = None) -> dict[str, Callable]:
    """label -> call(q, k, v, method) for plain attention and the catalog's schemes.

    Every scheme, or those `schemes` names (the others' tables are not made).

    Each call has ``call.backward(q, k, v, d_output)``: the scheme's public VJP on the
    same arguments (``relpos_ref.<scheme>_attention_vjp``, the specification's
    `relpos_ref.catalog.Scheme.vjp` behind the dispatcher, so a kernel runs where the
    backend has one).

    Each scheme at its catalog benchmark sizes for length `t` (`Scheme.benchmark`;
    ``K`` is `k_max`), its optional tables as golden cases include them, scalar
    tables per head (but those the catalog's ``shared`` names), the others shared unless
    the catalog says ``per_head``, and
    the scheme's own defaults (music and Transformer-XL are causal).
    """
    def plain(q, k, v, m):
        return rp.attention(q, k, v)

    plain.backward = lambda q, k, v, d_output: rp.attention_vjp(q, k, v, d_output=d_output)
    cases = {"plain": plain}
    for entry in catalog.SCHEMES.values():
        if entry.name == "plain" or (schemes is not None and entry.name not in schemes):
            continue
        settings = entry.benchmark(t)
        per_head = settings.pop("per_head", False)
        shared = settings.pop("shared", ())  # tables the scheme's models share by heads
        params = {"t_q": t, "t_k": t, "d": d, "h": heads, **settings}
        if "K" in params:
            params["K"] = k_max
        sizes = {**entry.sizes_from(params), "d": d}
        included = [x.switch for x in entry.tables if x.switch and x.switch_default]
        tables = [
            arr(*x.shape(sizes, d=d, d_v=d,
                         heads=heads if (per_head or x.width is None) and x.name not in shared
                         else None))
            if x.required or x.switch_default else None
            for x in entry.tables
        ]
        while tables and tables[-1] is None:
            tables.pop()
        options = entry.options_from({**entry.option_defaults(), **params})
        options.pop("slopes", None)
        label = f"{entry.name} {entry.label({**params, **options, 'rotary_dim': None})}"
        label += "".join(f"+{s}" for s in dict.fromkeys(included))
        function = getattr(rp, f"{entry.name}_attention")
        vjp = getattr(rp, f"{entry.name}_attention_vjp")

        def call(q, k, v, m, function=function, tables=tables, options=options,
                 methods=entry.methods):
            return function(q, k, v, *tables, **options, **({"method": m} if methods else {}))

        def backward(q, k, v, d_output, vjp=vjp, tables=tables, options=options):
            return vjp(q, k, v, *tables, d_output=d_output, **options)

        call.backward = backward  # the scheme's public backward pass, same arguments
        cases[label] = call
    return cases


def rope_variants(t: int, d: int) -> dict[str, dict[str, Any]]:
    """Keyword arguments of `relpos_ref.rope_attention` for each scaling rule at length `t`.

    Trained lengths below `t`, so that the length-dependent rules scale (dynamic's base
    grows, LongRoPE reads its long factors); ``float32-angles`` is the unscaled call with
    ``angles="float32"``, which forms every angle and so costs more (no 1.1x target).
    """
    pairs = d // 2
    short = max(t // 8, 2)
    return {
        "linear": {"scaling": {"rope_type": "linear", "factor": 4.0}},
        "dynamic": {"scaling": {"rope_type": "dynamic", "factor": 4.0,
                                "original_max_position_embeddings": short}},
        "yarn": {"scaling": {"rope_type": "yarn", "factor": 8.0,
                             "original_max_position_embeddings": short}},
        "yarn-deepseek": {"scaling": {"rope_type": "yarn", "factor": 40.0,
                                      "original_max_position_embeddings": short,
                                      "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "softmax_mscale": True}},
        "longrope": {"scaling": {"rope_type": "longrope",
                                 "short_factor": [1.0 + c / pairs for c in range(pairs)],
                                 "long_factor": [1.0 + 4 * c for c in range(pairs)],
                                 "original_max_position_embeddings": short,
                                 "max_position_embeddings": 8 * short}},
        "llama3": {"scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": short}},
        "proportional": {"scaling": {"rope_type": "proportional",
                                     "partial_rotary_factor": 0.25}},
        "float32-angles": {"angles": "float32"},
    }


def rope_axis_variants(t: int, d: int) -> dict[str, dict[str, Any]]:
    """Keyword arguments of `relpos_ref.rope_attention` for each axis layout at length `t`.

    ``positions`` are NumPy integers here (`rope_comparison` moves them to the
    call's library once): M-RoPE's three axes over text, a square image and
    text again (Qwen2-VL's sections, and Qwen3-VL's interleaved), axial RoPE
    of a row-major grid (two axes, a head's half each), RoPE-Mixed's learned
    frequencies on that grid, and the rotated part at the tail of the head.
    """
    pairs = d // 2
    side = max(int(np.sqrt(t // 2)), 1)  # an image of side x side patches mid-sequence
    text = (t - side * side) // 2
    rows, cols = np.divmod(np.arange(side * side), side)
    tail = np.arange(t - text - side * side) + text + side
    mrope = np.concatenate([np.repeat(np.arange(text)[None], 3, axis=0),
                            np.stack([np.full(side * side, text), text + rows, text + cols]),
                            np.repeat(tail[None], 3, axis=0)], axis=1)
    grid_rows, grid_cols = np.divmod(np.arange(t), max(int(np.ceil(np.sqrt(t))), 1))
    grid = np.stack([grid_rows, grid_cols])
    section = [pairs - 2 * (3 * pairs // 8), 3 * pairs // 8, 3 * pairs // 8]
    frequencies = np.random.default_rng(0).uniform(-1.0, 1.0, (pairs, 2)) * 0.1
    return {
        "mrope": {"axes": {"axes_type": "mrope", "mrope_section": section},
                  "positions": mrope},
        "mrope-interleaved": {"axes": {"axes_type": "mrope", "mrope_section": section,
                                       "mrope_interleaved": True}, "positions": mrope},
        "axial-2d": {"axes": {"axes_type": "axial", "axes_dims": [d // 2, d - d // 2]},
                     "positions": grid},
        "mixed": {"axes": {"axes_type": "mixed", "frequencies": frequencies.tolist()},
                  "positions": grid},
        "tail": {"rotary_dim": d // 2, "rotary_at": "tail"},
    }


def rope_comparison(backend: Any, q: Any, k: Any, v: Any, repeat: int) -> list[dict[str, Any]]:
    """Each of `rope_variants` and `rope_axis_variants` against plain RoPE: times and the
    median paired ratio."""
    import array_api_compat

    t, d = q.shape[-2], q.shape[-1]
    xp = array_api_compat.array_namespace(q)
    variants = rope_variants(t, d)
    for name, options in rope_axis_variants(t, d).items():
        if "positions" in options:  # in the call's library, once
            options = {**options, "positions": xp.asarray(
                options["positions"], device=array_api_compat.device(q))}
        variants[name] = options
    rows = []
    for name, options in variants.items():
        seconds, plain, ratio = _timed_against(
            backend, lambda options=options: rp.rope_attention(q, k, v, **options),
            lambda: rp.rope_attention(q, k, v), repeat)
        rows.append({"variant": name, "seconds": seconds, "rope_seconds": plain,
                     "ratio_to_rope": ratio})
    return rows


def _scheme_names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in catalog.SCHEMES]
    if not names or unknown:
        msg = (f"--schemes takes catalog scheme names separated by commas, got {text!r}"
               + (f" ({', '.join(map(repr, unknown))} not in the catalog: "
                  f"{', '.join(catalog.SCHEMES)})" if unknown else ""))
        raise argparse.ArgumentTypeError(msg)
    return names


def _schemes_of(cases: dict[str, Callable]) -> set[str]:
    return {label.split()[0] for label in cases}


def _label(cases: dict[str, Callable], scheme: str) -> str:
    return next(name for name in cases if name.split()[0] == scheme)


def bert_relative_key(q, k, v, embedding, k_max):
    """HF BertSelfAttention, position_embedding_type='relative_key' (torch, transcribed)."""
    import torch

    t = q.shape[-2]
    position_ids_l = torch.arange(t).view(-1, 1)
    position_ids_r = torch.arange(t).view(1, -1)
    distance = (position_ids_l - position_ids_r).clamp(-k_max, k_max)
    positional_embedding = embedding[distance + k_max]  # (t, t, d)
    scores = torch.matmul(q, k.transpose(-1, -2))
    scores = scores + torch.einsum("bhld,lrd->bhlr", q, positional_embedding)
    scores = scores / (q.shape[-1] ** 0.5)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def peer_comparison(backend, device, heads: int, t: int, d: int, dtype: str, k_max: int,
                    repeat: int) -> dict[str, Any]:
    """The HF BERT peer (torch CPU) against our Shaw call that computes the same, interleaved.

    The peer adds only a key term, ``q . E[clip(i - j) + K]``: ours is
    `relpos_ref.shaw_attention` with keys only and the table reversed (our
    ``r = j - i``), on the same values, on the run's backend. Its calls
    alternate with the peer's (`_timed_against`), and the ratio is the median
    of the pairs' peer / ours. The row holds the largest difference of the
    two outputs.
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    tq, tk, tv = (torch.randn(1, heads, t, d, generator=gen, dtype=getattr(torch, dtype))
                  for _ in range(3))
    emb = torch.randn(2 * k_max + 1, d, generator=gen, dtype=tq.dtype)
    q, k, v, table = (backend.from_numpy(x.numpy(), device) for x in (tq, tk, tv, emb.flip(0)))

    def ours():
        return rp.shaw_attention(q, k, v, table)

    def peer():  # done when it returns (torch on the CPU): nothing for `backend` to wait on
        bert_relative_key(tq, tk, tv, emb, k_max)

    gap = float(np.max(np.abs(backend.to_numpy(ours())
                              - bert_relative_key(tq, tk, tv, emb, k_max).numpy())))
    peer_seconds, our_seconds, ratio = _timed_against(backend, peer, ours, repeat)
    return {"name": "HF BERT relative_key (torch CPU, einsum over (t, t, d))",
            "seconds": peer_seconds, "our_seconds": our_seconds, "ratio_to_our_shaw": ratio,
            "our_call": f"shaw K{k_max} keys only, the table reversed ({backend.name})",
            "max_abs_difference": gap}


def sdpa_mask(bias_table: Any, t: int, ndim: int) -> Any:
    """The bias scheme's logits in SDPA's fast form: `ndim` axes, ``(1, h, t, t)`` for four."""
    bias = rp.bias_logits(bias_table, t, t)
    return bias.reshape((1,) * (ndim - bias.ndim) + tuple(bias.shape))


def sdpa_comparison(backend, q, k, v, bias_table, repeat: int) -> list[dict[str, Any]]:
    """torch only: our plain and bias attention against ``scaled_dot_product_attention``.

    SDPA gets the bias matrix as an additive float ``attn_mask`` of four axes,
    ``(1, h, t, t)`` like `q` (built once, outside the timing, as a model
    would cache it); ours gets the ``(h, 2K + 1)`` table. Given the same mask
    with three axes, ``(h, t, t)``, torch 2.13's SDPA took a slow path on the
    CPU: 3.0 to 4.4 times plain SDPA, against 1.2 times with four (issue 30).
    Each pair is interleaved; the ratio is ours / SDPA.
    """
    import torch

    sdpa = torch.nn.functional.scaled_dot_product_attention
    t = q.shape[-2]
    bias = sdpa_mask(bias_table, t, q.ndim)
    rows = []
    for name, ours, theirs in (
        ("plain", lambda: rp.attention(q, k, v), lambda: sdpa(q, k, v)),
        ("bias, (1, h, t, t) attn_mask", lambda: rp.bias_attention(q, k, v, bias_table),
         lambda: sdpa(q, k, v, attn_mask=bias)),
    ):
        mine, ref, ratio = _timed_against(backend, ours, theirs, repeat)
        rows.append({"case": name, "seconds": mine, "sdpa_seconds": ref, "ratio_to_sdpa": ratio})
    return rows


def flex_bias_mod(table: Any, k_max: int) -> Callable[..., Any]:
    """FlexAttention's ``score_mod`` for the bias scheme's ``(h, 2K + 1)`` table.

    ``score + table[h, clip(kv - q, -K, K) + K]``: the relative position is the
    key's index minus the query's, clipped, added after the scale (as
    `relpos_ref.bias_attention` does).
    """
    import torch

    def score_mod(score, batch, head, q_idx, kv_idx):
        return score + table[head, torch.clamp(kv_idx - q_idx, -k_max, k_max) + k_max]

    return score_mod


def flex_comparison(backend, q, k, v, bias_table, k_max: int, repeat: int,
                    mode: str) -> dict[str, Any]:
    """torch only: our bias attention against FlexAttention looking the bias up in the table.

    `mode` "compiled" runs ``torch.compile(flex_attention)`` (its fused kernel;
    compiled once, outside the timing), "eager" the unfused implementation that
    materializes the scores (fast to start: the tests use it). The row holds
    the largest difference of the two outputs, or the error where FlexAttention
    is missing or fails (this torch, this device, this dtype).
    """
    import warnings

    row: dict[str, Any] = {"case": f"bias (FlexAttention score_mod, {mode})", "mode": mode}
    try:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        score_mod = flex_bias_mod(bias_table, k_max)
        attend = torch.compile(flex_attention) if mode == "compiled" else flex_attention

        def theirs():
            with warnings.catch_warnings():  # eager: "called without torch.compile()"
                warnings.simplefilter("ignore", UserWarning)
                return attend(q, k, v, score_mod=score_mod)

        gap = float((theirs() - rp.bias_attention(q, k, v, bias_table)).abs().max())
        mine, ref, ratio = _timed_against(backend, lambda: rp.bias_attention(q, k, v, bias_table),
                                          theirs, repeat)
    except Exception as exc:  # reported in the row: the suite goes on
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return row
    row.update({"seconds": mine, "flex_seconds": ref, "ratio_to_flex": ratio,
                "max_abs_difference": gap})
    return row


def hand_written_mods(tables: dict[str, Any], t: int, k_max: int) -> dict[str, Callable]:
    """score_mods written by hand for bias, T5 and ALiBi, as a FlexAttention user writes them.

    bias: `flex_bias_mod`; T5: the bucket of each distance precomputed
    (`relpos_ref.t5_bucket`), then the head's entry; ALiBi: ``-m_h |kv - q|``.
    """
    import torch

    table, slopes = tables["t5"], tables["alibi"]
    r = torch.arange(-(t - 1), t, device=table.device)
    buckets = rp.t5_bucket(r, num_buckets=table.shape[-1])

    def t5_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, buckets[kv_idx - q_idx + (t - 1)]]

    def alibi_mod(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * torch.abs(kv_idx - q_idx)

    return {"bias": flex_bias_mod(tables["bias"], k_max), "t5": t5_mod, "alibi": alibi_mod}


def flex_export_comparison(backend, q, k, v, tables: dict[str, Any], k_max: int, repeat: int,
                           mode: str) -> list[dict[str, Any]]:
    """torch only: `relpos_ref.flex`'s exported score_mod against a hand-written one and SDPA.

    For bias, T5 and ALiBi (tables by scheme; ALiBi's are its slopes): the
    export (`relpos_ref.flex.flex_attention_args`, run by ``flex_attention``,
    compiled unless `mode` is "eager") against `hand_written_mods` on the same
    FlexAttention, and against ``scaled_dot_product_attention`` given the bias
    materialized as a ``(1, h, t, t)`` ``attn_mask`` (built once, outside the
    timing). Each pair interleaved; ``within_10_percent``: export <= 1.1x
    hand-written (issue 30's target). A failure is recorded in its row.
    """
    rows = []
    for scheme in ("bias", "t5", "alibi"):
        row: dict[str, Any] = {"case": f"{scheme} (FlexAttention export, {mode})",
                               "scheme": scheme, "mode": mode}
        try:
            row.update(_flex_export_row(backend, scheme, q, k, v, tables, k_max, repeat, mode))
        except Exception as exc:  # reported in the row: the suite goes on
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        rows.append(row)
    return rows


def _flex_export_row(backend, scheme, q, k, v, tables, k_max, repeat, mode) -> dict[str, Any]:
    import warnings

    import torch
    from torch.nn.attention.flex_attention import flex_attention
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from relpos_ref.flex import flex_attention_args

    t, table = q.shape[-2], tables[scheme]
    if scheme == "alibi":
        args = flex_attention_args(scheme, q, k, v, slopes=table)
    else:
        args = flex_attention_args(scheme, q, k, v, table)
    hand = hand_written_mods(tables, t, k_max)[scheme]
    bias = {"bias": rp.bias_logits, "t5": rp.t5_bias, "alibi": rp.alibi_bias}[scheme](
        table, t, t)[None]
    torch._dynamo.reset()  # two compilations per scheme, far from the recompile limit
    attend = torch.compile(flex_attention, fullgraph=True) if mode == "compiled" else flex_attention

    def run(*a, **kw):
        with warnings.catch_warnings():  # eager: "called without torch.compile()"
            warnings.simplefilter("ignore", UserWarning)
            return attend(*a, **kw)

    def export():
        return run(args.q, args.k, args.v, **args.kwargs)

    def written():
        return run(q, k, v, score_mod=hand, scale=args.scale)

    def materialized():
        return sdpa(q, k, v, attn_mask=bias, scale=args.scale)

    gap = float((export() - written()).abs().max())
    gap_sdpa = float((export() - materialized()).abs().max())
    mine, theirs, ratio = _timed_against(backend, export, written, repeat)
    _, sdpa_seconds, ratio_sdpa = _timed_against(backend, export, materialized, repeat)
    return {"seconds": mine, "hand_written_seconds": theirs, "ratio_to_hand_written": ratio,
            "sdpa_seconds": sdpa_seconds, "ratio_to_sdpa": ratio_sdpa,
            "within_10_percent": ratio <= 1.1, "max_abs_difference": gap,
            "max_abs_difference_sdpa": gap_sdpa}


def _nonnegative(text: str) -> int:
    value = int(text)
    if value < 0:
        msg = f"must be >= 0, got {value}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _lengths(text: str) -> tuple[int, ...]:
    """``"32768,131072"`` -> ``(32768, 131072)``; ``""`` or ``"0"`` -> ``()``."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        msg = f"expected comma-separated lengths, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if any(n < 0 for n in values):
        msg = f"lengths must be >= 0, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return tuple(n for n in values if n)


def _process_memory(field: str = "VmHWM") -> int | None:
    """This process's peak (``VmHWM``) or current (``VmRSS``) resident memory, Linux only.

    Not ``getrusage``'s ``ru_maxrss``: a worker process started by
    ``multiprocessing`` (spawn, through fork and exec) inherits the peak of the
    process that forked it.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _worker_baseline() -> int | None:
    """Run on each worker before the call: import what the tasks import; the peak so far."""
    import dask.array  # noqa: F401

    import relpos_ref._blocked_dask  # noqa: F401

    return _process_memory()


#: glibc's malloc settings for the worker processes. Dask's nanny starts workers with
#: MALLOC_TRIM_THRESHOLD_=65536, which (setting any of them turns glibc's adaptive mmap
#: threshold off) maps and unmaps every array over 128 KiB: each (block, block) tile of the
#: loop page-faults anew (one NumPy call at t = 8192 took 2.5 s against 1.1 s tuned). "tuned"
#: keeps arrays up to 32 MiB on the heap and gives free heap back above 64 MiB, which the
#: bound then counts (`worker_memory_bound`'s `retained`).
MALLOC = {"dask": {"MALLOC_TRIM_THRESHOLD_": 65536},
          "tuned": {"MALLOC_TRIM_THRESHOLD_": 64 * 2**20, "MALLOC_MMAP_THRESHOLD_": 32 * 2**20}}

#: Tile arrays of (block, block) a task of relpos_ref.blocked holds at its peak, at most:
#: tracemalloc of one chunk of 4096 queries, block 1024, float32, one head: rope 5.3,
#: absolute 6.3, plain 7.5, Transformer-XL 9.7, bias 10.3, Shaw causal 10.6, general 13.7,
#: T5 16.6, DeBERTa 17.6 (the chunk's rows and output included).
TILE_ARRAYS = 18


def worker_memory_bound(*, t_q: int, t_k: int, d: int, d_v: int, heads: int, itemsize: int,
                        chunk: int, block: int, threads: int, tables: int, baseline: int,
                        retained: int = 0) -> int:
    """The bound of `relpos_ref._blocked_dask` on one worker's memory, in bytes.

    ``baseline`` (the worker process before the call) + ``k`` and ``v`` twice
    (their chunks and the merged copy while they are assembled) + every chunk
    of ``q`` and of the output (waiting for their task, waiting for the
    client) + the tables + per running task its chunk, output and accumulator
    and `TILE_ARRAYS` tiles + ``retained``, the free memory malloc may keep
    (its trim threshold).
    """
    s, h = itemsize, heads
    shared = s * h * (2 * t_k * (d + d_v) + t_q * (d + d_v)) + tables
    task = s * h * (chunk * (d + 2 * d_v) + TILE_ARRAYS * block * block)
    return baseline + shared + threads * task + retained


def distributed_blocked(lengths: tuple[int, ...], *, d: int, dtype: str, k_max: int,
                        block: int, chunk: int, workers: int, memory_limit: str,
                        malloc: str = "dask", check_rows: int = 6) -> list[dict[str, Any]]:
    """`relpos_ref.blocked` over Dask arrays on a fresh LocalCluster per case (issue 17).

    One head, ``q``, ``k``, ``v`` drawn on the workers (``da.random``, chunks
    of `chunk` queries or keys), computed to the client; the cases are plain
    attention over every pair and Shaw (keys and values, ``K = k_max``),
    causal. Each case starts its own cluster of `workers` processes of one
    thread (one BLAS thread each) and `memory_limit`, so each worker's peak
    resident memory (Linux ``VmHWM``) is that case's. `check_rows` rows
    (first, middle, last, random) are recomputed with NumPy, unblocked.
    """
    try:
        import dask
        import dask.array as da
        from dask.utils import parse_bytes
        from distributed import Client, LocalCluster
    except ImportError as exc:
        print(f"\ndistributed blocked: skipped, {exc} (pip install 'dask[array]' distributed)")
        return []
    limit = parse_bytes(memory_limit)
    rows_out = []
    print(f"\nrelpos_ref.blocked on a dask.distributed LocalCluster: {workers} worker processes "
          f"x 1 thread, memory_limit {memory_limit}, chunks {chunk}, block {block}, 1 head, "
          f"d = {d}, {dtype}, malloc {malloc}")
    print(f"{'case':<14} {'t':>7} {'time s':>8} {'peak MiB':>9} {'before MiB':>10} "
          f"{'bound MiB':>10} {'max |err|':>10}")
    table_np = np.random.default_rng(3).standard_normal((2 * k_max + 1, d)).astype(dtype)
    environ = {f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in MALLOC[malloc].items()}
    for t in lengths:
        for scheme, causal in (("plain", False), ("shaw", True)):
            label = scheme + (" causal" if causal else "")
            row: dict[str, Any] = {"scheme": scheme, "causal": causal, "t": t, "d": d,
                                   "chunk": chunk, "block": block, "workers": workers,
                                   "memory_limit_bytes": limit, "malloc": malloc}
            with dask.config.set(environ), \
                    LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                 memory_limit=memory_limit, dashboard_address=None) as cluster, \
                    Client(cluster) as client:
                baseline = client.run(_worker_baseline)
                started = set(client.scheduler_info()["workers"])
                rng = da.random.default_rng(2)
                q, k, v = (rng.standard_normal((1, t, d), chunks=(1, chunk, d), dtype=dtype)
                           for _ in range(3))
                tables = () if scheme == "plain" else (da.from_array(table_np),) * 2
                start = time.perf_counter()
                try:
                    out = rp.blocked_attention(q, k, v, *tables, scheme=scheme, causal=causal,
                                               block_size=block).compute()
                except Exception as exc:  # a worker killed for memory: KilledWorker
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    out = None
                row["seconds"] = time.perf_counter() - start
                peaks = client.run(_process_memory)
                row["workers_lost"] = len(started - set(client.scheduler_info()["workers"]))
                if out is not None:
                    check = sorted({0, t // 2, t - 1, *np.random.default_rng(t).integers(
                        0, t, max(check_rows - 3, 0)).tolist()})
                    q_np, k_np, v_np = (x.compute() for x in (q, k, v))
            row["worker_peak_bytes"] = dict(peaks)
            row["worker_start_bytes"] = dict(baseline)
            known = [p for p in peaks.values() if p is not None]
            row["peak_bytes"] = max(known) if known else None
            start_bytes = max((b for b in baseline.values() if b is not None), default=0)
            row["bound_bytes"] = worker_memory_bound(
                t_q=t, t_k=t, d=d, d_v=d, heads=1, itemsize=np.dtype(dtype).itemsize,
                chunk=chunk, block=block, threads=1, tables=2 * table_np.nbytes,
                baseline=start_bytes, retained=MALLOC[malloc]["MALLOC_TRIM_THRESHOLD_"])
            if out is not None:
                errors = []
                for i in check:
                    if scheme == "plain":
                        want = rp.attention(q_np[..., i:i + 1, :], k_np, v_np, q_offset=i,
                                            causal=causal)
                    else:
                        want = rp.shaw_attention(q_np[..., i:i + 1, :], k_np, v_np, table_np,
                                                 table_np, q_offset=i, causal=causal)
                    errors.append(float(np.max(np.abs(out[..., i:i + 1, :] - want))))
                row["checked_rows"] = check
                row["max_abs_error"] = max(errors)
                del out, q_np, k_np, v_np
            rows_out.append(row)
            mib = ["n/a" if x is None else f"{x / 2**20:.0f}"
                   for x in (row["peak_bytes"], start_bytes or None, row["bound_bytes"])]
            err = f"{row['max_abs_error']:.1e}" if "max_abs_error" in row else row["error"]
            print(f"{label:<14} {t:>7} {row['seconds']:8.1f} {mib[0]:>9} {mib[1]:>10} "
                  f"{mib[2]:>10} {err:>10}")
    return rows_out


def _versions(backend) -> dict[str, str]:
    out = {"python": platform.python_version(), "numpy": np.__version__,
           "relpos_ref": rp.__version__}
    for name in ("torch", "cupy", "jax", "array_api_compat", "dask", "distributed"):
        module = sys.modules.get(name)
        if module is not None:
            out[name] = getattr(module, "__version__", "?")
    return out


def _machine(backend) -> dict[str, Any]:
    info = {"platform": platform.platform(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "backend": backend.name}
    if backend.name in ("cupy", "torch"):
        try:
            import torch

            if torch.cuda.is_available():
                info["gpu"] = torch.cuda.get_device_name(0)
        except ImportError:
            pass
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpy", choices=backends.names())
    parser.add_argument("--device", default=None,
                        help="e.g. cuda:0 for torch on a GPU (default: the backend's first "
                             "device, the CPU for torch)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--t", type=int, default=1024)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--k-max", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--t-definition", type=_nonnegative, default=256,
                        help="sequence length for method='definition' against 'efficient' "
                             "(0 skips)")
    parser.add_argument("--t-blocked", type=int, default=32768,
                        help="sequence length for relpos_ref.blocked (0 skips)")
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--t-unblocked", type=_nonnegative, default=16384,
                        help="sequence length of the unblocked plain call (one head) whose "
                             "throughput the blocked one is compared with (0 skips)")
    parser.add_argument("--t-distributed", type=_lengths, default=(),
                        help="comma-separated sequence lengths for relpos_ref.blocked over Dask "
                             "arrays on a dask.distributed LocalCluster, e.g. 32768,131072 "
                             "(default: skipped; needs dask[array] and distributed)")
    parser.add_argument("--distributed-only", action="store_true",
                        help="run only the --t-distributed section")
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes of the LocalCluster, one thread each")
    parser.add_argument("--worker-memory", default="1GiB",
                        help="memory_limit of each worker (the nanny restarts a worker past 95%%)")
    parser.add_argument("--chunk", type=int, default=4096,
                        help="Dask chunk of queries (and keys) for --t-distributed")
    parser.add_argument("--malloc", choices=sorted(MALLOC), default="tuned",
                        help="glibc malloc settings of the workers: 'tuned' (default) or "
                             "Dask's own, 'dask' (see MALLOC in this file)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--flex", choices=["compiled", "eager", "off"], default="compiled",
                        help="torch only: FlexAttention with the bias table as score_mod, "
                             "beside SDPA (compiled: its fused kernel, about 30 s to compile "
                             "on a CPU)")
    parser.add_argument("--schemes", type=_scheme_names, default=None,
                        help="comma-separated catalog schemes for the scheme and backward "
                             "tables (plain always runs); RoPE's variants run only when rope "
                             "is named")
    parser.add_argument("--no-backward", dest="backward", action="store_false",
                        help="skip the backward passes (issue 16: VJP <= 2.5x the forward)")
    args = parser.parse_args(argv)
    backend = backends.get(args.backend)
    reason = backend.unavailable_reason()
    if reason is not None:
        print(f"backend {args.backend!r} is not available: {reason}", file=sys.stderr)
        return 2
    if args.t % 32:
        parser.error(f"--t must be a multiple of 32 (the grid2d case), got {args.t}")
    t, d, h = args.t, args.d, args.heads
    try:
        device = backend.check_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    if args.distributed_only:
        if not args.t_distributed:
            parser.error("--distributed-only needs --t-distributed")
        results = {"distributed": _distributed(args)}
        return _write(results, _distributed_targets(results["distributed"]), args, backend,
                      device)
    arr, (q, k, v) = _inputs(backend, args.dtype, h, t, d, device=device)
    cases = scheme_cases(arr, h, t, d, args.k_max, args.schemes)
    results: dict[str, Any] = {"schemes": [], "methods": [], "peer": None, "blocked": [],
                               "backward": []}
    def plain_call():
        return cases["plain"](q, k, v, "efficient")

    print(f"{backend.name} ({device}) {args.dtype}  batch 1, {h} heads, t = {t}, d = {d}  "
          f"(median of {args.repeat}, each scheme interleaved with plain attention; "
          f"'vs plain' is the median of the paired ratios)")
    print(f"{'scheme':<28} {'time ms':>9} {'vs plain':>9} {'peak MiB':>9}")
    for name, call in cases.items():
        seconds, plain, ratio = _timed_against(
            backend, lambda call=call: call(q, k, v, "efficient"), plain_call, args.repeat)
        peak = _peak_bytes(backend, lambda call=call: call(q, k, v, "efficient"), device)
        row = {"scheme": name, "seconds": seconds, "plain_seconds": plain,
               "ratio_to_plain": ratio, "peak_bytes": peak}
        results["schemes"].append(row)
        mib = "n/a" if peak is None else f"{peak / 2**20:.0f}"
        print(f"{name:<28} {seconds * 1e3:9.1f} {ratio:8.2f}x {mib:>9}")

    if args.backward:
        d_output = arr(1, h, t, d)
        print(f"\nbackward pass (the public VJP) against the forward pass of the same scheme"
              f", t = {t}")
        print(f"{'scheme':<28} {'VJP ms':>9} {'forward ms':>10} {'VJP/fwd':>8} {'peak MiB':>9}")
        for name, call in cases.items():
            seconds, forward, ratio = _timed_against(
                backend, lambda call=call: call.backward(q, k, v, d_output),
                lambda call=call: call(q, k, v, "efficient"), args.repeat)
            peak = _peak_bytes(backend, lambda call=call: call.backward(q, k, v, d_output),
                               device)
            results["backward"].append({"scheme": name, "seconds": seconds,
                                        "forward_seconds": forward,
                                        "ratio_to_forward": ratio, "peak_bytes": peak})
            mib = "n/a" if peak is None else f"{peak / 2**20:.0f}"
            print(f"{name:<28} {seconds * 1e3:9.1f} {forward * 1e3:10.1f} {ratio:7.2f}x "
                  f"{mib:>9}")

    results["rope"] = ([] if args.schemes is not None and "rope" not in args.schemes
                       else rope_comparison(backend, q, k, v, args.repeat))
    if results["rope"]:
        print(f"\nRoPE's scalings against plain RoPE (issue 28), t = {t}")
        print(f"{'variant':<28} {'time ms':>9} {'rope ms':>9} {'vs rope':>9}")
    for row in results["rope"]:
        print(f"{row['variant']:<28} {row['seconds'] * 1e3:9.1f} "
              f"{row['rope_seconds'] * 1e3:9.1f} {row['ratio_to_rope']:8.2f}x")

    if backend.name == "torch":
        bias_table = arr(h, 2 * args.k_max + 1)
        results["sdpa"] = sdpa_comparison(backend, q, k, v, bias_table, args.repeat)
        print(f"\nagainst torch scaled_dot_product_attention ({q.device})")
        print(f"{'case':<28} {'ours ms':>9} {'SDPA ms':>9} {'ours/SDPA':>10}")
        for row in results["sdpa"]:
            print(f"{row['case']:<28} {row['seconds'] * 1e3:9.1f} "
                  f"{row['sdpa_seconds'] * 1e3:9.1f} {row['ratio_to_sdpa']:9.2f}x")
        bounds = _sibling("torch_bounds")
        mask = sdpa_mask(bias_table, t, q.ndim)
        results["torch_bounds"] = bounds.torch_bounds(
            _timed_against, backend, cases, q, k, v, arr(1, h, t, d), mask, args.repeat,
            backward=args.backward)
        bounds.print_bounds(results["torch_bounds"])
        if args.flex != "off":
            flex = results["flex"] = flex_comparison(backend, q, k, v, bias_table, args.k_max,
                                                     args.repeat, args.flex)
            if "error" in flex:
                print(f"FlexAttention ({args.flex}): not run, {flex['error']}")
            else:
                print(f"{'case':<28} {'ours ms':>9} {'Flex ms':>9} {'ours/Flex':>10}")
                print(f"{flex['case'][:28]:<28} {flex['seconds'] * 1e3:9.1f} "
                      f"{flex['flex_seconds'] * 1e3:9.1f} {flex['ratio_to_flex']:9.2f}x"
                      f"  (outputs differ by at most {flex['max_abs_difference']:.1e})")
            slopes = np.asarray(rp.alibi_slopes(h), dtype=args.dtype)
            export_tables = {"bias": bias_table, "t5": arr(h, 32),
                             "alibi": backend.from_numpy(slopes, device)}
            results["flex_export"] = flex_export_comparison(backend, q, k, v, export_tables,
                                                            args.k_max, args.repeat, args.flex)
            print(f"\nFlexAttention export ({args.flex}) against a hand-written score_mod and "
                  f"SDPA with a (1, h, t, t) bias")
            print(f"{'scheme':<8} {'export ms':>9} {'hand ms':>9} {'exp/hand':>9} "
                  f"{'SDPA ms':>9} {'exp/SDPA':>9}  within 10%")
            for row in results["flex_export"]:
                if "error" in row:
                    print(f"{row['scheme']:<8} not run, {row['error']}")
                    continue
                met = "yes" if row["within_10_percent"] else "NO"
                print(f"{row['scheme']:<8} {row['seconds'] * 1e3:9.1f} "
                      f"{row['hand_written_seconds'] * 1e3:9.1f} "
                      f"{row['ratio_to_hand_written']:8.2f}x {row['sdpa_seconds'] * 1e3:9.1f} "
                      f"{row['ratio_to_sdpa']:8.2f}x  {met}")

    td = args.t_definition
    small = {}
    if td > 0:
        arr_d, (qd, kd, vd) = _inputs(backend, args.dtype, h, td, d, seed=1, device=device)
        small = scheme_cases(arr_d, h, td, d, args.k_max, args.schemes)
        print(f"\nefficient vs definition, t = {td}")
        print(f"{'scheme':<28} {'efficient':>9} {'definition':>10} {'speed-up':>9} "
              f"{'peak eff':>9} {'peak def':>9}")
    for name, call in small.items():
        scheme = name.split()[0]
        if scheme == "plain" or not catalog.get(scheme).methods:
            continue
        fast = _timed(backend, lambda call=call: call(qd, kd, vd, "efficient"), args.repeat)
        slow = _timed(backend, lambda call=call: call(qd, kd, vd, "definition"), 3)
        pf = _peak_bytes(backend, lambda call=call: call(qd, kd, vd, "efficient"), device)
        ps = _peak_bytes(backend, lambda call=call: call(qd, kd, vd, "definition"), device)
        results["methods"].append({"scheme": name, "t": td, "efficient_seconds": fast,
                                   "definition_seconds": slow, "efficient_peak_bytes": pf,
                                   "definition_peak_bytes": ps})
        mib = [("n/a" if p is None else f"{p / 2**20:.0f}") for p in (pf, ps)]
        print(f"{name:<28} {fast * 1e3:8.1f}m {slow * 1e3:9.1f}m {slow / fast:8.1f}x "
              f"{mib[0]:>9} {mib[1]:>9}")

    if importlib.util.find_spec("torch") is not None:  # the peer runs on torch
        peer = results["peer"] = peer_comparison(backend, device, h, t, d, args.dtype,
                                                 args.k_max, args.repeat)
        print(f"\npeer: HF BERT relative_key on torch CPU {peer['seconds'] * 1e3:.1f} ms against "
              f"our {peer['our_call']} {peer['our_seconds'] * 1e3:.1f} ms, interleaved: "
              f"{peer['ratio_to_our_shaw']:.2f}x (outputs differ by at most "
              f"{peer['max_abs_difference']:.1e})")

    if args.t_blocked:
        results["blocked"], results["unblocked"] = _blocked(args, backend, device)

    results["distributed"] = _distributed(args)

    ratio = {r["scheme"]: r["ratio_to_plain"] for r in results["schemes"]}
    targets = []
    if "general" in _schemes_of(cases):
        general = ratio[_label(cases, "general")]
        targets.append(("general (t_max = t) <= 1.4x plain", general, general <= 1.4))
    if "shaw" in _schemes_of(cases):
        shaw = ratio[_label(cases, "shaw")]
        targets.append((f"shaw K={args.k_max} keys+values <= 1.2x plain", shaw, shaw <= 1.2))
    targets += [(f"{name} <= 1.5x plain", value, value <= 1.5)
                for name, value in ratio.items() if name != "plain"]
    if results["peer"] is not None:
        p = results["peer"]["ratio_to_our_shaw"]
        targets.append(("peer BERT einsum >= 2x our shaw (keys only, interleaved)", p, p >= 2.0))
    targets += [(f"flex export {row['scheme']} <= 1.1x hand-written score_mod",
                 row["ratio_to_hand_written"], row["within_10_percent"])
                for row in results.get("flex_export", []) if "error" not in row]
    targets += [(f"rope {row['variant']} <= 1.1x plain rope", row["ratio_to_rope"],
                 row["ratio_to_rope"] <= 1.1)
                for row in results["rope"] if row["variant"] != "float32-angles"]
    if "torch_bounds" in results:
        targets += _sibling("torch_bounds").bound_targets(results["torch_bounds"])
    targets += [(f"{row['scheme'].split()[0]} backward <= 2.5x its forward",
                 row["ratio_to_forward"], row["ratio_to_forward"] <= 2.5)
                for row in results["backward"]]
    for row in results["blocked"]:
        label = f"{row['scheme']}{' causal' if row['causal'] else ''}"
        if row["peak_bytes"] is not None:
            gib = row["peak_bytes"] / 2**30
            targets.append((f"blocked {label} t={row['t']} peak < 2 GiB", gib, gib < 2))
        if row.get("throughput_to_unblocked") is not None:
            share = row["throughput_to_unblocked"]
            targets.append((f"blocked {label} t={row['t']} throughput >= 50% of unblocked "
                            f"t={results['unblocked']['t']}", share, share >= 0.5))
    standard = (backend.name, args.dtype, h, t, d, args.k_max) == ("numpy", "float32", 8, 1024,
                                                                    64, 16)
    print("\ntargets (issues 7, 14, 16, 28 and 30)" + ("" if standard else
          ": set for NumPy float32, 8 heads, t = 1024, d = 64, K = 16; this run differs, "
          "so they are for reference only"))
    for text, value, met in targets:
        print(f"  {'met   ' if met else 'MISSED'} {text}: {value:.2f}")
    results["targets"] = [{"target": a, "value": b, "met": c, "applies": standard}
                          for a, b, c in targets]
    return _write(results, _distributed_targets(results["distributed"]), args, backend, device)


def _blocked(args: argparse.Namespace, backend: Any, device: str
             ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """`relpos_ref.blocked_attention` at ``--t-blocked``, one head; plain unblocked beside it."""
    tb, d = args.t_blocked, args.d
    arr_b, (qb, kb, vb) = _inputs(backend, args.dtype, 1, tb, d, seed=2, device=device)
    key = arr_b(2 * args.k_max + 1, d)
    bias = arr_b(1, 2 * args.k_max + 1)
    unblocked = None
    if args.t_unblocked:
        tu = args.t_unblocked
        _, (qu, ku, vu) = _inputs(backend, args.dtype, 1, tu, d, seed=3, device=device)
        seconds = _timed(backend, lambda: rp.attention(qu, ku, vu), 1)
        unblocked = {"t": tu, "seconds": seconds, "pairs_per_second": tu * tu / seconds}
        print(f"\nunblocked plain attention, t = {tu}, 1 head: {seconds:.2f} s "
              f"({unblocked['pairs_per_second'] / 1e9:.2f} G pairs/s)")
    available = sorted(rp.kernels.blocked_kernels(backend.name)) if rp.kernels.enabled() else []
    print(f"\nrelpos_ref.blocked_attention, t = {tb}, 1 head, d = {d}, block {args.block_size} "
          f"(kernels for {backend.name}: {', '.join(available) or 'none'})")
    rows = []
    for name, tables, causal in (("plain", (), False), ("plain", (), True),
                                 ("bias", (bias,), False), ("alibi", (), True),
                                 ("shaw", (key, key), True)):
        def call(name=name, tables=tables, causal=causal):
            return rp.blocked_attention(qb, kb, vb, *tables, scheme=name, causal=causal,
                                        block_size=args.block_size)
        # timed as the unblocked call is (a warm-up, then timed calls), its peak apart
        seconds = _timed(backend, call, 1)
        peak = _peak_bytes(backend, call, device)
        row = {"scheme": name, "causal": causal, "t": tb, "seconds": seconds,
               "peak_bytes": peak,
               "kernel": rp.kernels.enabled() and name in rp.kernels.blocked_kernels(backend.name)}
        if unblocked is not None and name == "plain" and not causal:
            row["throughput_to_unblocked"] = tb * tb / seconds / unblocked["pairs_per_second"]
        rows.append(row)
        mib = "n/a" if peak is None else f"{peak / 2**20:.0f} MiB"
        share = row.get("throughput_to_unblocked")
        print(f"{name + (' causal' if causal else ''):<28} {seconds:8.1f} s  peak {mib}"
              + ("" if share is None else f"  throughput {share:.0%} of unblocked")
              + ("  (kernel)" if row["kernel"] else "  (specification)"))
    return rows, unblocked


def _distributed(args: argparse.Namespace) -> list[dict[str, Any]]:
    if not args.t_distributed:
        return []
    return distributed_blocked(args.t_distributed, d=args.d, dtype=args.dtype, k_max=args.k_max,
                               block=args.block_size, chunk=args.chunk, workers=args.workers,
                               memory_limit=args.worker_memory, malloc=args.malloc)


def _distributed_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 17: each case completes, no worker lost, peak under the limit and the bound."""
    targets = []
    for row in rows:
        label = f"distributed {row['scheme']}{' causal' if row['causal'] else ''} t={row['t']}"
        done = "error" not in row and row["workers_lost"] == 0
        targets.append((f"{label} completes, no worker lost", float(done), done))
        if row["peak_bytes"] is not None:
            mib = row["peak_bytes"] / 2**20
            targets.append((f"{label} worker peak MiB < memory_limit", mib,
                            row["peak_bytes"] < row["memory_limit_bytes"]))
            targets.append((f"{label} worker peak MiB <= bound of relpos_ref._blocked_dask", mib,
                            row["peak_bytes"] <= row["bound_bytes"]))
    if targets:
        print("\ntargets (issue 17)")
        for text, value, met in targets:
            print(f"  {'met   ' if met else 'MISSED'} {text}: {value:.2f}")
    return [{"target": a, "value": b, "met": c, "applies": True} for a, b, c in targets]


def _write(results: dict[str, Any], targets: list[dict[str, Any]], args: argparse.Namespace,
           backend: Any, device: Any) -> int:
    results["targets"] = results.get("targets", []) + targets
    results["config"] = vars(args) | {"out": str(args.out)}
    results["machine"] = _machine(backend) | {"device": device}
    results["versions"] = _versions(backend)
    results["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = "distributed" if args.distributed_only else backend.name
    path = args.out / f"{stamp}-{name}-{args.dtype}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
