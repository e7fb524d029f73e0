"""Every amp test leaves torch and amp as it found them: casts installed by amp.init / O1 / O4
are removed, registrations made by the test forgotten, the state flags reset."""
import pytest

import apex.amp.amp as amp_module
from apex.amp._amp_state import _amp_state


@pytest.fixture(autouse=True)
def restore_amp():
    registrations = list(amp_module._USER_REGISTRY)
    yield
    _amp_state.handle._deactivate()
    amp_module._USER_REGISTRY[:] = registrations
    _amp_state.allow_incoming_model_not_fp32 = False
    _amp_state.hard_override = False
