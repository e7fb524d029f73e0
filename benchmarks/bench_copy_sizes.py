"""What a plain copy reaches at an op's own size: the ceiling an op's "% of copy" is read against.

Every benchmark divides by one copy bandwidth, measured on 1 GB (benchmarks/common.py). An op that
moves 64 MB a call also pays each launch's ramp and tail, which a 1 GB copy hides; this prints, per
size, the copy timed the way the op benches time ops (10 back-to-back calls in one CUDA graph,
replayed: common.graph_time_ms), as GB/s and as % of the 1 GB copy. Two copies, because inside a
CUDA graph torch's ``copy_`` of a large contiguous tensor can become a memcpy node run by a copy
engine rather than SMs: ``copy_`` and an elementwise kernel (``torch.mul(a, 1, out=b)``), whose
bytes are the same.

    python benchmarks/bench_copy_sizes.py [--sizes-mb 16 32 64 ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import copy_bandwidth_gbs, graph_time_ms, require_gpu  # noqa: E402

DEFAULT_SIZES_MB = (16, 32, 64, 128, 256, 512, 1024)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=list(DEFAULT_SIZES_MB),
                        help="bytes of one side of the copy, in MiB")
    args = parser.parse_args(argv)
    require_gpu("bench_copy_sizes.py")
    reference = copy_bandwidth_gbs()
    print(f"## Copy bandwidth by size (the benches' denominator, a 1 GB copy: {reference:.0f} GB/s)")
    print(f"{'MiB a side':>10} {'copy_ GB/s':>11} {'%':>6} {'mul GB/s':>9} {'%':>6}")
    for mb in args.sizes_mb:
        src = torch.randn(mb * (1 << 20) // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        moved = 2 * src.numel() * src.element_size()
        rates = [moved / (graph_time_ms(fn) * 1e-3) / 1e9
                 for fn in (lambda: dst.copy_(src), lambda: torch.mul(src, 1, out=dst))]
        print(f"{mb:>10} " + " ".join(f"{r:>{w}.0f} {100 * r / reference:>5.1f}%" for r, w in zip(rates, (11, 9))),
              flush=True)
        del src, dst


if __name__ == "__main__":
    main()
