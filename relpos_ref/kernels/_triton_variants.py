"""Every variant of the Triton kernels, built for a GPU that need not be here.

`variants` lowers a typical call of every catalog scheme (a mask, an offset,
per-head tables, causal and not; float32, float16, bfloat16 and float64) on
CPU tensors and reads the kernel's arguments and ``constexpr`` options from
them, exactly as a launch would (`relpos_ref.kernels._triton_launch`).
`build` compiles one with ``triton.compile`` for a target (Hopper,
``GPUTarget("cuda", 90, 32)``, by default) and reports what the build says:
shared memory, registers and spills (from ``ptxas -v`` on the PTX), and
whether its products use the tensor cores' instructions (``wgmma`` on
Hopper, ``mma`` before).

Run as a module it prints one JSON line per variant; triton must compile
(``TRITON_INTERPRET`` unset), and no GPU is needed::

    python -m relpos_ref.kernels._triton_variants
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Build", "backward_variants", "build", "variants"]

SCHEMES_WITH = {"grid2d": {"height": 4, "width": 8},
                "swin": {"window_height": 4, "window_width": 8},
                "swinv2": {"window_height": 4, "window_width": 8}}


def _typical(scheme: str, dtype: Any, causal: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import torch

    from .. import catalog

    entry = catalog.get(scheme)
    grid = scheme in SCHEMES_WITH
    t = 32
    sizes = {"K": 8, "M": 32, "t_max": 32, "height": 4, "width": 8, "buckets": 32,
             "d_model": 64, "span": 16, "rows": 32}
    shapes = entry.table_shapes(entry.sizes_from({"t_q": t, "t_k": t, **sizes}), d=64,
                                d_v=64, heads=2, include={"values": True, "biases": True,
                                                          "c2p": True, "p2c": True})
    rng = np.random.default_rng(0)

    def tensor(*shape: int) -> Any:
        return torch.tensor(rng.standard_normal(shape), dtype=dtype)

    args = (tensor(2, t, 64), tensor(2, t, 64), tensor(2, t, 64),
            *entry.table_args({n: tensor(*s) for n, s in shapes.items()}))
    kwargs: dict[str, Any] = dict(SCHEMES_WITH.get(scheme, {}))
    kwargs["mask"] = torch.tensor(rng.random((t, t)) < 0.9)
    if not grid:
        kwargs.update(q_offset=0, causal=causal)
    if scheme == "t5":
        kwargs["max_distance"] = 64
    if scheme == "plain":
        kwargs["bias"] = tensor(2, t, t)
    return args, kwargs


def variants(schemes: tuple[str, ...] | None = None, dtypes: tuple[str, ...] | None = None,
             causal: tuple[bool, ...] = (False, True),
             ) -> dict[str, tuple[list[Any], dict[str, Any], int]]:
    """Name -> the kernel's arguments, ``constexpr`` options and warps, per scheme and dtype.

    Causal and not; schemes whose options differ only in values share a
    variant, so every distinct set of options appears once. `schemes` and
    `dtypes` (names) choose a part; `causal`, which causal structures.
    """
    import torch

    from .. import catalog
    from ..lowering import lower
    from ._triton_launch import fits, forward_arguments

    found: dict[str, tuple[list[Any], dict[str, Any]]] = {}
    seen = set()
    for scheme in schemes or catalog.names(plain=True):
        for dtype in (getattr(torch, n) for n in dtypes or ("float32", "float16", "bfloat16",
                                                             "float64")):
            for structure in causal:
                if structure and scheme in SCHEMES_WITH:
                    continue
                args, kwargs = _typical(scheme, dtype, structure)
                entry = catalog.get(scheme)
                tables = args[3:]
                try:
                    form = lower(scheme, *args[:3], *tables, **kwargs)
                except ValueError:
                    if structure:
                        raise
                    continue  # a causal-only scheme (FoX): no variant without causal
                if not fits(form):
                    msg = f"the typical call of {scheme!r} does not fit the kernel's slots"
                    raise AssertionError(msg)
                launch = forward_arguments(form)
                key = tuple(sorted((k, str(v)) for k, v in launch.constants.items()))
                if key in seen:
                    continue
                seen.add(key)
                name = f"{entry.name}-{str(dtype).rsplit('.', 1)[-1]}" + ("-causal" * structure)
                found[name] = (launch.args, launch.constants, launch.warps)
    return found


def backward_variants(schemes: tuple[str, ...], dtypes: tuple[str, ...]
                      ) -> dict[str, tuple[Any, list[Any], dict[str, Any], int]]:
    """Name -> a backward kernel, its arguments, options and warps, per scheme and dtype.

    The typical calls of `variants` (not causal) whose forms the backward
    kernels cover (`relpos_ref.kernels._triton_vjp.covers`).
    """
    import torch

    from ..lowering import lower
    from ._triton_backward import attention_dkdv, attention_dq
    from ._triton_launch import forward_arguments
    from ._triton_vjp import backward_arguments, covers

    found = {}
    for scheme in schemes:
        for name in dtypes:
            args, kwargs = _typical(scheme, getattr(torch, name), False)
            form = lower(scheme, *args, **kwargs)
            if not covers(form):
                continue
            launch = forward_arguments(form, store_lse=True)
            backward = backward_arguments(form, launch, torch.ones_like(args[2]))
            for kernel, (_, arguments, constants) in ((attention_dq, backward.dq),
                                                      (attention_dkdv, backward.dkdv)):
                label = kernel.fn.__name__.removeprefix("attention_")
                found[f"{scheme}-{name}-{label}"] = (kernel, arguments, constants,
                                                     backward.warps)
    return found


def _signature(args: list[Any], constants: dict[str, Any], kernel: Any = None
               ) -> dict[str, str]:
    from ._triton_forward import attention_forward

    names = [n for n in (kernel or attention_forward).arg_names if n not in constants]
    types = {}
    for name, value in zip(names, args, strict=False):
        if hasattr(value, "data_ptr"):
            kind = str(value.dtype).rsplit(".", 1)[-1]
            types[name] = "*" + {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                                 "float64": "fp64", "int32": "i32", "uint8": "u8",
                                 "int64": "i64"}[kind]
        elif isinstance(value, bool):
            types[name] = "i1"
        elif isinstance(value, int):
            types[name] = "i32"
        else:
            types[name] = "fp32"
    for name in constants:
        types[name] = "constexpr"
    return types


class Build(dict):
    """One variant's build: ``shared``, ``registers``, ``spills``, ``tensor_cores``, ``wgmma``.

    ``tensor_cores``: its products use the tensor cores (``wgmma`` or
    ``mma``); ``wgmma``: Hopper's warp-group instructions in particular.
    """


def build(args: list[Any], constants: dict[str, Any], *, capability: int = 90,
          num_warps: int = 4, kernel: Any = None) -> Build:
    """Compile one variant of `kernel` (the forward kernel by default) for ``sm_<capability>``.

    Its resources are read from the build.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ._triton_forward import attention_forward

    kernel = kernel or attention_forward
    source = ASTSource(fn=kernel, signature=_signature(args, constants, kernel),
                       constexprs=dict(constants))
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                              options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    registers, spills = _ptxas_resources(ptx, capability)
    return Build(shared=int(compiled.metadata.shared), registers=registers, spills=spills,
                 tensor_cores=bool(re.search(r"\b(?:wgmma|mma)\.", ptx)),
                 wgmma=bool(re.search(r"\bwgmma\.", ptx)))


def _ptxas_resources(ptx: str, capability: int) -> tuple[int, int]:
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas  # the ptxas triton builds with

    ptxas = get_ptxas(capability).path
    arch = f"sm_{capability}a" if capability == 90 else f"sm_{capability}"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.ptx"
        path.write_text(ptx)
        report = subprocess.run([str(ptxas), "-v", f"--gpu-name={arch}", str(path), "-o",
                                 str(Path(folder) / "kernel.cubin")], capture_output=True,
                                text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report))
    return registers, spills


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Build the Triton kernels' variants for sm_90.")
    parser.add_argument("--schemes", help="comma-separated catalog names (default: all)")
    parser.add_argument("--dtypes", help="comma-separated dtype names (default: all four)")
    parser.add_argument("--not-causal", action="store_true", help="only calls without causal")
    parser.add_argument("--backward", action="store_true",
                        help="the backward kernels' variants instead (needs --schemes, --dtypes)")
    args = parser.parse_args(argv)
    if args.backward:
        for name, (kernel, arguments, constants, warps) in backward_variants(
                tuple(args.schemes.split(",")), tuple(args.dtypes.split(","))).items():
            report = build(arguments, constants, num_warps=warps, kernel=kernel)
            print(json.dumps({"variant": name, "warps": warps, **report}), flush=True)
        return 0
    chosen = variants(tuple(args.schemes.split(",")) if args.schemes else None,
                      tuple(args.dtypes.split(",")) if args.dtypes else None,
                      causal=(False,) if args.not_causal else (False, True))
    for name, (arguments, constants, warps) in chosen.items():
        report = build(arguments, constants, num_warps=warps)
        print(json.dumps({"variant": name, "warps": warps, **report}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
