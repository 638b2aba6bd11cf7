"""Every variant of the Triton kernels, built for a GPU that need not be here.

`variants` lowers a typical call of every catalog scheme (a mask, an offset,
per-head tables, causal and not; float32, float16, bfloat16 and float64) on
CPU tensors and reads the kernel's arguments and ``constexpr`` options from
them, exactly as a launch would (`relpos_ref.kernels._triton_launch`).
`build` compiles one through the kernel's JIT, as a launch would, for a
target (Hopper, ``GPUTarget("cuda", 90, 32)``, by default) named by a
stand-in driver, and reports what the build says:
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
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Build", "backward_variants", "branched_products", "build", "variants"]

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

    The typical calls of `variants` (not causal, but for a causal-only scheme) whose forms
    the backward kernels cover (`relpos_ref.kernels._triton_vjp.covers`).
    """
    import torch

    from ..lowering import lower
    from ._triton_backward import attention_dkdv, attention_dq
    from ._triton_launch import forward_arguments
    from ._triton_vjp import backward_arguments, covers

    found = {}
    for scheme in schemes:
        for name in dtypes:
            try:
                args, kwargs = _typical(scheme, getattr(torch, name), False)
                form = lower(scheme, *args, **kwargs)
            except ValueError:  # a causal-only scheme (FoX): its causal call
                args, kwargs = _typical(scheme, getattr(torch, name), True)
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


class _TargetOnly:
    """A stand-in for triton's GPU driver: it names the target to build for, launches nothing.

    The three calls a kernel's JIT makes before compiling (triton 3.6 and 3.9). Device
    numbers differ by target, so the JIT's per-device caches do not mix targets.
    """

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 1000 + int(self.target.arch)

    def get_current_stream(self, device: Any = None) -> int:
        return 0


class Build(dict):
    """One variant's build: ``stages``, ``shared``, ``registers``, ``spills``, ``tensor_cores``,
    ``wgmma``, ``branched_products``.

    ``tensor_cores``: its products use the tensor cores (``wgmma`` or
    ``mma``); ``wgmma``: Hopper's warp-group instructions in particular;
    ``branched_products``: products under a branch inside a loop
    (`branched_products`), which triton 3.6's software pipeliner fails on.
    """


def branched_products(ttir: str) -> int:
    r"""How many ``tt.dot`` of a kernel's Triton IR sit in an ``scf.if`` inside an ``scf.for``.

    Triton 3.6's software pipeliner ("PassManager::run failed" in
    ``TritonGPUPipeline``) failed on such a product in the 16-bit window
    variants at tiles of 64 (Hopper's warp-group products); the forward
    kernel therefore runs its key tiles in three loops without a branch on
    the tile. Regions are read from the IR's braces.

    Examples
    --------
    >>> branched_products("scf.for %j = %a to %b step %c {\n  %x = scf.if %p -> (f32) {\n"
    ...                   "    %y = tt.dot %q, %k, %z\n  } else {\n  }\n}")
    1
    >>> branched_products("%x = scf.if %p -> (f32) {\n  %y = tt.dot %q, %k, %z\n}")
    0
    """
    regions: list[str] = []
    found = 0
    for line in ttir.splitlines():
        text = line.strip()
        if text.startswith("}") and not text.startswith("} else {"):
            if regions:
                regions.pop()
            continue
        if "tt.dot " in text and "for" in regions and "if" in regions[regions.index("for"):]:
            found += 1
        if text.endswith("{") and not text.startswith("} else {"):
            regions.append("for" if "scf.for " in text else "if" if "scf.if " in text
                           else "other")
    return found


#: Shared memory one block may take, by compute capability (an H100 or H200: 227 KiB).
SHARED_LIMITS = {90: 232448, 80: 166912}


def build(args: list[Any], constants: dict[str, Any], *, capability: int = 90,
          num_warps: int = 4, num_stages: int | None = None, kernel: Any = None) -> Build:
    """Compile one variant of `kernel` (the forward kernel by default) for ``sm_<capability>``.

    Through the kernel's own JIT (``warmup``, with `_TargetOnly` as the
    driver), so that the build is the one a launch with these arguments
    compiles: the JIT marks pointers aligned to 16 bytes and integers
    divisible by 16, and the software pipeliner works from those marks (a
    build from the bare signature passed where triton 3.6 on a GPU failed,
    "PassManager::run failed", and spilled differently). `num_stages`: the
    pipeline's stages; where ``None``, those a launch would take
    (`relpos_ref.kernels._triton_launch.STAGE_CHOICES`: Triton's default, or
    fewer where the build exceeds the shared memory of `SHARED_LIMITS`),
    reported as ``stages`` (``None``: the default). Its resources are read
    from the build.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    from ._triton_forward import attention_forward
    from ._triton_launch import STAGE_CHOICES

    kernel = kernel or attention_forward
    choices = STAGE_CHOICES if num_stages is None else (num_stages,)
    limit = SHARED_LIMITS.get(capability, SHARED_LIMITS[90])
    config = triton.runtime.driver
    previous = getattr(config, "_active", None)  # None: made from the machine when asked for
    config.set_active(_TargetOnly(GPUTarget("cuda", capability, 32)))
    try:
        for stages in choices:
            options = {"num_warps": num_warps, **({} if stages is None else
                                                  {"num_stages": stages})}
            compiled = kernel.warmup(*args, grid=(1,), **constants, **options)
            if int(compiled.metadata.shared) <= limit:
                break
    finally:
        config.set_active(previous)  # reset_active() would make one: none on a CPU machine
    ptx = compiled.asm["ptx"]
    registers, spills = _ptxas_resources(ptx, capability)
    return Build(stages=stages, shared=int(compiled.metadata.shared), registers=registers,
                 branched_products=branched_products(compiled.asm["ttir"]),
                 spills=spills,
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


def _report(name: str, warps: int, compile_one: Any) -> bool:
    # one JSON line: the build's resources, or the error that stopped it (the others go on)
    try:
        report: dict[str, Any] = dict(compile_one())
    except Exception as exc:  # triton's compiler raises RuntimeError, ptxas CalledProcessError
        report = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    print(json.dumps({"variant": name, "warps": warps, **report}), flush=True)
    return "error" not in report


def main(argv: list[str] | None = None) -> int:
    """Build the variants asked for, one JSON line each; exit 1 if any failed to build."""
    import argparse

    parser = argparse.ArgumentParser(description="Build the Triton kernels' variants for sm_90.")
    parser.add_argument("--schemes", help="comma-separated catalog names (default: all)")
    parser.add_argument("--dtypes", help="comma-separated dtype names (default: all four)")
    parser.add_argument("--not-causal", action="store_true", help="only calls without causal")
    parser.add_argument("--stages", type=int, default=None,
                        help="software-pipelining stages (default: Triton's)")
    parser.add_argument("--backward", action="store_true",
                        help="the backward kernels' variants instead (needs --schemes, --dtypes)")
    args = parser.parse_args(argv)
    built = []
    if args.backward:
        for name, (kernel, arguments, constants, warps) in backward_variants(
                tuple(args.schemes.split(",")), tuple(args.dtypes.split(","))).items():
            built.append(_report(name, warps, partial(
                build, arguments, constants, num_warps=warps, num_stages=args.stages,
                kernel=kernel)))
        return 0 if all(built) else 1
    chosen = variants(tuple(args.schemes.split(",")) if args.schemes else None,
                      tuple(args.dtypes.split(",")) if args.dtypes else None,
                      causal=(False,) if args.not_causal else (False, True))
    for name, (arguments, constants, warps) in chosen.items():
        built.append(_report(name, warps, partial(build, arguments, constants, num_warps=warps,
                                                  num_stages=args.stages)))
    return 0 if all(built) else 1


if __name__ == "__main__":
    sys.exit(main())
