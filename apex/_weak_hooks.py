"""Parameter hooks that hold their owner weakly.

A hook registered on a parameter that holds an object which holds the parameter (a bound method,
a closure over ``self``) makes a reference cycle that Python's garbage collector cannot break:
torch does not traverse a tensor's hooks. The owner and everything it holds (optimizer state,
gradient buffers, the model) then live until the process ends. These hooks call the owner's
method while it lives, and are removed when it is freed.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable


def weak_method(owner: object, name: str, *args) -> Callable:
    """A hook calling ``owner.<name>(*args, *hook_args)`` while ``owner`` lives, else nothing."""
    ref = weakref.ref(owner)

    def call(*hook_args):
        target = ref()
        if target is not None:
            return getattr(target, name)(*args, *hook_args)
        return None

    return call


def remove_with(owner: object, handles: list) -> None:
    """Remove the hook ``handles`` when ``owner`` is freed (removing one twice is harmless)."""
    weakref.finalize(owner, _remove, list(handles))


def _remove(handles: list) -> None:
    for handle in handles:
        handle.remove()
