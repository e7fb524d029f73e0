"""Fixtures shared by the amp_C tests: the compiled module and the devices to run on."""
import pytest
import torch

from op_builder import load_op

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="session")
def amp_C():
    return load_op("amp_C")


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def flag(device):
    return torch.zeros(1, dtype=torch.int32, device=device)
