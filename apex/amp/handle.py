"""`amp.scale_loss`: scale the loss for backward, then unscale grads and skip steps on overflow;
`amp.disable_casts`: run a block without amp's casts."""
import contextlib

from ._amp_state import _amp_state
from ._process_optimizer import is_optimizer
from .casting_handle import AmpHandle, NoOpHandle  # noqa: F401  (apex.amp.handle.AmpHandle in apex)
from .opt import skip_next_step


def _after_skipped_step(optimizer):
    optimizer._amp_stash.after_step(copy_masters=False)
    optimizer._amp_stash.already_patched = False


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False, delay_overflow_check=False):
    """Yield `loss.float() * loss_scale` for `.backward()`; on exit unscale every grad of
    `optimizers` (one optimizer or a list) and, when they hold inf/nan, back the scale off and
    make the next `optimizer.step()` a no-op.

    loss_id: which of the `num_losses` scalers given to amp.initialize scales this loss.
    delay_unscale: leave the grads scaled (gradient accumulation over several scale_loss
        blocks; the last one, without delay_unscale, unscales them all).
    delay_overflow_check: unscale, but neither read the overflow flag nor skip the step.
    model: accepted for apex compatibility; unused.
    """
    if _amp_state.opt_properties is None:
        raise RuntimeError("Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized.  "
                           "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be called "
                           "before `with amp.scale_loss`.")
    if not _amp_state.opt_properties.enabled:
        yield loss
        return
    if is_optimizer(optimizers):
        optimizers = [optimizers]
    if not 0 <= loss_id < len(_amp_state.loss_scalers):
        raise ValueError(f"loss_id {loss_id} is out of range: amp.initialize was called with "
                         f"num_losses={len(_amp_state.loss_scalers)}")
    for optimizer in optimizers:
        if not hasattr(optimizer, "_amp_stash"):
            raise RuntimeError("amp.scale_loss got an optimizer that was not passed through amp.initialize.")

    loss_scaler = _amp_state.loss_scalers[loss_id]
    reduces_grads = any(optimizer._amp_stash.reduces_grads for optimizer in optimizers)
    if not _amp_state.opt_properties.master_weights and loss_scaler.is_identity and not reduces_grads:
        # Nothing to scale, nothing to copy: the grads are final as autograd writes them.
        yield loss.float()
        _amp_state.handle._clear_cache()
        return

    if not delay_unscale:
        for optimizer in optimizers:
            if not optimizer._amp_stash.params_have_scaled_gradients:
                optimizer._amp_stash.before_backward()
    if reduces_grads:
        for optimizer in optimizers:
            optimizer._amp_stash.arm_reduction(overlap=not delay_unscale)

    yield loss.float() * loss_scaler.loss_scale()

    # The backward made new grads: casts cached from the weights are stale after the step.
    _amp_state.handle._clear_cache()
    if delay_unscale:
        for optimizer in optimizers:
            optimizer._amp_stash.params_have_scaled_gradients = True
        return
    loss_scaler.clear_overflow_state()
    for optimizer in optimizers:
        optimizer._amp_stash.unscale(loss_scaler)
        optimizer._amp_stash.params_have_scaled_gradients = False
    should_skip = False if delay_overflow_check else loss_scaler.update_scale()
    if should_skip:
        for optimizer in optimizers:
            if not optimizer._amp_stash.already_patched:
                message = (lambda scaler=loss_scaler: f"Gradient overflow.  Skipping step, loss scaler {loss_id} "
                                                      f"reducing loss scale to {scaler.loss_scale()}")
                skip_next_step(optimizer, message, _after_skipped_step)
                optimizer._amp_stash.already_patched = True


@contextlib.contextmanager
def disable_casts():
    """Run the enclosed code without amp's casts (the original functions' dtypes)."""
    with _amp_state.handle._disable_casts():
        yield
