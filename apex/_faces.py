"""The historical modules (``import amp_C``, ``import fused_layer_norm_cuda``, ...) as faces of the ops.

Each compatibility/<name>.py is two lines:

    from apex._faces import face_module
    __getattr__, __dir__ = face_module(__name__)            # or face_module(__name__, library=..., ...)

Importing it costs nothing; its first attribute access loads the op library (building it on first
use) and returns the face function:

- ``<name>.<fn>`` is ``torch.ops.apex.<prefix><fn>``, called with the same arguments;
- ops whose schema starts ``(int chunk_size, Tensor noop_flag, Tensor[] ...)`` take NVIDIA apex's
  multi-tensor calling convention, ``fn(chunk_size, noop_flag, tensor_lists, *args)``: the lists of
  ``tensor_lists`` are spread over the op's Tensor[] arguments (missing trailing ones empty);
- functions of the ``adapters`` module (a Python module path) come first: historical functions
  whose arguments differ from the op's.

``library`` defaults to the module's own name; ``prefix`` and ``adapters`` to that library's builder
attributes FACE_PREFIX (default "<library>_") and FACE_MODULE. Several historical modules can be
faces of one library (the four scaled-softmax modules of one softmax library, say).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Optional


def face_module(name: str, *, library: Optional[str] = None, prefix: Optional[str] = None,
                adapters: Optional[str] = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Module-level ``__getattr__`` and ``__dir__`` (PEP 562) of the historical module ``name``."""
    faces: dict[str, Any] = {}
    resolved: dict[str, Any] = {}

    def face() -> "_Face":
        if "face" not in resolved:
            resolved["face"] = _Face(name, library or name, prefix, adapters)
        return resolved["face"]

    def __getattr__(attr: str) -> Any:
        # Probes by the import machinery, pytest, inspect, ... are never op functions (no historical
        # function's name starts with "_"): answering them must not build the library.
        if attr.startswith("_"):
            raise AttributeError(f"module '{name}' has no attribute '{attr}'")
        if attr not in faces:
            faces[attr] = face().function(attr)
        return faces[attr]

    def __dir__() -> list[str]:
        return sorted(face().names())

    return __getattr__, __dir__


class _Face:
    """Where the functions of one historical module come from."""

    def __init__(self, name: str, library: str, prefix: Optional[str], adapters: Optional[str]) -> None:
        from apex.op_builder import builder_for

        builder = builder_for(library)
        self.name, self.library = name, library
        if prefix is None:
            prefix = library + "_" if builder.FACE_PREFIX is None else builder.FACE_PREFIX
        self.prefix = prefix
        adapters = adapters if adapters is not None else (builder.FACE_MODULE if name == library else None)
        self.adapters = importlib.import_module(adapters) if adapters else None

    def function(self, attr: str) -> Any:
        from apex._ops import ops

        namespace = ops(self.library)
        if self.adapters is not None and attr in getattr(self.adapters, "__all__", ()):
            return getattr(self.adapters, attr)
        qualified = self.prefix + attr
        if not hasattr(namespace, qualified):
            raise AttributeError(f"module '{self.name}' has no attribute '{attr}' (no op apex::{qualified})")
        return _call_convention(getattr(namespace, qualified))

    def names(self) -> set[str]:
        import torch

        from apex._ops import ops

        ops(self.library)
        prefix = "apex::" + self.prefix
        names = {op[len(prefix):] for op in torch._C._dispatch_get_all_op_names() if op.startswith(prefix)}
        return names | set(getattr(self.adapters, "__all__", ()))


def _call_convention(packet) -> Callable[..., Any]:
    """The op itself, or for multi-tensor ops a function taking apex's list of tensor lists."""
    op = packet.default
    arguments = op._schema.arguments
    list_args = 0
    if len(arguments) > 2 and arguments[0].name == "chunk_size" and arguments[1].name == "noop_flag":
        while 2 + list_args < len(arguments) and str(arguments[2 + list_args].type) == "List[Tensor]":
            list_args += 1
    if list_args == 0:
        return packet
    name = op._schema.name.split("::")[-1]

    def multi_tensor_face(chunk_size, noop_flag, tensor_lists, *args, **kwargs):
        if len(tensor_lists) > list_args:
            raise RuntimeError(f"{name}: expected at most {list_args} tensor lists, got {len(tensor_lists)}")
        lists = [*tensor_lists, *([[]] * (list_args - len(tensor_lists)))]
        return op(chunk_size, noop_flag, *lists, *args, **kwargs)

    multi_tensor_face.__name__ = multi_tensor_face.__qualname__ = name
    multi_tensor_face.__doc__ = f"{op._schema}, with its Tensor[] arguments passed as one list of lists"
    return multi_tensor_face
