"""FastLayerNorm (apex.contrib.layer_norm) beside FusedLayerNorm, torch eager and torch.compile.

FastLayerNorm runs FusedLayerNorm's kernels (one implementation), so its rows should equal
FusedLayerNorm's. This runs bench_norms.py's LayerNorm table (same shapes, bytes and timing:
CUDA-graph replays of 10 back-to-back calls; ``--eager`` for back-to-back eager calls).

    python benchmarks/contrib/layer_norm/bench_fast_layer_norm.py [--dtypes bf16 fp32] [--eager]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks.normalization.bench_norms import main  # noqa: E402

if __name__ == "__main__":
    main(["--kinds", "layer", "--impls", "apex", "apex FastLayerNorm", "torch", "torch.compile", *sys.argv[1:]])
