"""The handle of amp's installed casts (`amp.init()`, and `amp.initialize` at O1/O4).

The handle remembers every function it replaced so `_deactivate()` puts the originals back,
owns the cache of fp32 params cast to fp16/bf16, and switches casting off inside
`disable_casts()`. Its `scale_loss` and `wrap_optimizer` are the legacy loss-scaling API
(scaling itself is `scaler.LossScaler`, shared with `amp.scale_loss`).
"""
import contextlib

from .scaler import LossScaler
from .wrap import CastCache

_INHERITED = object()  # marks a name the owner only inherited (a Tensor method of TensorBase)


class AmpHandle:
    """Casts installed by `amp.init()`; one handle's casts are installed at a time."""

    def __init__(self, loss_scale="dynamic", enable_caching=True, verbose=False, patch_type=None):
        self.patch_type = patch_type  # the low-precision type the lists cast to (None: no casts)
        self._enable_caching = enable_caching
        self._verbose = verbose
        self._cache = CastCache()
        self._default_scaler = LossScaler(loss_scale)
        self._is_active = True
        self._all_wrappers = []  # (owner, name, what owner held before), in patching order

    def is_active(self):
        return self._is_active

    @contextlib.contextmanager
    def _disable_casts(self):
        was_active, self._is_active = self._is_active, False
        try:
            yield
        finally:
            self._is_active = was_active

    def _patch(self, owner, name, make_wrapper):
        """Replace `owner.name` by `make_wrapper(owner.name)`; a missing name is skipped (lists
        may name functions an older or newer torch lacks)."""
        if not hasattr(owner, name):
            return
        self._save_func(owner, name, vars(owner).get(name, _INHERITED))
        setattr(owner, name, make_wrapper(getattr(owner, name)))

    def _save_func(self, owner, name, previous):
        self._all_wrappers.append((owner, name, previous))

    def _deactivate(self):
        """Put back every original function (last patched first) and stop casting."""
        for owner, name, previous in reversed(self._all_wrappers):
            if previous is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)
        self._all_wrappers = []
        self._cache.clear()
        self._is_active = False

    def _clear_cache(self):
        self._cache.clear()

    @property
    def has_cache(self):
        return self._enable_caching

    @property
    def cache(self):
        return self._cache

    def remove_cache(self, param):
        self._cache.remove(param)

    @property
    def verbose(self):
        return self._verbose

    def wrap_optimizer(self, optimizer, num_loss=1):
        """The legacy API: an optimizer wrapper with `num_loss` loss scalers, used as
        `with optimizer.scale_loss(loss) as scaled: scaled.backward()` then `optimizer.step()`."""
        from .opt import OptimWrapper  # opt imports amp's state, which imports this module

        self._default_scaler = None
        return OptimWrapper(optimizer, self, num_loss)

    @contextlib.contextmanager
    def scale_loss(self, loss, optimizer):
        """The legacy API: yield the scaled loss for backward, then unscale the grads of
        `optimizer`'s params; on inf/nan back the scale off and skip the next `optimizer.step()`."""
        from .opt import scaled_backward, skip_next_step

        if not self.is_active():
            yield loss
            return
        if self._default_scaler is None:
            raise RuntimeError("After calling `handle.wrap_optimizer()`, you must explicitly use "
                               "`optimizer.scale_loss(loss)`.")
        with scaled_backward(loss, optimizer, self._default_scaler) as scaled_loss:
            yield scaled_loss
        if self._default_scaler.update_scale():
            skip_next_step(optimizer, f"Gradient overflow, skipping update; loss scale reduced to "
                                      f"{self._default_scaler.loss_scale()}")
        self._clear_cache()


class NoOpHandle(AmpHandle):
    """The handle while no casts are installed (and after `amp.init(enabled=False)`): nothing is
    cast, `scale_loss` hands the loss back, `_deactivate()` has nothing to restore."""

    def __init__(self):
        super().__init__(loss_scale=1.0, enable_caching=False)
        self._is_active = False

    def is_active(self):
        return False
