"""Where each parameter's elements live in the flat buckets of a ZeRO optimizer.

Parameters are laid end to end, in a fixed order, into buckets of at most a capacity of
elements; a parameter too large for the rest of a bucket continues in the next one, so it
may consist of several fragments. Each bucket is split into ``world`` equal shards: rank r
owns elements ``[r * shard_size, (r + 1) * shard_size)`` of every bucket, its gradients
after the reduce-scatter and its optimizer state. The layout is pure arithmetic, the same
on every rank, which is what lets ranks exchange buckets without describing them.
Parameters with different keys (their gradient and gather dtypes) never share a bucket.
"""
from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass

# Every fragment starts at a multiple of 64 elements of its bucket and every shard size is
# one: 128 bytes in 16-bit buffers, 256 in float32 ones, so each fragment of each shard
# buffer starts 16-byte aligned for the kernels' vector loads, whatever its dtype.
ALIGNMENT = 64


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Fragment:
    """Elements ``param_range`` of flattened parameter ``param`` at ``bucket_range`` of ``bucket``."""

    param: int
    bucket: int
    param_range: tuple[int, int]
    bucket_range: tuple[int, int]


@dataclass(frozen=True)
class LocalFragment:
    """The part of a fragment inside this rank's shard: elements ``param_range`` of the
    flattened parameter are elements ``shard_range`` of the shard."""

    param: int
    param_range: tuple[int, int]
    shard_range: tuple[int, int]

    @property
    def size(self) -> int:
        return self.shard_range[1] - self.shard_range[0]


@dataclass(frozen=True)
class Bucket:
    index: int
    size: int
    shard_size: int
    fragments: tuple[Fragment, ...]
    local: tuple[LocalFragment, ...]  # this rank's fragments, in shard order
    key: Hashable = None  # what its parameters share (their sync dtypes): buckets never mix keys

    @property
    def params(self) -> tuple[int, ...]:
        """The parameters with elements in this bucket, each once, in bucket order."""
        return tuple(dict.fromkeys(f.param for f in self.fragments))


def shard_capacity(bucket_bytes: float, element_size: int, world: int) -> int:
    """Elements per shard of a full bucket of about ``bucket_bytes``: a multiple of ALIGNMENT, at least one."""
    elements = int(bucket_bytes // element_size) // world
    return max(ALIGNMENT, elements // ALIGNMENT * ALIGNMENT)


def plan_buckets(
    sizes: Sequence[int],
    order: Sequence[int],
    bucket_starts: Collection[int],
    capacity: int,
    world: int,
    rank: int,
    keys: Sequence[Hashable] | None = None,
) -> list[Bucket]:
    """Lay the parameters ``order`` (indices into ``sizes``, element counts) into buckets.

    Parameters of different ``keys`` (by parameter index; default: all alike) go to different
    buckets: each key fills its own open bucket, so buckets of several keys grow side by side
    and are numbered in the order they are opened. A key's next bucket opens where a parameter
    does not fit, and every key's at each position of ``order`` in ``bucket_starts``. Buckets
    hold at most ``capacity * world`` elements and are trimmed to the smallest multiple of
    ``ALIGNMENT * world`` that holds their fragments; ``rank`` picks the shard whose local
    fragments are listed. A parameter spanning buckets continues in its key's next bucket.
    """
    if capacity % ALIGNMENT:
        raise ValueError(f"shard capacity must be a multiple of {ALIGNMENT}, got {capacity}")
    limit = capacity * world
    filled: list[list[Fragment]] = []
    bucket_keys: list[Hashable] = []
    ends: list[int] = []  # elements of each bucket in use
    open_bucket: dict[Hashable, int] = {}
    for position, param in enumerate(order):
        if position in bucket_starts:
            open_bucket.clear()
        key = None if keys is None else keys[param]
        start, size = 0, sizes[param]
        while start < size:
            index = open_bucket.get(key)
            if index is None:
                index = open_bucket[key] = len(filled)
                filled.append([])
                bucket_keys.append(key)
                ends.append(0)
            offset = round_up(ends[index], ALIGNMENT)
            if offset >= limit:
                del open_bucket[key]
                continue
            take = min(size - start, limit - offset)
            filled[index].append(Fragment(param, index, (start, start + take), (offset, offset + take)))
            start, ends[index] = start + take, offset + take
    buckets = []
    for index, fragments in enumerate(filled):
        size = round_up(fragments[-1].bucket_range[1], ALIGNMENT * world)
        shard_size = size // world
        buckets.append(Bucket(index, size, shard_size, tuple(fragments), _local(fragments, shard_size, rank),
                              bucket_keys[index]))
    return buckets


def utilization(buckets: Sequence[Bucket], capacity: int, world: int) -> float:
    """The share of the buckets' full capacity that their fragments (and alignment gaps) fill."""
    if not buckets:
        return 1.0
    used = sum(bucket.fragments[-1].bucket_range[1] for bucket in buckets)
    return used / (len(buckets) * capacity * world)


def _local(fragments: Sequence[Fragment], shard_size: int, rank: int) -> tuple[LocalFragment, ...]:
    shard_start, shard_end = rank * shard_size, (rank + 1) * shard_size
    local = []
    for fragment in fragments:
        begin = max(fragment.bucket_range[0], shard_start)
        end = min(fragment.bucket_range[1], shard_end)
        if begin < end:
            offset = fragment.param_range[0] - fragment.bucket_range[0]
            local.append(LocalFragment(fragment.param, (begin + offset, end + offset),
                                       (begin - shard_start, end - shard_start)))
    return tuple(local)


def signature(buckets: Sequence[Bucket], world: int) -> tuple:
    """What two optimizers must share to exchange sharded state: world size and fragments."""
    return (world, tuple((b.size, tuple((f.param, f.param_range, f.bucket_range) for f in b.fragments))
                         for b in buckets))
