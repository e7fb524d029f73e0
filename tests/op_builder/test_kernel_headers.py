"""The shared kernel headers (csrc/include/apex) as nvcc compiles them: properties a GPU test cannot
see, read from the PTX, with no GPU. Needs nvcc (skipped without it)."""
import re
import subprocess
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

from apex.op_builder import toolchain
from apex.op_builder.plan import NVCC_FLAGS
from jit_helpers import REPO

NVCC = toolchain.nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc")

# The kernel where the split was found: the cross-entropy backward writes each row of the gradient as
# 16-byte vectors of bf16/fp16 (then apex/row_softmax.cuh's write_scaled_softmax, unrolled 4 times;
# since session 29 xentropy_16bit.cuh's backward_kernel, whose packs must stay whole as well). A
# small stand-alone kernel of the same shape compiled to whole vector stores even before the fix, so
# the test compiles the real one.
XENTROPY_CUDA = REPO / "csrc" / "xentropy" / "xentropy_cuda.cu"


def _ptx(source: Path, tmp_path: Path) -> str:
    ptx = tmp_path / "kernel.ptx"
    includes = [f"-I{REPO / 'csrc' / 'include'}", *(f"-I{d}" for d in include_paths())]
    flags = [f for f in NVCC_FLAGS if f != "-lineinfo"]
    subprocess.run([NVCC, *flags, *includes, "-DAPEX_WITH_CUDA", "-arch=sm_90", "-ptx", str(source), "-o", str(ptx)],
                   check=True, capture_output=True, text=True)
    return ptx.read_text()


def _kernels(ptx: str) -> dict[str, str]:
    bodies = re.split(r"\.visible \.entry|\.entry", ptx)[1:]
    return {body.split("(")[0].strip(): body for body in bodies}


def test_16_byte_vectors_of_16_bit_values_are_one_store_instruction(tmp_path):
    """nvcc split store_vector's struct copy into four st.global.v2.u16 (a uint4 built from the same bits
    into four st.global.u32): four store instructions per vector held the xentropy backward to a fifth
    of copy bandwidth on an H100 (8192 x 128256 bf16: 5.5 ms, 2.2 ms once whole). Each vector must
    stay one 16-byte store."""
    kernels = {name: body for name, body in _kernels(_ptx(XENTROPY_CUDA, tmp_path)).items()
               if "backward_kernel" in name and "bits16" in name}  # the 16-bit types' vectorised backward
    assert len(kernels) == 2  # Half, BFloat16
    for name, body in kernels.items():
        stores = re.findall(r"\bst(?:\.global)?\.[\w.]+", body)
        whole = [s for s in stores if re.fullmatch(r"st(\.global)?\.v4\.(b32|u32)", s)]
        split = [s for s in stores if re.fullmatch(r"st\.global\.(v2\.u16|u32|v2\.u32)", s)]
        assert len(whole) >= 4 and not split, (name, stores)
