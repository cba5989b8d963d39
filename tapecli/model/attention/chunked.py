"""Exact attention on the CPU, one chunk of queries at a time through torch's fused CPU flash kernel.

    out = chunked_attention(q, k, v, bias, q_pos, k_pos, key_mask, scale, window=None, sinks=None)  # [B, H, Tq, dv]

q [B, H, Tq, d] are the last Tq of Tk = past + Tq tokens; k, v [B, G, Tk, d] with G dividing H (the kernel groups
query heads itself); dv == d (the kernel's rule). Query i sees key j when j <= past + i and j is not padding
(`key_mask` [B, Tk], False for padding; a padded query still sees itself, so its row stays finite), and with a
`window` W when q_pos - k_pos < W. `bias` (a `ScoreBias` or None) is added to the logits.

Each chunk of C queries is one call of `_scaled_dot_product_flash_attention_for_cpu` over the keys it can see, with
the chunk's bias and mask as `attn_mask` [B|1, H|1, C, keys]. The kernel stores only the output and one
log-sum-exp per row; the backward (a custom autograd Function) rebuilds each chunk's mask and calls the kernel's
backward with them. So memory is O(C x Tk) for the chunk's mask, never [Tq, Tk] per head, and nothing of that size
is kept between forward and backward. With a window a chunk's keys start at the first one any of its queries can
see (`key_starts`), so time and memory are O(Tq x (C + W)) instead of O(Tq x Tk), and chunks are kept near W / 4
queries.

The chunk's mask costs nothing when the bias depends on the distance only (`ScoreBias.table`; no bias is a table of
zeros) and positions are consecutive (no padding): with the chunk's queries in reverse order, entry (c, j) of the
mask is entry c + j + offset of one reversed table per head (distances Tk-1 .. 0, -inf from the window on, then
-inf for the future), so the mask is a strided view of that table (`as_strided`, no copy). Otherwise (padding,
positions that are not consecutive, FIRE) each chunk's mask is built from `ScoreBias.pairs` on the chunk's
positions.

Gradients of the bias: for a table (T5's learned buckets) only distances below its last entry need the score
gradient dS = P (dP - rowsum(dO * O)), on the band of those distances: blocks of `BAND_ROWS` queries, each scored
over the keys from m - 2 before it to its last query only, each distance's entries summed as one column of a strided
view of dS (once per distance, not per pair); the last entry, which stands for every longer distance, gets minus
the band's sum (each row of dS sums to zero: softmax is shift-invariant). Any other learned
bias (FIRE) gets dS on all visible keys of the chunk, pulled back through `pairs` by autograd; those chunks take dq,
dk and dv from the same P and dS (`input_grads`) instead of also running the kernel's backward. These pieces of
the backward live in chunked_grads.py.

Attention sinks (`sinks` [H], sinks.py): each chunk's output and log-sum-exp are rescaled to the sink's in the
forward, and everything the backward does reads those, so it is the sink attention's backward; the sinks get
`sinks.sink_grad` per chunk. A row of dS over the real keys then sums to minus the sink's column, which the last
entry of a distance table accounts for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from tapecli.model.attention import chunked_grads as grads
from tapecli.model.attention.dense import visible
from tapecli.model.attention.needs import ScoreBias
from tapecli.model.attention.sinks import rescale, sink_grad

CHUNK_ELEMENTS = 1 << 23  # mask / score elements per chunk (B x H x C x Tk): 32 MiB in fp32
PAIRS_ELEMENTS = 1 << 21  # the same when each chunk's bias is built from pairs (several temporaries of that size)


def kernel_available() -> bool:
    """torch's fused CPU flash-attention kernel (private aten ops, present in torch >= 2.2)."""
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def chunk_rows(batch: int, heads: int, q_len: int, k_len: int, elements: int = CHUNK_ELEMENTS,
               window: int | None = None) -> int:
    """Queries per chunk: a power of two between 16 and 1024 keeping a chunk's mask near `elements`; with a window,
    at most a quarter of it (a chunk then sees about window + rows keys: the fewer rows, the fewer hidden keys)."""
    rows = 1024 if window is None else max(16, 1 << max(0, (window // 4).bit_length() - 1))
    keys = k_len if window is None else min(k_len, window + rows)
    while rows > 16 and batch * heads * rows * keys > elements:
        rows //= 2
    return max(1, min(rows, q_len))


def mask_dtype(dtype: torch.dtype) -> torch.dtype:
    """The kernel adds masks in their own precision: fp32 for half-precision queries, else the query dtype."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def consecutive(q_pos: Tensor, k_pos: Tensor) -> bool:
    """Whether each row's key positions step by one and the queries are the last of them (no padding gaps, no
    random positions), so distances are index differences. Not decided while compiling (a data-dependent branch):
    the general per-chunk masks are exact too."""
    if torch.compiler.is_compiling():
        return False
    q_len = q_pos.shape[-1]
    steps = k_pos[..., 1:] - k_pos[..., :-1]
    # one value read back (on CUDA each read waits for the GPU)
    return bool((steps == 1).all() & (q_pos == k_pos[..., k_pos.shape[-1] - q_len:]).all())


class ChunkMasks:
    """Builds the mask of each chunk (queries in reverse order): a view of one reversed table, or built per chunk."""

    def __init__(self, bias: ScoreBias | None, values: Tensor | None, q_pos: Tensor, k_pos: Tensor,
                 key_mask: Tensor | None, q_len: int, k_len: int, rows: int, dtype: torch.dtype,
                 window: int | None = None, in_steps: bool = False) -> None:
        self.bias, self.q_pos, self.k_pos, self.key_mask = bias, q_pos, k_pos, key_mask
        self.in_steps, self.future = in_steps, {}  # consecutive positions (`consecutive`); causal() masks by size
        self.q_len, self.k_len, self.past, self.dtype, self.window = q_len, k_len, k_len - q_len, dtype, window
        self.reversed = None
        if values is not None:
            # reversed[h, n]: the bias at distance k_len - 1 - n (clamped to the table; -inf from the window on),
            # then -inf for the future.
            far = torch.arange(k_len - 1, -1, -1, device=values.device)
            table = values.detach().to(dtype)[:, far.clamp(max=values.shape[-1] - 1)]
            if window is not None:
                table = table.masked_fill(far >= window, float("-inf"))
            self.reversed = torch.cat((table, values.new_full((values.shape[0], rows - 1), float("-inf"),
                                                              dtype=dtype)), -1)

    def view(self, i0: int, i1: int, k0: int, k1: int) -> Tensor:
        """Mask [1, H, i1 - i0, k1 - k0] for queries i1-1 .. i0 (reversed) and keys k0..k1-1, from the table."""
        table = self.reversed
        return table.as_strided((1, table.shape[0], i1 - i0, k1 - k0), (0, table.stride(0), 1, 1),
                                table.storage_offset() + self.q_len - i1 + k0)

    def pairs(self, i0: int, i1: int, k0: int, k1: int) -> Tensor:
        """The bias [B|1, H, i1 - i0, k1 - k0] of queries i1-1 .. i0 and keys k0..k1-1, unmasked."""
        return self.bias.pairs(self.q_pos[..., i0:i1].flip(-1), self.k_pos[..., k0:k1])

    def build(self, i0: int, i1: int, k0: int, k1: int, bias: Tensor | None = None,
              kept: list | None = None) -> Tensor:
        """Mask [B|1, H|1, i1 - i0, k1 - k0] built from positions (padding, general positions, pair biases);
        `bias`: this chunk's bias when the caller has it already; `kept`: see `causal`."""
        if bias is None and self.bias is not None:
            bias = self.pairs(i0, i1, k0, k1)
        if self.only_causal() and bias is not None:
            return self.causal(bias.to(self.dtype), i1 - i0, k1 - k0, kept)
        q_pos = self.q_pos[..., i0:i1].flip(-1)
        rows = torch.arange(self.past + i1 - 1, self.past + i0 - 1, -1, device=q_pos.device)  # key index of itself
        allowed = visible(rows, torch.arange(k0, k1, device=q_pos.device), self.key_mask, True, self.window, q_pos,
                          self.k_pos[..., k0:k1])
        if self.bias is None:
            zeros = torch.zeros(allowed.shape, dtype=self.dtype, device=q_pos.device)
            return zeros.masked_fill(~allowed, float("-inf"))
        return bias.to(self.dtype).masked_fill(~allowed, float("-inf"))

    def only_causal(self) -> bool:
        """Whether the causal triangle is all a chunk's mask hides (consecutive positions, no padding or window)."""
        return self.in_steps and self.key_mask is None and self.window is None

    def unmasked(self, i0: int, i1: int, k0: int, k1: int, bias: Tensor) -> tuple[Tensor, Tensor | None]:
        """(mask, future) for the backward of a chunk whose bias it has: where only the causal triangle hides
        keys, the bias itself (no copy) and `future` [rows, rows], True for the hidden pairs among the last rows
        keys (the caller zeroes their weights, `probs_and_score_grad`); else the mask `build` makes, and None."""
        if self.only_causal():
            return bias, self.triangle(i1 - i0, bias.device)
        return self.build(i0, i1, k0, k1, bias), None

    def triangle(self, rows: int, device: torch.device) -> Tensor:
        """[rows, rows], True above the diagonal of the last `rows` keys, for query rows in reverse order."""
        if rows not in self.future:
            self.future[rows] = torch.ones(rows, rows, dtype=torch.bool, device=device).triu(1).flip(0)
        return self.future[rows]

    def causal(self, bias: Tensor, rows: int, keys: int, kept: list | None = None) -> Tensor:
        """The mask of a chunk of consecutive positions without padding or window (its keys: every key up to the
        chunk's last query, so keys >= rows): its bias with -inf above the diagonal of the last `rows` keys (query
        rows in reverse order: row c sees keys up to keys - 1 - c), instead of a masked_fill of every pair with a
        mask built from positions; written with a `kept` list into a contiguous bias itself (its last keys and their
        values appended to `kept`, for `chunk` to give back), else into a copy."""
        if kept is not None and bias.is_contiguous():
            mask = bias
            kept.append((bias[..., keys - rows:], bias[..., keys - rows:].clone()))
        else:
            mask = bias.clone(memory_format=torch.contiguous_format)
        mask[..., keys - rows:].masked_fill_(self.triangle(rows, bias.device), float("-inf"))
        return mask

    @contextlib.contextmanager
    def chunk(self, i0: int, i1: int, k0: int, k1: int) -> Iterator[Tensor]:
        """The chunk's mask (`view` or `build`) for the duration of the block. A bias that `causal` masked in place
        (no copy of the chunk's block) gets its last keys' values back at the end, so `pairs` may return a tensor
        it keeps."""
        kept = []
        try:
            yield self.view(i0, i1, k0, k1) if self.reversed is not None else self.build(i0, i1, k0, k1, kept=kept)
        finally:
            for keys, values in kept:
                keys.copy_(values)


def key_starts(q_pos: Tensor, k_pos: Tensor, past: int, starts: list[int], window: int | None,
               consecutive: bool) -> list[int]:
    """The first key each chunk (queries starting at `starts`) must visit: 0 without a window; with one, the first
    key whose position is less than `window` before the chunk's first (smallest) query position in some row.
    Consecutive positions make that an index; otherwise it is searched (positions never decrease along a row).
    While compiling nothing data-dependent is decided: every chunk starts at 0 (exact, not faster)."""
    if window is None or torch.compiler.is_compiling():
        return [0] * len(starts)
    if consecutive:
        return [max(0, past + i0 - (window - 1)) for i0 in starts]
    rows = max(q_pos.shape[0], k_pos.shape[0])
    first = (q_pos[..., starts] - window).expand(rows, -1)  # [B, chunks]: keys at or before these are out of reach
    found = torch.searchsorted(k_pos.expand(rows, -1).contiguous(), first.contiguous(), right=True)
    return found.amin(0).tolist()


class ChunkedAttention(torch.autograd.Function):
    """forward(q, k, v, values, sinks, scale, plan, *parameters) -> out; `plan` holds the bias, positions and window
    (no tensors that need gradients); `values` is the bias table (or None), `sinks` the sink logits [H] (or None),
    `parameters` what `pairs` reads (FIRE)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, values: Tensor | None, sinks: Tensor | None, scale: float,
                plan: dict, *parameters: Tensor) -> Tensor:
        B, H, Tq, _ = q.shape
        Tk = k.shape[2]
        window = plan["window"]
        rows = chunk_rows(B, H, Tq, Tk, CHUNK_ELEMENTS if values is not None or plan["bias"] is None
                          else PAIRS_ELEMENTS, window=window)
        masks = ChunkMasks(plan["bias"], values, plan["q_pos"], plan["k_pos"], plan["key_mask"], Tq, Tk, rows,
                           mask_dtype(q.dtype), window, plan["consecutive"])
        out = q.new_empty(B, H, Tq, v.shape[-1])
        lse = q.new_empty(B, H, Tq, dtype=torch.promote_types(q.dtype, torch.float32))
        past = Tk - Tq
        chunks = list(range(0, Tq, rows))
        firsts = key_starts(plan["q_pos"], plan["k_pos"], past, chunks, window, plan["consecutive"])
        for i0, k0 in zip(chunks, firsts, strict=True):
            i1 = min(i0 + rows, Tq)
            kend = past + i1
            with masks.chunk(i0, i1, k0, kend) as mask:
                o, m = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q[:, :, i0:i1].flip(2), k[:, :, k0:kend], v[:, :, k0:kend], attn_mask=mask, scale=scale)
            if sinks is not None:
                o, m = rescale(o, m, sinks)
            out[:, :, i0:i1] = o.flip(2)
            lse[:, :, i0:i1] = m.flip(-1)
        ctx.save_for_backward(q, k, v, out, lse, values, sinks, *parameters)
        ctx.scale, ctx.rows, ctx.masks, ctx.chunks = scale, rows, masks, list(zip(chunks, firsts, strict=True))
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse, values, sinks, *parameters = ctx.saved_tensors
        scale, rows, masks = ctx.scale, ctx.rows, ctx.masks
        Tq, Tk = q.shape[2], k.shape[2]
        past = Tk - Tq
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        table_grad = values is not None and ctx.needs_input_grad[3]
        pairs_grad = any(ctx.needs_input_grad[7:])
        d_values = torch.zeros_like(values) if table_grad else None
        compute = torch.promote_types(q.dtype, torch.float32)
        band = grads.band_mask(values, grads.BAND_ROWS, masks.window, compute) if table_grad else None
        d_sinks = None if sinks is None else torch.zeros(
            sinks.shape, dtype=torch.promote_types(sinks.dtype, torch.float32), device=sinks.device)
        d_parameters = [torch.zeros_like(p) if ctx.needs_input_grad[7 + i] else None for i, p in enumerate(parameters)]
        for i0, k0 in ctx.chunks:
            i1 = min(i0 + rows, Tq)
            kend = past + i1
            q_c, do_c, o_c, l_c = (t[:, :, i0:i1].flip(2).contiguous() for t in (q, grad_out, out, lse))
            k_c, v_c = k[:, :, k0:kend], v[:, :, k0:kend]
            d_sink = None if sinks is None else sink_grad(do_c, o_c, l_c, sinks)
            if d_sink is not None:
                d_sinks += d_sink
            if pairs_grad:  # the chunk's bias, with its graph to the parameters, serves the mask too
                with torch.enable_grad():
                    bias = masks.pairs(i0, i1, k0, kend)
                mask, future = masks.unmasked(i0, i1, k0, kend, bias.detach())
                # dS is needed for the bias: P and dS give dq, dk, dv too
                probs, ds = grads.probs_and_score_grad(q_c, k_c, v_c, mask, do_c, o_c, l_c, scale, future)
                del mask
                g_q = grads.input_grads(q_c, k_c, v_c, do_c, probs, ds, scale, dk[:, :, k0:kend], dv[:, :, k0:kend])
                del probs
                grads.pairs_grads(d_parameters, parameters, bias, ds)
            else:
                with masks.chunk(i0, i1, k0, kend) as mask:
                    g_q, g_k, g_v = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                        do_c, q_c, k_c, v_c, o_c, l_c, 0.0, False, attn_mask=mask, scale=scale)
                dk[:, :, k0:kend] += g_k
                dv[:, :, k0:kend] += g_v
            dq[:, :, i0:i1] = g_q.flip(2)
            if table_grad:
                grads.band_grad(d_values, q, k, v, grad_out, out, lse, band, past, i0, i1, scale, d_sink)
        d_sinks = None if d_sinks is None else d_sinks.to(sinks.dtype)
        return dq, dk, dv, d_values, d_sinks, None, None, *d_parameters


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, bias: ScoreBias | None, q_pos: Tensor, k_pos: Tensor,
                      key_mask: Tensor | None, scale: float, window: int | None = None,
                      sinks: Tensor | None = None) -> Tensor:
    """Exact causal attention (module docstring); differentiable in q, k, v, the bias's table / parameters and the
    sink logits [H] (None: no sinks)."""
    values = None
    in_steps = key_mask is None and consecutive(q_pos, k_pos)
    if bias is not None and bias.table is not None and in_steps:
        values = bias.table(k.shape[2])
    elif bias is None and window is not None and in_steps:
        values = q.new_zeros(1, 1)  # a window without a bias: masks as views of one table of zeros and -inf
    plan = {"bias": bias, "q_pos": q_pos, "k_pos": k_pos, "key_mask": key_mask, "window": window,
            "consecutive": in_steps}
    parameters = () if bias is None or values is not None else bias.parameters
    apply = eager_apply if parameters else ChunkedAttention.apply
    return apply(q, k, v, values, sinks, scale, plan, *parameters)


def eager_apply(*args) -> Tensor:
    """ChunkedAttention with a learned pair bias (FIRE; T5 while compiling, when positions cannot be checked):
    its backward pulls dS back through the bias with torch.autograd.grad, which torch.compile cannot trace, so under
    torch.compile this one call runs eagerly (a clean graph break; the fused kernels it calls are eager anyway)."""
    return (_outside_the_graph if torch.compiler.is_compiling() else _apply)(*args)


def _apply(*args) -> Tensor:
    return ChunkedAttention.apply(*args)


# torch.compiler.disable, with torch._dynamo imported at the first compiled call instead of here: the import takes
# ~2 s, which every `tape` command would pay at start-up (torch's own lazy form; the public one where it is missing).
_outside_the_graph = getattr(torch, "_disable_dynamo", torch.compiler.disable)(_apply)
