"""Compact layouts of views and the host arena's allocator."""

from __future__ import annotations

import pytest
import torch

from cswap.execute.arena import ALIGN_BYTES, HostArena, aligned
from cswap.execute.layout import Layout

BASE = torch.arange(4 * 6 * 8, dtype=torch.float32).view(4, 6, 8)

VIEWS = {
    "contiguous": (lambda: BASE, True, True),
    "transpose": (lambda: BASE.transpose(0, 2), True, True),
    "channels-last": (lambda: BASE.view(1, 4, 6, 8).contiguous(memory_format=torch.channels_last), True, True),
    "strided": (lambda: BASE[:, ::2, 1::3], False, True),
    "offset": (lambda: BASE.view(-1)[3:50], True, True),
    "broadcast": (lambda: BASE[:1].expand(4, 6, 8), True, True),
    "broadcast-of-slice": (lambda: BASE[:, :1, :].expand(4, 6, 8), False, True),
    "broadcast-scalar": (lambda: torch.tensor(2.5).expand(3, 5), True, True),
    "overlapping": (lambda: BASE.view(-1).unfold(0, 8, 4), False, False),
    "bool": (lambda: (BASE > 50)[:, 1], False, True),
}


@pytest.mark.parametrize("name", VIEWS)
def test_compact_form_rebuilds_the_view(name: str) -> None:
    make, dense, exact = VIEWS[name]
    view = make()
    layout = Layout.of(view)
    assert (layout.dense, layout.exact) == (dense, exact)
    compact = layout.compact(view)
    assert compact.dim() == 1 and compact.numel() == layout.numel and compact.is_contiguous()
    for rebuilt in (layout.rebuild_from(compact.clone()), _via_allocate(layout, compact)):
        assert rebuilt.shape == view.shape and rebuilt.dtype == view.dtype
        assert torch.equal(rebuilt, view)
        if exact:
            assert rebuilt.stride() == view.stride()
            assert rebuilt.storage_offset() * rebuilt.element_size() % 64 == view.storage_offset() * view.element_size() % 64


@pytest.mark.parametrize("name", VIEWS)
def test_a_rebuild_holds_at_most_the_layouts_rebuilt_bytes(name: str) -> None:
    """What room-making asks for before a rebuild bounds the buffer the rebuild holds; a strided
    slice spans the rows it skips, more than its data."""
    view = VIEWS[name][0]()
    layout = Layout.of(view)
    compact = layout.compact(view)
    for rebuilt in (layout.rebuild_from(compact.clone()), _via_allocate(layout, compact)):
        assert rebuilt.untyped_storage().nbytes() <= layout.rebuilt_nbytes
    if name == "strided":
        assert layout.rebuilt_nbytes > layout.nbytes


def _via_allocate(layout: Layout, compact: torch.Tensor) -> torch.Tensor:
    flat, result = layout.allocate(torch.device("cpu"))
    flat.copy_(compact)
    return result if result is not None else layout.rebuild_from(flat)


def test_broadcast_stores_one_copy() -> None:
    layout = Layout.of(BASE[:, :1, :].expand(4, 6, 8))
    assert layout.base_shape == (4, 1, 8) and layout.numel == 32 and layout.nbytes == 128


def test_dense_compact_form_is_a_view_without_copy() -> None:
    view = BASE.transpose(0, 2)
    assert Layout.of(view).compact(view).data_ptr() == BASE.data_ptr()


def test_arena_first_fit_alignment_and_coalescing() -> None:
    arena = HostArena(pin_memory=False)
    arena.reserve(1000)
    assert arena.capacity_bytes == aligned(1000) == 1024
    a, b, c = arena.alloc(100), arena.alloc(1), arena.alloc(200)
    assert [blk.offset for blk in (a, b, c)] == [0, 128, 192]
    assert all(blk.offset % ALIGN_BYTES == 0 for blk in (a, b, c))
    assert [arena.tensor(blk, torch.uint8, (n,)).numel() for blk, n in ((a, 100), (b, 1), (c, 200))] == [100, 1, 200]
    assert (a.size, b.size, c.size) == (128, 64, 256)
    doubles = arena.tensor(c, torch.float64, (5, 5), (5, 1))  # typed, shaped, from the block's first byte
    doubles.fill_(1.0)
    assert doubles.data_ptr() == arena.tensor(c, torch.uint8, (200,)).data_ptr() and doubles.sum().item() == 25.0
    arena.free(a)
    arena.free(b)  # coalesces with a's block: 192 free bytes at the start
    d = arena.alloc(192)
    assert d.offset == 0
    assert arena.alloc(10_000) is None and arena.misses == 1 and arena.missed_bytes == aligned(10_000)
    arena.free(c)
    arena.free(d)
    assert arena.used_bytes == 0 and arena.alloc(1024).offset == 0


def test_arena_grows_by_a_chunk_while_used_and_merges_when_empty() -> None:
    arena = HostArena(pin_memory=False)
    arena.reserve(256)
    block = arena.alloc(256)
    arena.reserve(1024)  # a live block: add a chunk rather than move it
    assert arena.capacity_bytes == 1024
    second = arena.alloc(512)
    assert second.chunk == 1
    arena.free(block)
    arena.free(second)
    arena.reserve(2048)  # empty: one chunk of the whole size
    assert arena.capacity_bytes == 2048 and arena.alloc(2048).chunk == 0
    arena.reset_peak()
    assert arena.peak_used_bytes == arena.used_bytes == 2048 and arena.missed_bytes == 0
