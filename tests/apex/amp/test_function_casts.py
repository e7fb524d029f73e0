"""Casts around the user's own functions: `amp.register_*_function(module, name)` (applied by every
amp.init / O1 / O4 initialize) and the `amp.half_function` & co. decorators (casting only while
amp's casts are active)."""
import types

import pytest
import torch
import torch.nn as nn

from apex import amp
from apex.amp._amp_state import _amp_state


def record_dtypes(a, b):
    record_dtypes.args = (a.dtype, b.dtype)
    return a + b


def namespace_with(fn):
    """A stand-in module holding `fn`, so registering never rewires torch itself in the tests."""
    return types.SimpleNamespace(fn=fn)


def call_under(namespace, opt_level, a_type=torch.float16, b_type=torch.float32):
    """Initialize a model at `opt_level`, then call namespace.fn on an (a_type, b_type) pair."""
    amp.initialize(nn.Linear(2, 2), opt_level=opt_level, verbosity=0)
    return namespace.fn(torch.randn(2, 2, dtype=a_type), torch.randn(2, 2, dtype=b_type))


@pytest.mark.parametrize("opt_level", ["O1", "O4"])
@pytest.mark.parametrize("register,cast_type", [
    (amp.register_float_function, torch.float32),
    (amp.register_half_function, torch.float16),
    (amp.register_bfloat16_function, torch.bfloat16),
])
def test_registered_functions_get_their_casts(register, cast_type, opt_level):
    namespace = namespace_with(record_dtypes)
    register(namespace, "fn")
    assert namespace.fn is record_dtypes  # nothing changes before casts are installed
    call_under(namespace, opt_level)
    assert record_dtypes.args == (cast_type, cast_type)
    _amp_state.handle._deactivate()
    assert namespace.fn is record_dtypes


def test_registered_promote_function_casts_to_the_widest_type():
    namespace = namespace_with(record_dtypes)
    amp.register_promote_function(namespace, "fn")
    call_under(namespace, "O1")
    assert record_dtypes.args == (torch.float32, torch.float32)
    call_under(namespace, "O1", torch.bfloat16, torch.float16)
    assert record_dtypes.args == (torch.float32, torch.float32)


def test_registrations_persist_across_inits_and_follow_the_legacy_api():
    namespace = namespace_with(record_dtypes)
    amp.register_half_function(namespace, "fn")
    for _ in range(2):
        amp.init()
        namespace.fn(torch.randn(2), torch.randn(2))
        assert record_dtypes.args == (torch.float16, torch.float16)


def test_registration_is_inert_without_function_casting_levels():
    namespace = namespace_with(record_dtypes)
    amp.register_half_function(namespace, "fn")
    for opt_level in ("O0", "O2"):
        call_under(namespace, opt_level, torch.float32)
        assert record_dtypes.args == (torch.float32, torch.float32)


@pytest.mark.parametrize("decorator,cast_type", [
    (amp.float_function, torch.float32), (amp.half_function, torch.float16),
    (amp.bfloat16_function, torch.bfloat16), (amp.promote_function, torch.float32),
])
def test_decorators_cast_only_while_casts_are_active(decorator, cast_type):
    fn = decorator(record_dtypes)
    assert fn.__name__ == "record_dtypes"
    pair = (torch.randn(2, dtype=torch.float16), torch.randn(2, dtype=torch.float32))
    fn(*pair)  # no casts installed: untouched
    assert record_dtypes.args == (torch.float16, torch.float32)
    amp.init()
    fn(*pair)
    assert record_dtypes.args == (cast_type, cast_type)
    with amp.disable_casts():
        fn(*pair)
    assert record_dtypes.args == (torch.float16, torch.float32)
    _amp_state.handle._deactivate()
    fn(*pair)
    assert record_dtypes.args == (torch.float16, torch.float32)


def test_half_function_casts_fp32_params_through_the_cache():
    handle = amp.init()
    weight = nn.Parameter(torch.randn(2, 2))
    amp.half_function(record_dtypes)(weight, weight)
    assert record_dtypes.args == (torch.float16, torch.float16) and weight in handle.cache


def test_register_unknown_function_raises():
    with pytest.raises(ValueError, match="No function named no_such_function in module"):
        amp.register_half_function(torch, "no_such_function")
