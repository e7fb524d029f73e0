"""Launching amp_C's multi-tensor kernels over lists that may mix devices and dtypes."""
from collections import defaultdict

import torch


def _fused_kernels():
    # Imported on first use: `import apex.amp` must not compile anything.
    import amp_C
    from apex.multi_tensor_apply import multi_tensor_applier

    return amp_C, multi_tensor_applier


def _group_by_device_and_dtypes(tensor_lists):
    """Split parallel tensor lists into groups one launch can take: one device, one dtype per list
    (the kernels dispatch on the first tensor of each list)."""
    groups = defaultdict(lambda: [[] for _ in tensor_lists])
    for tensors in zip(*tensor_lists):
        key = (tensors[0].device,) + tuple(t.dtype for t in tensors)
        for column, tensor in zip(groups[key], tensors):
            column.append(tensor)
    return groups


class FlagBuffers(dict):
    """device -> the int32 flag a kernel sets when it meets inf/nan; created on first use."""

    def __missing__(self, device):
        self[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return self[device]

    def any_set(self):
        """True when any flag is set (one device-to-host sync per device)."""
        return any(bool(flag.item()) for flag in self.values())

    def clear(self):
        for flag in self.values():
            flag.zero_()


def launch(kernel_name, flags, tensor_lists, *args):
    """Run `amp_C.<kernel_name>(chunk, flag, lists, *args)`: one launch per device/dtype group."""
    amp_C, multi_tensor_applier = _fused_kernels()
    kernel = getattr(amp_C, kernel_name)
    # The outputs include params (master -> model copies); the update is not part of any graph.
    with torch.no_grad():
        for (device, *_), lists in _group_by_device_and_dtypes(tensor_lists).items():
            multi_tensor_applier(kernel, flags[device], lists, *args)
