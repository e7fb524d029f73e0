"""Functions of the historical ``scaled_masked_softmax_cuda`` module that are not ops."""

__all__ = ["get_batch_per_block"]


def get_batch_per_block(sq: int, sk: int, b: int, np: int) -> int:
    """Rows (attention batches) one block of the kernel handles, for callers that check divisibility.

    Megatron-style ``is_kernel_available`` checks ``sq % batch_per_block == 0`` (padding mask) or
    ``b * np % batch_per_block == 0`` (causal). These kernels take any number of rows of any length,
    so the granularity is 1 and those checks always pass.
    """
    for name, value in (("sq", sq), ("sk", sk), ("b", b), ("np", np)):
        if int(value) < 0:
            raise ValueError(f"get_batch_per_block: {name} must be >= 0, got {value}")
    return 1
