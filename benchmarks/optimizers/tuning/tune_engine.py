"""Times variants of the CUDA multi-tensor engine side by side on the GPT parameter set.

Each variant is engine_variant.cu compiled with other launch-shape defines (see
csrc/include/apex/multi_tensor_apply.cuh, cuda::LaunchConfig) into an op library of its own
(torch.ops.apex.tune_<variant>_*); the variants build in parallel into the JIT cache
(--build-only stops there), then every op is timed for every variant in turn, twice, so the
spread between the two passes shows the noise. Besides the 289 GPT tensors each op also runs on
one flat tensor of the same size (what the multi-tensor bookkeeping costs), and the host time of
a call (before its kernels run) is reported.

    python benchmarks/optimizers/tuning/tune_engine.py [--variants 256x32/16,256x8/8]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(HERE.parent)]

from benchmarks.common import copy_bandwidth_gbs, require_gpu, time_ms  # noqa: E402
from apex.op_builder.builder import CUDAOpBuilder  # noqa: E402
from apex.op_builder.jit import load_builder  # noqa: E402
from param_sets import gpt_medium_shapes  # noqa: E402


def config(threads: int, elems_few: int, elems_many: int, min_blocks: int = 1) -> list[str]:
    """Defines of one cuda::LaunchConfig: threads per block, fp32 elements per thread for kernels of
    one or two lists / of more lists, min resident blocks per SM."""
    return [f"-DTUNE_THREADS={threads}", f"-DTUNE_ELEMS_FEW={elems_few}", f"-DTUNE_ELEMS_MANY={elems_many}",
            f"-DTUNE_MIN_BLOCKS={min_blocks}"]


# name -> defines: "threads x elements (1-2 lists) / elements (more lists)". The first is the default.
VARIANTS = {
    "256x32/16": config(256, 32, 16),
    "256x16/16": config(256, 16, 16),
    "256x8/8": config(256, 8, 8),
    "128x16/16": config(128, 16, 16),
    "256x64/32": config(256, 64, 32),
}
BYTES_PER_PARAM = {"adamw": 28, "l2norm": 4, "scale": 8}


def build(name: str, defines: list[str]):
    """The ops of variant `name` (torch.ops.apex.<library>_*), from the JIT cache or built now."""
    library = "tune_" + "_".join(filter(None, re.split(r"[x/]", name)))

    class Variant(CUDAOpBuilder):
        NAME = library
        SOURCE_DIR = os.path.relpath(HERE, ROOT / "csrc")
        EXTRA_CXX_FLAGS = [f"-DTUNE_NAME={library}"]
        EXTRA_NVCC_FLAGS = [*defines, f"-DTUNE_NAME={library}"]

        def include_dirs(self):
            return [ROOT / "csrc" / "include", ROOT / "csrc" / "multi_tensor"]

    load_builder(Variant())
    return lambda op: getattr(torch.ops.apex, f"{library}_{op}")


def host_us(fn, iters: int = 20) -> float:
    """Median host time of one call (kernels queued, not waited for)."""
    samples = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--build-only", action="store_true", help="build (into the JIT cache) and stop")
    args = parser.parse_args()
    require_gpu(__file__)
    names = args.variants.split(",")
    with ThreadPoolExecutor(len(names)) as pool:
        modules = dict(zip(names, pool.map(lambda n: build(n, VARIANTS[n]), names)))
    if args.build_only:
        return

    shapes = gpt_medium_shapes()
    gen = torch.Generator(device="cuda").manual_seed(0)
    lists = {}
    for layout, these in (("289", shapes), ("flat", [(sum(torch.Size(s).numel() for s in shapes),)])):
        params = [torch.randn(s, device="cuda", generator=gen).mul_(0.02) for s in these]
        grads = [torch.randn(s, device="cuda", generator=gen).mul_(1e-3) for s in these]
        lists[layout] = (params, grads, [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params])
    numel = sum(p.numel() for p in lists["289"][0])
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    copy_gbs = copy_bandwidth_gbs()

    def calls(module, layout):
        p, g, m, v = lists[layout]
        step = [0]

        def adamw():
            step[0] += 1
            module("adamw")(flag, g, p, m, v, 1e-4, step[0])

        return {
            "adamw": adamw,
            "l2norm": lambda: module("l2norm")(flag, g),
            "scale": lambda: module("scale")(flag, g, g, 1.0),
        }

    reference = torch.linalg.vector_norm(torch.cat([g.flatten() for g in lists["289"][1]]).double())
    for name in names:
        total, per_tensor = modules[name]("l2norm")(flag, lists["289"][1])
        error = abs(total.double().item() - reference.item()) / reference.item()
        assert error < 1e-4 and per_tensor.numel() == len(shapes), f"{name}: norm off by {error:.2e}"

    results: dict[tuple[str, str, str], list[float]] = {}
    hosts: dict[tuple[str, str, str], float] = {}
    for _ in range(2):  # two passes: their spread is the noise
        for op in BYTES_PER_PARAM:
            for layout in ("289", "flat"):
                for name in names:
                    fn = calls(modules[name], layout)[op]
                    results.setdefault((op, layout, name), []).append(time_ms(fn, warmup=5, iters=30))
                    if (op, layout, name) not in hosts:
                        hosts[(op, layout, name)] = host_us(fn)
    torch.cuda.synchronize()

    print(f"\n## engine variants, {len(shapes)} fp32 tensors ({numel / 1e6:.1f}M params) and one flat tensor of the "
          f"same size; copy bandwidth {copy_gbs:.0f} GB/s; GPU {torch.cuda.get_device_name()}")
    header = f"{'op':<7} {'variant':<10} {'blk/SM':>6} {'289: ms (pass1/pass2)':>24} {'% copy':>7} {'flat: ms':>9} " \
             f"{'% copy':>7} {'host us 289/flat':>17}"
    print(header)
    print("-" * len(header))
    for index, op in enumerate(BYTES_PER_PARAM):
        for name in names:
            t289, tflat = results[(op, "289", name)], results[(op, "flat", name)]
            best289, bestflat = min(t289), min(tflat)
            pct = lambda ms: 100 * BYTES_PER_PARAM[op] * numel / (ms * 1e-3) / 1e9 / copy_gbs  # noqa: E731
            blocks = modules[name]("blocks_per_sm")(flag)[index]
            host289, hostflat = hosts[(op, "289", name)], hosts[(op, "flat", name)]
            print(f"{op:<7} {name:<10} {blocks:>6} {t289[0]:>11.3f}/{t289[1]:<11.3f} {pct(best289):>6.1f}% "
                  f"{bestflat:>9.3f} {pct(bestflat):>6.1f}% {host289:>8.1f}/{hostflat:<8.1f}")


if __name__ == "__main__":
    main()
