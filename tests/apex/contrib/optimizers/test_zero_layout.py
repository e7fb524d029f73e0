"""The bucket layout: every element of every parameter lands in exactly one bucket slot, the
shards of all ranks partition each bucket, and the alignment the kernels rely on holds."""
from __future__ import annotations

import pytest

from apex.contrib.optimizers._layout import ALIGNMENT, plan_buckets, shard_capacity, signature

# Odd sizes, one parameter far larger than a bucket, an empty one.
SIZES = [37 * 11, 11, 130, 5 * 7 * 3, 1, 3000, 0, 64, 65]


def _check(sizes, order, starts, capacity, world):
    layouts = [plan_buckets(sizes, order, starts, capacity, world, rank) for rank in range(world)]
    buckets = layouts[0]
    # Every rank sees the same buckets (only the local fragments differ).
    for other in layouts[1:]:
        assert [(b.size, b.fragments) for b in other] == [(b.size, b.fragments) for b in buckets]
    covered = {i: [] for i in order}
    for bucket in buckets:
        assert bucket.size == bucket.shard_size * world and bucket.shard_size % ALIGNMENT == 0
        assert bucket.size <= capacity * world
        ends = 0
        for fragment in bucket.fragments:
            start, end = fragment.bucket_range
            assert start % ALIGNMENT == 0 and start >= ends and end - start == fragment.param_range[1] - fragment.param_range[0]
            ends = end
            covered[fragment.param].append(fragment.param_range)
        assert ends <= bucket.size
    for param, ranges in covered.items():
        position = 0
        for start, end in ranges:  # consecutive pieces from 0 to the parameter's size
            assert start == position
            position = end
        assert position == sizes[param]
    # The ranks' local fragments partition the fragments, each inside its shard.
    for bucket_index, bucket in enumerate(buckets):
        pieces = []
        for rank, layout in enumerate(layouts):
            for local in layout[bucket_index].local:
                lo, hi = local.shard_range
                assert 0 <= lo < hi <= bucket.shard_size
                pieces.append((local.param, local.param_range, rank * bucket.shard_size + lo))
        expected = sum(f.param_range[1] - f.param_range[0] for f in bucket.fragments)
        assert sum(r[1] - r[0] for _, r, _ in pieces) == expected
        for param, (lo, hi), bucket_start in pieces:
            fragment = next(f for f in bucket.fragments if f.param == param
                            and f.param_range[0] <= lo and hi <= f.param_range[1])
            assert bucket_start - fragment.bucket_range[0] == lo - fragment.param_range[0]
    return buckets


@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("capacity", [64, 192, 4096])
def test_layout_covers_every_element_once(world, capacity):
    order = list(reversed(range(len(SIZES))))
    buckets = _check(SIZES, order, set(), capacity, world)
    assert len(buckets) >= -(-sum(SIZES) // (capacity * world))


def test_bucket_starts_give_parameters_buckets_of_their_own():
    order = [2, 3, 0, 1, 4]
    buckets = _check(SIZES, order, {2, 4}, 4096, 2)
    assert [b.params for b in buckets] == [(2, 3), (0, 1), (4,)]


def test_a_large_parameter_spans_consecutive_full_buckets():
    buckets = _check([10, 1000], [0, 1], set(), 128, 2)
    spans = [f for b in buckets for f in b.fragments if f.param == 1]
    assert len(spans) > 1
    for first, second in zip(spans, spans[1:]):  # fills a bucket to its end, goes on at the next one's start
        assert first.bucket_range[1] == buckets[first.bucket].size and second.bucket_range[0] == 0


def test_keys_fill_buckets_of_their_own_side_by_side():
    keys = ["a", "b", "a", "a", "b", "b", "a", "b", "a"]
    order = list(reversed(range(len(SIZES))))
    for world in (1, 2, 3):
        for capacity in (64, 192, 4096):
            buckets = plan_buckets(SIZES, order, {5}, capacity, world, 0, keys)
            _check(SIZES, order, {5}, capacity, world)  # the same parameters, unkeyed, as a sanity check
            for bucket in buckets:
                assert {keys[p] for p in bucket.params} == {bucket.key}
            covered = sorted((f.param, f.param_range) for b in buckets for f in b.fragments)
            assert [p for p, _ in covered] == sorted(p for p in order for _ in range(
                len([f for b in buckets for f in b.fragments if f.param == p])))
            for param in order:  # a parameter spanning buckets continues in its key's next bucket
                spans = [f for b in buckets for f in b.fragments if f.param == param]
                assert sum(f.param_range[1] - f.param_range[0] for f in spans) == SIZES[param]
                for first, second in zip(spans, spans[1:]):
                    following = [b.index for b in buckets if b.key == keys[param] and b.index > first.bucket]
                    assert second.bucket == following[0] and first.bucket_range[1] == buckets[first.bucket].size


def test_last_bucket_is_trimmed_and_signature_tracks_layout():
    buckets = plan_buckets([100], [0], set(), 4096, 3, 0)
    assert buckets[0].size == 3 * ALIGNMENT
    assert signature(buckets, 3) != signature(plan_buckets([100], [0], set(), 4096, 2, 0), 2)
    assert plan_buckets([0, 0], [0, 1], set(), 64, 2, 0) == []


def test_shard_capacity_rounds_to_the_alignment():
    assert shard_capacity(100 * 2**20, 4, 2) == 100 * 2**20 // 8
    assert shard_capacity(1, 4, 8) == ALIGNMENT
    assert shard_capacity(1000 * 4, 4, 3) % ALIGNMENT == 0
    with pytest.raises(ValueError, match="multiple"):
        plan_buckets([10], [0], set(), 100, 1, 0)
