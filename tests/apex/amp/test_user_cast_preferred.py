"""user_cast_preferred (Ascend apex's amp.init / amp.initialize knob): a function the user registered
gets only the user's cast, not the cast lists' as well."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from apex import amp


def linear_inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=gen), torch.randn(4, 16, generator=gen)


@pytest.mark.parametrize("opt_level", ["O1", "O4"])
def test_registered_list_function_is_cast_once(opt_level):
    x, w = linear_inputs()
    exact = F.linear(x, w)
    amp.register_float_function(F, "linear")  # F.linear is on the low-precision list

    amp.initialize(nn.Linear(2, 2), opt_level=opt_level, verbosity=0)
    both_casts = F.linear(x, w)  # the list's cast to fp16/bf16 first, then the user's to fp32
    assert both_casts.dtype == torch.float32 and not torch.equal(both_casts, exact)

    amp.initialize(nn.Linear(2, 2), opt_level=opt_level, verbosity=0, user_cast_preferred=True)
    assert torch.equal(F.linear(x, w), exact)  # fp32 only: no round trip through low precision
    assert torch.matmul(x, w.t()).dtype == (torch.float16 if opt_level == "O1" else torch.bfloat16)


def test_legacy_init_takes_it_too():
    x, w = linear_inputs()
    exact = F.linear(x, w)
    amp.register_float_function(F, "linear")
    handle = amp.init(user_cast_preferred=True)
    assert torch.equal(F.linear(x, w), exact)
    handle._deactivate()


def test_unregistered_functions_keep_their_list_casts():
    amp.initialize(nn.Linear(2, 2), opt_level="O1", verbosity=0, user_cast_preferred=True)
    x, w = linear_inputs()
    assert F.linear(x, w).dtype == torch.float16
    assert F.softmax(x.half(), dim=1).dtype == torch.float32


@pytest.mark.parametrize("opt_level", ["O0", "O2", "O3", "O5"])
def test_refused_where_amp_casts_no_functions(opt_level):
    with pytest.raises(RuntimeError, match="user_cast_preferred"):
        amp.initialize(nn.Linear(2, 2), opt_level=opt_level, verbosity=0, user_cast_preferred=True)
