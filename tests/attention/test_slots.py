"""The slot pool (aiayn.attention.slots): slots taken, freed and copied by hand; its growth
keeps every row's keys/values; attention over per-row lengths equals each row attended alone,
on aiayn's kernel (each CPU class it dispatches on: `make test-cpu-classes` reruns this file
under the caps) and on the reference path."""

from __future__ import annotations

import pytest
import torch

from aiayn.attention import SlotCache, SlotPool, SlotRows, attend_slots, select_slots
from aiayn.attention.scaled_dot_product import scaled_dot_product_attention
from aiayn.attention.slots import attend_slots_reference
from aiayn.kernels import cpu
from aiayn.kernels.attention import native_attend_rows
from aiayn.settings import performance_settings

H, D = 2, 8


def _pool(slots: int = 4, capacity: int = 4) -> SlotPool:
    return SlotPool(1, H, D, torch.zeros(1), slots=slots, capacity=capacity)


def test_slots_are_taken_lowest_first_and_given_back() -> None:
    pool = _pool()
    assert pool.take(3).tolist() == [0, 1, 2] and pool.free == 1
    pool.release(torch.tensor([1]))
    assert pool.free == 2 and sorted(pool.take(2).tolist()) == [1, 3]
    assert pool.take(1).tolist() == [4] and pool.slots == 8  # grown: the new ones after the old


def test_select_slots_by_hand() -> None:
    """Rows in slots [4, 7, 9]; index [1, 1, 0]: row 7 keeps 7, its second pick takes slot 9
    (freed: nobody picks row 2) with a copy of 7's columns, row 4 keeps 4."""
    pool = _pool(slots=10)
    pool.take(10)
    pool.buffer.copy_(torch.randn_like(pool.buffer))
    before = pool.buffer.clone()
    rows, lengths = torch.tensor([4, 7, 9]), torch.tensor([2, 3, 1])
    out = select_slots(pool, rows, torch.tensor([1, 1, 0]), lengths)
    assert out.tolist() == [7, 9, 4] and pool.free == 0
    assert torch.equal(pool.buffer[:, :, 9, :, :3], before[:, :, 7, :, :3])
    assert torch.equal(pool.buffer[:, :, [4, 7]], before[:, :, [4, 7]])  # nothing else moved


def test_growth_keeps_every_rows_keys_and_values() -> None:
    pool = _pool(slots=2, capacity=2)
    rows = SlotRows.taken(pool, [2, 1])
    pool.buffer[:, :, :, :, :2] = torch.randn(1, 2, 2, H, 2, D)
    before = pool.buffer.clone()
    pool.reserve(5)
    pool.take(3)
    assert (pool.slots, pool.capacity) == (8, 8)
    assert torch.equal(pool.buffer[:, :, :2, :, :2], before)
    assert rows.rows.tolist() == [0, 1]


def _filled(lengths: list[int]) -> tuple[SlotCache, torch.Tensor]:
    """A cache of rows with ``lengths`` in shuffled slots of a larger pool, and (B, H, 1, D)
    queries."""
    g = torch.Generator().manual_seed(len(lengths))
    pool = _pool(slots=2 * len(lengths), capacity=max([*lengths, 1]))
    pool.buffer.copy_(torch.randn(pool.buffer.shape, generator=g))
    rows = torch.randperm(pool.slots, generator=g)[: len(lengths)]
    key, value = pool.layer(0)
    cache = SlotCache(key, value, rows, torch.tensor(lengths), max([*lengths, 0]))
    return cache, torch.randn(len(lengths), H, 1, D, generator=g)


def _alone(
    query: torch.Tensor, cache: SlotCache, b: int, bias: torch.Tensor | None
) -> torch.Tensor:
    """Row b attended alone over exactly its keys (the one attention)."""
    n, r = int(cache.lengths[b]), int(cache.rows[b])
    if n == 0:
        return torch.zeros(1, H, 1, D)
    keys, values = cache.key[r : r + 1, :, :n], cache.value[r : r + 1, :, :n]
    row_bias = None if bias is None else bias[b : b + 1, :, :, :n]
    out, _ = scaled_dot_product_attention(query[b : b + 1], keys, values, bias=row_bias)
    return out


@pytest.mark.parametrize("path", ["kernel", "reference"])
@pytest.mark.parametrize("biased", [False, True])
@pytest.mark.parametrize("lengths", [[3, 1, 5], [0, 2], [7]])
def test_attention_over_per_row_lengths_equals_each_row_alone(
    path: str, biased: bool, lengths: list[int]
) -> None:
    cache, query = _filled(lengths)
    longest = max(lengths)
    bias = torch.randn(len(lengths), H, 1, longest) if biased else None
    if path == "kernel":
        if native_attend_rows() is None:
            pytest.skip(f"aiayn's attention kernel does not run here (class {cpu.level()})")
        got = attend_slots(query, cache, bias=bias)
    else:
        got = attend_slots_reference(query, cache, bias=bias)
    for b in range(len(lengths)):
        torch.testing.assert_close(
            got[b : b + 1], _alone(query, cache, b, bias), atol=1e-6, rtol=1e-5
        )


def test_the_kernel_gives_each_row_what_it_gives_it_alone_bit_for_bit() -> None:
    """Batch invariance: a row's output does not depend on the other rows of the call."""
    if native_attend_rows() is None:
        pytest.skip(f"aiayn's attention kernel does not run here (class {cpu.level()})")
    cache, query = _filled([5, 2, 9, 4])
    together = attend_slots(query, cache)
    for b in range(4):
        one = SlotCache(cache.key, cache.value, cache.rows[b : b + 1], cache.lengths[b : b + 1],
                        int(cache.lengths[b]))  # fmt: skip
        assert torch.equal(attend_slots(query[b : b + 1], one), together[b : b + 1])


def test_the_kernel_is_off_when_the_settings_say_so() -> None:
    """native_attention_max_queries 0 turns aiayn's kernel off: the reference path runs."""
    cache, query = _filled([3, 4])
    with performance_settings(native_attention_max_queries=0):
        got, want = attend_slots(query, cache), attend_slots_reference(query, cache)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_bad_indices_are_refused_by_the_kernel() -> None:
    if native_attend_rows() is None:
        pytest.skip(f"aiayn's attention kernel does not run here (class {cpu.level()})")
    cache, query = _filled([3, 4])
    bad = SlotCache(cache.key, cache.value, cache.rows, torch.tensor([3, 99]), 99)
    with pytest.raises(RuntimeError, match="lengths: 99 outside"):
        attend_slots(query, bad)
    bad = SlotCache(cache.key, cache.value, torch.tensor([0, 50]), cache.lengths, 4)
    with pytest.raises(RuntimeError, match="rows: 50 outside"):
        attend_slots(query, bad)


def test_appending_writes_each_row_at_its_own_length() -> None:
    pool = _pool()
    rows = SlotRows.taken(pool, [2, 0])
    new_key, new_value = torch.randn(2, H, 1, D), torch.randn(2, H, 1, D)
    appended = rows.cache(0).append(new_key, new_value)
    assert appended.lengths.tolist() == [3, 1] and appended.longest == 3
    slot_a, slot_b = rows.rows.tolist()
    assert torch.equal(pool.buffer[0, 0, slot_a, :, 2], new_key[0, :, 0])
    assert torch.equal(pool.buffer[0, 1, slot_b, :, 0], new_value[1, :, 0])
    with pytest.raises(ValueError, match="one new position"):
        rows.cache(0).append(torch.randn(2, H, 2, D), torch.randn(2, H, 2, D))


def test_write_index_by_hand() -> None:
    """Rows in slots [1, 0] at lengths [2, 0], 2 heads of 4 positions: (slot·H + head)·C +
    length."""
    from aiayn.attention.slots import write_index

    assert write_index(torch.tensor([1, 0]), torch.tensor([2, 0]), 2, 4).tolist() == [10, 14, 0, 4]
