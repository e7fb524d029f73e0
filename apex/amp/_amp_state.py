"""Process-wide amp state: the chosen properties, the loss scalers, the casting handle, printing."""
import torch
from torch.utils.weak import WeakIdKeyDictionary

from .casting_handle import NoOpHandle


class AmpState:
    """What `amp.initialize` / `amp.init` decided, read by `amp.scale_loss`, the patched optimizers
    and the casting wrappers. Scripts and apex's own tests read and set these fields directly."""

    def __init__(self):
        # apex's escape hatch: demote property conflicts from errors to printed warnings.
        self.hard_override = False
        # Let amp.initialize take a model whose params are already fp16/bf16 (no dtype check).
        self.allow_incoming_model_not_fp32 = False
        self.verbosity = 1
        self.opt_properties = None
        self.loss_scalers = []
        self.min_loss_scale = None
        self.max_loss_scale = 2.**24
        # The casting handle of O1/O4 and amp.init(); a no-op one until casts are installed.
        self.handle = NoOpHandle()
        # model param (fp16/bf16) -> its fp32 master, for the state-dict hooks of O2/O5 models.
        # Weak so a discarded model does not keep its masters alive.
        self.master_of = WeakIdKeyDictionary()


_amp_state = AmpState()


def warn_or_err(msg):
    if _amp_state.hard_override:
        print("Warning:  " + msg)
    else:
        raise RuntimeError(msg)


def maybe_print(msg, rank0=False):
    """Print at verbosity > 0; with `rank0`, only on rank 0 of an initialized process group."""
    if _amp_state.verbosity <= 0:
        return
    distributed = (torch.distributed.is_available() and torch.distributed.is_initialized()
                   and torch.distributed.get_world_size() > 1)
    if rank0 and distributed and torch.distributed.get_rank() != 0:
        return
    print(msg)


def master_params(optimizer):
    """Yield the params `optimizer` updates: the fp32 masters under O2/O5, the model's own otherwise.

    Use it for gradient clipping: `clip_grad_norm_(amp.master_params(optimizer), max_norm)`.
    """
    for group in optimizer.param_groups:
        yield from group["params"]
