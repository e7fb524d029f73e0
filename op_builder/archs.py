"""Which GPU architectures a build targets, and whether a built library covers the visible GPUs."""
from __future__ import annotations

import os

# Archs compiled when no GPU is visible and TORCH_CUDA_ARCH_LIST is unset (prebuilds, checks):
# Turing to Blackwell, plus PTX of the newest so later GPUs can JIT it.
DEFAULT_CUDA_ARCHS = "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"


def target_archs(for_this_machine: bool) -> str:
    """TORCH_CUDA_ARCH_LIST (PYTORCH_ROCM_ARCH on ROCm) when set; else, for a build used here, the
    visible GPUs'; else the default list."""
    import torch

    if torch.version.hip:
        return os.environ.get("PYTORCH_ROCM_ARCH", "")
    configured = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if configured and configured != "native":
        return ";".join(configured.replace(" ", ";").split(";")).strip(";")
    if for_this_machine and torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        return ";".join(f"{major}.{minor}" for major, minor in sorted(caps))
    return DEFAULT_CUDA_ARCHS


def ptx_only_flags(archs: str) -> list[str]:
    """nvcc flags that compile device code to PTX only (no ptxas, no SASS) for each arch: what a
    compile check needs to know the CUDA sources compile, at a fraction of the time. Naming any
    -gencode also stops torch's builder from adding its own arch flags."""
    numbers = sorted({_arch_num(a) for a in archs.split(";") if a.strip()})
    return [f"-gencode=arch=compute_{n},code=compute_{n}" for n in numbers]


def covers_visible_gpus(archs: str) -> bool:
    """Whether a library built for ``archs`` runs on every visible GPU (exact SASS, or PTX it can JIT)."""
    import torch

    if torch.version.hip or not torch.cuda.is_available():
        return True
    built = [a.strip() for a in archs.split(";") if a.strip()]
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        need = major * 10 + minor
        if not any(_arch_num(a) == need or (a.endswith("+PTX") and _arch_num(a) <= need) for a in built):
            return False
    return True


def _arch_num(arch: str) -> int:
    major, minor = arch.strip().replace("+PTX", "").split(".")
    return int(major) * 10 + int(minor[0])
