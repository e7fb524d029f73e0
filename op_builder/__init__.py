"""apex's op builder: declare an op in op_builder/ops/, get it compiled on first use.

    from op_builder import load_op
    amp_C = load_op("amp_C")

See README.md ("How ops are built") for the lifecycle, the cache and the env vars.
"""
from op_builder.errors import OpBuildError, OpNotCompatibleError, UnsafeCacheDirError
from op_builder.jit import load_op
from op_builder.registry import all_builders, builder_for

__all__ = ["load_op", "all_builders", "builder_for", "OpBuildError", "OpNotCompatibleError", "UnsafeCacheDirError"]
