"""`combine_ddp=True` (Ascend apex's amp.initialize knob): data-parallel training without a
DistributedDataParallel wrapper. amp's flat grad buffers (`combine_grad=True`, one per device and
dtype) are averaged over the ranks with torch.distributed, each in up to `ddp_replica_count`
chunks cut at param boundaries.

While a backward whose grads are unscaled right after runs (a `scale_loss` block without
`delay_unscale`), a chunk's all_reduce starts as soon as autograd has accumulated the grads of all
its params, so communication overlaps the rest of the backward; `finish()`, called before the
unscale, starts the chunks still waiting (params that got no grad) and waits for all of them.
Grads are reduced while still scaled, in the buffer's own dtype (fp16/bf16 model grads under
O2/O5: half the bytes of fp32), so every rank then sees the same overflow and skips the same steps.
"""
import torch
import torch.distributed as dist

from apex._weak_hooks import remove_with, weak_method


def require_process_group():
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("combine_ddp=True averages grads over torch.distributed ranks: call "
                           "torch.distributed.init_process_group() before amp.initialize.")


def broadcast_from_rank0(models):
    """Start every rank from rank 0's weights (and buffers), as DistributedDataParallel does."""
    require_process_group()
    with torch.no_grad():
        for model in models:
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data, src=0)


def _check_same_sizes_on_every_rank(buffers):
    """Every rank must combine the same params: a mismatch would make all_reduce mix grads."""
    for buffer in buffers:
        sizes = torch.tensor([buffer.numel(), -buffer.numel()], dtype=torch.int64, device=buffer.device)
        dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
        if sizes[0].item() != -sizes[1].item():
            raise RuntimeError("combine_ddp=True needs the same trainable params on every rank; the "
                               f"{buffer.dtype} grad buffer of rank {dist.get_rank()} holds {buffer.numel()} "
                               f"elements, another rank's {sizes[0].item()} or {-sizes[1].item()}.")


def _chunk_bounds(layout, total, replica_count):
    """[(start, end, param indices)]: about `total / replica_count` elements each, cut between params.
    `layout` lists (param index, offset) in buffer order."""
    target = -(-total // replica_count)
    chunks, start, members = [], 0, []
    for position, (index, _offset) in enumerate(layout):
        members.append(index)
        end = layout[position + 1][1] if position + 1 < len(layout) else total
        if end - start >= target or end == total:
            chunks.append((start, end, members))
            start, members = end, []
    return chunks


class FlatGradReducer:
    """Averages flat grad buffers over the ranks of the default process group (see module doc).

    buffers: the flat grad buffers; layouts[i]: (param index, offset) of the params in buffers[i];
    params: the params whose .grad are views into the buffers (their accumulate hooks drive the
    overlap); replica_count: chunks per buffer (at most one per param)."""

    def __init__(self, buffers, layouts, params, replica_count):
        require_process_group()
        _check_same_sizes_on_every_rank(buffers)
        self.world_size = dist.get_world_size()
        self.chunks = []  # (buffer slice, number of params)
        chunk_of_param = {}
        for buffer, layout in zip(buffers, layouts):
            for start, end, members in _chunk_bounds(layout, buffer.numel(), replica_count):
                for index in members:
                    chunk_of_param[index] = len(self.chunks)
                self.chunks.append((buffer[start:end], len(members)))
        self._armed = False
        self._pending = []
        self._works = [None] * len(self.chunks)
        self._seen = set()
        # Weak hooks (apex._weak_hooks): hooks holding this reducer would keep its buffers alive.
        self._hooks = [params[index].register_post_accumulate_grad_hook(weak_method(self, "_grad_accumulated", index, chunk))
                       for index, chunk in chunk_of_param.items()]
        remove_with(self, self._hooks)

    def _grad_accumulated(self, index, chunk, _param):
        if not self._armed:
            return
        if index in self._seen:
            raise RuntimeError("combine_ddp=True reduces each grad once per backward, like "
                               "DistributedDataParallel, but a param's grad was accumulated twice in one "
                               "scale_loss block. Give every backward but the last its own "
                               "amp.scale_loss(..., delay_unscale=True) block.")
        self._seen.add(index)
        self._pending[chunk] -= 1
        if self._pending[chunk] == 0:
            self._launch(chunk)

    def _launch(self, chunk):
        grads, _ = self.chunks[chunk]
        grads.div_(self.world_size)  # before the sum: fp16 sums of scaled grads stay in range longer
        self._works[chunk] = dist.all_reduce(grads, async_op=True)

    def arm(self, overlap):
        """Before a backward: with `overlap`, chunks start reducing as their grads complete."""
        self._armed = overlap
        self._pending = [count for _, count in self.chunks]
        self._works = [None] * len(self.chunks)
        self._seen = set()

    def finish(self):
        """After the backward: reduce what has not started, wait for everything."""
        self._armed = False
        for chunk, work in enumerate(self._works):
            if work is None:
                self._launch(chunk)
        for work in self._works:
            work.wait()
        self._works = [None] * len(self.chunks)

    def remove(self):
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
