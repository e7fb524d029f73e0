"""apex._autocast: the mixed-precision type apex's fused modules cast their inputs to, from
torch.autocast or from amp's installed O1/O4 casts (one rule for apex.fused_dense, apex.mlp,
apex.transformer)."""
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from apex import amp
from apex._autocast import amp_cast_dtype, cast_if_autocast_enabled


def sample_args():
    return torch.randn(2, 3), torch.arange(3), torch.randn(3, dtype=torch.float64), "not a tensor", None


def dtypes(args):
    return [a.dtype if isinstance(a, torch.Tensor) else a for a in args]


def test_without_any_mixed_precision_the_args_come_back_untouched():
    args = sample_args()
    assert amp_cast_dtype() is None
    assert all(a is b for a, b in zip(cast_if_autocast_enabled(*args), args))


@pytest.mark.parametrize("patch_type", [torch.float16, torch.bfloat16])
def test_amp_init_casts_floating_tensors_to_its_type(patch_type):
    handle = amp.init(patch_type=patch_type)
    assert dtypes(cast_if_autocast_enabled(*sample_args())) == [patch_type, torch.int64, patch_type,
                                                                 "not a tensor", None]
    with amp.disable_casts():
        assert amp_cast_dtype() is None
    handle._deactivate()
    assert amp_cast_dtype() is None


@pytest.mark.parametrize("opt_level,expected", [("O1", torch.float16), ("O4", torch.bfloat16), ("O2", None),
                                                ("O5", None)])
def test_amp_initialize_levels(opt_level, expected):
    amp.initialize(nn.Linear(2, 2), opt_level=opt_level, verbosity=0)
    assert amp_cast_dtype() is expected


def test_torch_autocast_takes_precedence():
    handle = amp.init(patch_type=torch.float16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x, = cast_if_autocast_enabled(torch.randn(2))
    assert x.dtype == torch.bfloat16
    handle._deactivate()


def test_importing_it_imports_no_amp():
    code = "import sys, apex._autocast; assert 'apex.amp' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
