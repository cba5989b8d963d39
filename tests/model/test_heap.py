"""The chunked attention's heap release (tapecli/model/attention/heap.py): glibc's malloc_trim is found, and
`by_query_chunks` calls it before a chunk once INTERVAL seconds have passed since the last release, in the forward
and in its recomputation in the backward."""

from __future__ import annotations

import itertools
import platform

import pytest
import torch

from tapecli.model.attention import heap, recompute


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_release_calls_glibc():
    assert heap.release() is True


def test_release_without_the_symbol_is_a_no_op(monkeypatch):
    monkeypatch.setattr(heap, "_malloc_trim", lambda: None)
    assert heap.release() is False


@pytest.mark.parametrize(("q_len", "grad", "releases"), [(40, True, 80 // 3), (40, False, 40 // 3), (1, True, 0)])
def test_by_query_chunks_releases_every_interval(monkeypatch, q_len, grad, releases):
    """A clock that advances INTERVAL / 3 (and a little) per chunk: a release before every third chunk."""
    calls = []
    monkeypatch.setattr(heap, "release", lambda: calls.append(1) or True)
    clock = itertools.count()
    monkeypatch.setattr(heap, "monotonic", lambda: next(clock) * heap.INTERVAL * 0.34)
    monkeypatch.setattr(heap, "_released", 0.0)
    x = torch.randn(2, q_len, 3, dtype=torch.float64, requires_grad=True)
    with torch.set_grad_enabled(grad):
        out = recompute.by_query_chunks(lambda i0, i1: x[:, i0:i1].sin().exp(), q_len, rows=1)
        assert torch.equal(out, x.sin().exp())
        if grad:  # the backward recomputes every chunk: its chunks count too
            (grad_x,) = torch.autograd.grad(out.sum(), x)
            assert torch.equal(grad_x, x.sin().exp() * x.cos())
    assert len(calls) == releases
