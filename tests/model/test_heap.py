"""The chunked attention's memory (tapecli/model/attention/recompute.py, heap.py): `by_query_chunks` copies each
chunk's output into one buffer (outputs and gradients those of torch.cat), and calls glibc's malloc_trim before a
chunk once the process's resident memory has grown by GROWTH since the last trim, in the forward and in its
recomputation in the backward."""

from __future__ import annotations

import platform

import pytest
import torch

from tapecli.model.attention import heap, recompute

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_release_calls_glibc_and_resident_reads_the_process():
    assert heap.release() is True
    before = heap.resident()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, touched
    assert heap.resident() - before >= 60 << 20
    del block


def test_release_without_the_symbol_is_a_no_op(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.release() is False
    f = lambda i0, i1: None  # noqa: E731
    assert heap.trimming(f) is f


@pytest.mark.parametrize("grad", [True, False])
def test_chunks_equal_one_pass_and_trim_after_each_growth(monkeypatch, grad):
    """Resident memory (faked) grows by GROWTH / 3 per chunk call and falls back to its start at each trim: a
    trim before every third call; the outputs and gradients are those of torch.cat over the chunks."""
    monkeypatch.setattr(heap, "_malloc_trim", lambda: lambda pad: 0)
    memory, trims = [1 << 30], []
    monkeypatch.setattr(heap, "resident", lambda: memory[0])

    def release():
        trims.append(1)
        memory[0] = 1 << 30
        return True

    monkeypatch.setattr(heap, "release", release)
    monkeypatch.setattr(heap, "_baseline", None)
    x = torch.randn(2, 40, 3, dtype=torch.float64, requires_grad=True)

    def chunk(i0, i1):
        memory[0] += heap.GROWTH // 3 + 1
        return x[:, i0:i1].sin().exp()[..., :2]

    with torch.set_grad_enabled(grad):
        out = recompute.by_query_chunks(chunk, 40, rows=1)
        assert torch.equal(out, x.sin().exp()[..., :2])
        calls = 40
        if grad:  # the backward recomputes every chunk: its calls count too
            (grad_x,) = torch.autograd.grad(out.sum(), x)
            assert torch.equal(grad_x, torch.cat([x.sin().exp()[..., :2] * x.cos()[..., :2],
                                                  torch.zeros_like(x[..., 2:])], dim=-1))
            calls = 80
    assert len(trims) == calls // 3


def test_one_chunk_is_fn_itself():
    x = torch.randn(1, 5, 2)
    assert recompute.by_query_chunks(lambda i0, i1: x[:, i0:i1] * 2, 5, rows=8).equal(x * 2)


@pytest.mark.parametrize("grad", [True, False])
def test_no_chunk_output_outlives_the_next_chunk(grad):
    """Each chunk's output is copied into the result and dropped before the next chunk runs (kept outputs pin
    the heap's freed temporaries between them)."""
    import weakref

    x = torch.randn(1, 12, 4, requires_grad=True)
    previous = []

    def chunk(i0, i1):
        assert all(ref() is None for ref in previous)
        out = x[:, i0:i1].sin()
        previous.append(weakref.ref(out))
        return out

    with torch.set_grad_enabled(grad):
        out = recompute.by_query_chunks(chunk, 12, rows=3)
    assert torch.equal(out, x.sin())
