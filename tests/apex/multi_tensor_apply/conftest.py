"""Fixtures shared by the amp_C tests: the historical module (a face of torch.ops.apex) and the devices to run on."""
import pytest
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="session")
def amp_C():
    import amp_C

    return amp_C


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def flag(device):
    return torch.zeros(1, dtype=torch.int32, device=device)


@pytest.fixture(params=["meta", *DEVICES])
def checked_flag(request):
    """A flag for tests of the checks made before any launch: also on the meta device, whose kernel
    is those checks alone."""
    return torch.zeros(1, dtype=torch.int32, device=request.param)
