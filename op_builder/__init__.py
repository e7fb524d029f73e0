"""apex's op builder (``apex.op_builder``): declare an op in ops/, get it compiled on first use.

    from apex.op_builder import load_op
    path = load_op("my_op")        # the op library is loaded: torch.ops.apex.my_op_* exist

The wheel installs this folder as ``apex.op_builder``; in the source tree ``apex/op_builder`` is a
link to it. See README.md ("How ops are built") for the lifecycle, the cache and the env vars.
"""
if __name__ == "op_builder":
    # The source tree's old top-level name (still used during the move to apex.op_builder):
    # the very same modules under a second name, never a second copy of their state.
    from ._source_alias import alias_package

    alias_package("op_builder", "apex.op_builder")
else:
    from .errors import OpBuildError, OpNotCompatibleError, UnsafeCacheDirError
    from .jit import load_op
    from .registry import all_builders, builder_for

    __all__ = ["load_op", "all_builders", "builder_for", "OpBuildError", "OpNotCompatibleError",
               "UnsafeCacheDirError"]
