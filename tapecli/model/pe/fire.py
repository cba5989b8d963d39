"""FIRE (Li et al. 2024): a learned per-layer bias b_h(i, j) = f_h( psi(i - j) / (psi(max(i, L)) + eps) ) with
psi(z) = log(|c z| + 1) and f a small MLP (1 -> hidden -> heads). c and L are learned (init 0.1 and threshold).

f is piecewise linear in z (its breaks are where hidden units switch), so the bias of a pair is one multiply-add
with its segment's slope and intercept (`FIRELayer.piecewise_bias`). On the chunked path (a chunk's queries latest
first, its keys in order) psi is computed once per distance and read as diagonals (`Diagonals`), and each row's
segments are runs of keys found once per row and break (`segment_runs`), their lines read and their gradients
summed run by run (`SegmentRuns`); other positions search every pair (`SegmentLines`). Both give the same bias, and
so does FlexAttention's form on CUDA (`fire_score`: each pair's segment by comparing z with the breaks; compiled
with smaller tiles than FlexAttention's defaults, `FLEX_TILES`; reading its learned values from one of
`FLEX_COPIES` copies per pair, so that the backward's atomic additions into them do not all wait on one address).

pe_args:
  hidden      width of f (32)
  init_c      initial c (0.1)
  threshold   initial L (512); L = |l * threshold| with l learned, init 1
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import (
    LayerPE,
    PositionalEncoding,
    PositionState,
    ScoreBias,
    ScoreMod,
    check_positive_int,
    check_range,
)

EPS = 1e-6
# FlexAttention's tiles for `fire_score` on CUDA: with its default ones no kernel configuration compiled on an H200
# (torch 2.11: "No valid triton configs", training and forward alike); these compile and train there.
FLEX_TILES = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32,
              "num_stages": 1}
# Copies of each learned value `fire_score` reads, one chosen per pair: FlexAttention's backward adds each score's
# gradient into what it read with an atomic addition, and one address per head (c, L) would take all T^2 / 2 of them
# in turn; spread over the copies, which autograd then sums (`FIRELayer.score_mod_args`).
FLEX_COPIES = 64


class SegmentLines(torch.autograd.Function):
    """slopes[:, segment] * z + intercepts[:, segment], [H, *z.shape]: each pair's line (`pieces`). Both tables
    are read with one `index_select` of the [2H, segments] table (heads first, so the bias comes out in the layout
    attention adds it in, with no transposing copy), and the backward sums each segment's gradient with
    scatter_add_ (a third of the time of the index_put with accumulation that autograd would use)."""

    @staticmethod
    def forward(ctx, z: Tensor, slopes: Tensor, intercepts: Tensor, segment: Tensor) -> Tensor:
        heads = slopes.shape[0]
        lines = torch.cat((slopes, intercepts)).index_select(1, segment.reshape(-1)).view(2, heads, *z.shape)
        ctx.save_for_backward(z, lines[0], segment)
        ctx.segments = slopes.shape[1]
        return torch.addcmul(lines[1], lines[0], z)

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, per_pair, segment = ctx.saved_tensors
        heads = per_pair.shape[0]
        index = segment.reshape(1, -1).expand(heads, -1)

        def per_segment(values: Tensor) -> Tensor:
            return values.new_zeros(heads, ctx.segments).scatter_add_(1, index, values.reshape(heads, -1))

        d_z = head_sum(grad, per_pair) if ctx.needs_input_grad[0] else None
        d_slopes = per_segment(grad * z) if ctx.needs_input_grad[1] else None
        d_intercepts = per_segment(grad) if ctx.needs_input_grad[2] else None
        return d_z, d_slopes, d_intercepts, None


class SegmentRuns(torch.autograd.Function):
    """`SegmentLines` for rows whose segments are runs of consecutive keys (`segment_runs`): each pair's segment
    is written run by run (`repeat_interleave`, no search), its line read with one `index_select` of the
    [2H, segments] table, and the backward sums each run with `segment_reduce` (contiguous runs: no scatter over
    every pair), then each segment over its runs.
    `ids` [runs per row] is the segment of each run, `lengths` [rows, runs per row] its number of keys."""

    @staticmethod
    def forward(ctx, z: Tensor, slopes: Tensor, intercepts: Tensor, ids: Tensor, lengths: Tensor) -> Tensor:
        heads, rows = slopes.shape[0], lengths.shape[0]
        segment = ids.repeat(rows).repeat_interleave(lengths.reshape(-1), output_size=z.numel())  # of each pair
        lines = torch.cat((slopes, intercepts)).index_select(1, segment).view(2, heads, *z.shape)
        ctx.save_for_backward(z, lines[0], ids, lengths)
        ctx.segments = slopes.shape[1]
        return torch.addcmul(lines[1], lines[0], z)

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, per_pair, ids, lengths = ctx.saved_tensors
        heads, rows = per_pair.shape[0], lengths.shape[0]
        runs = lengths.reshape(1, -1).expand(heads, -1).contiguous()

        def per_segment(values: Tensor) -> Tensor:
            per_run = torch.segment_reduce(values.reshape(heads, -1), "sum", lengths=runs, axis=1)
            return values.new_zeros(heads, ctx.segments).index_add_(1, ids, per_run.view(heads, rows, -1).sum(1))

        d_z = head_sum(grad, per_pair) if ctx.needs_input_grad[0] else None
        d_slopes = per_segment(grad * z) if ctx.needs_input_grad[1] else None
        d_intercepts = per_segment(grad) if ctx.needs_input_grad[2] else None
        return d_z, d_slopes, d_intercepts, None, None


def head_sum(grad: Tensor, per_pair: Tensor) -> Tensor:
    """sum_h grad[h] * per_pair[h] over the leading (head) dimension, accumulated in place head by head (no
    [H, ...] product in memory)."""
    out = grad[0] * per_pair[0]
    for h in range(1, grad.shape[0]):
        out.addcmul_(grad[h], per_pair[h])
    return out


def break_points(normaliser: Tensor, breaks: Tensor) -> Tensor | None:
    """theta [R, U]: the largest float x with x / normaliser[r] <= breaks[u] (float division, as `features`
    divides), so that psi / normaliser[r] > breaks[u] exactly when psi > theta (x -> x / n is monotone for n > 0).
    Starts from breaks x normaliser and steps by one float; None where that does not settle within a few steps."""
    n, b = normaliser[:, None], breaks[None, :]
    up, down = torch.tensor(float("inf"), dtype=n.dtype), torch.tensor(float("-inf"), dtype=n.dtype)
    x = b * n
    for _ in range(4):
        x = torch.where(x / n > b, torch.nextafter(x, down), x)
    for _ in range(4):
        step = torch.nextafter(x, up)
        x = torch.where(step / n <= b, step, x)
    settled = (x / n <= b) & ((torch.nextafter(x, up) / n > b) | (x == up))
    return x if bool(settled.all()) else None


def segment_runs(psi: Tensor, normaliser: Tensor, breaks: Tensor, largest: int, keys: int) -> tuple | None:
    """Each pair's segment (`torch.searchsorted(breaks, z)`, the number of breaks below z) as runs of keys, for
    the [R, K] block that `Diagonals` reads from psi (entry t at distance largest - t; row r, key j at t = r + j)
    divided by normaliser [R]. In a row z falls with the distance down to 0, then rises again (future keys,
    masked by attention but given their bias all the same), so each row is at most 2 (U + 1) runs of one segment:
    the first key of each is found per (row, break) with `break_points` and one searchsorted over the 1-D table,
    never per pair. The same segments as searching every pair, as long as psi is monotone in |distance| on each
    side of 0 (checked; None otherwise, and for dtypes without exact steps). Returns (ids [2(U+1)], lengths
    [R, 2(U+1)]): the segment of each run, past runs first (segments U..0), then future ones (0..U)."""
    if psi.dtype not in (torch.float32, torch.float64):
        return None
    past = min(max(largest + 1, 0), psi.shape[0])  # entries at distances >= 0, the largest first
    near, far = psi[:past].flip(0), psi[past:]  # psi by |distance|, ascending on each side
    if not (bool((near[1:] >= near[:-1]).all()) and bool((far[1:] >= far[:-1]).all())):
        return None
    theta = break_points(normaliser, breaks)
    if theta is None:
        return None
    rows = torch.arange(normaliser.shape[0], device=psi.device)[:, None]
    seen = (past - rows).clamp(0, keys)  # keys at distances >= 0 in each row
    # Past keys (j < seen): segment >= u + 1 where j <= past - 1 - r - (entries of near <= theta_u).
    above = (past - rows - torch.searchsorted(near, theta, right=True)).clamp(min=0).minimum(seen)
    edges = torch.cat((seen, above, torch.zeros_like(seen)), 1)  # [R, U + 2], falling
    falling = (edges[:, :-1] - edges[:, 1:]).flip(1)  # runs of segments U .. 0
    # Future keys (j >= seen): segment <= u where j < past - r + (entries of far <= theta_u).
    below = (past - rows + torch.searchsorted(far, theta, right=True)).clamp(max=keys).maximum(seen) - seen
    edges = torch.cat((torch.zeros_like(seen), below, keys - seen), 1)  # rising
    rising = edges[:, 1:] - edges[:, :-1]  # runs of segments 0 .. U
    segments = torch.arange(breaks.shape[0] + 1, device=psi.device)
    return torch.cat((segments.flip(0), segments)), torch.cat((falling, rising), 1)


class Diagonals(torch.autograd.Function):
    """table[r + j] / normaliser[r] as a [R, K] tensor: one strided read of a 1-D table (no per-pair index),
    divided in the same pass. Its backward sums each anti-diagonal of grad / normaliser back into its table entry
    and gives the normaliser -sum_j grad z / normaliser (autograd's own backward of an overlapping `as_strided`
    view is far slower, and that of the division takes several passes over the block)."""

    @staticmethod
    def forward(ctx, table: Tensor, normaliser: Tensor, rows: int, keys: int) -> Tensor:
        z = torch.div(table.as_strided((rows, keys), (1, 1)), normaliser,  # normaliser [R, 1]
                      out=table.new_empty(rows, keys))  # contiguous (the view's strides would give 1, 1)
        ctx.save_for_backward(z, normaliser)
        ctx.shape = (rows, keys, table.shape[0])
        return z

    @staticmethod
    def backward(ctx, grad: Tensor):
        z, normaliser = ctx.saved_tensors
        rows, keys, n = ctx.shape
        d_table = d_normaliser = None
        if ctx.needs_input_grad[0]:
            # Row r of grad / normaliser written at columns r .. r + keys - 1 of a [rows, n] buffer: column sums
            # are the diagonal sums.
            spread = grad.new_zeros(rows, n)
            torch.div(grad, normaliser, out=spread.as_strided((rows, keys), (n + 1, 1)))
            d_table = spread.sum(0)
        if ctx.needs_input_grad[1]:
            d_normaliser = -torch.linalg.vecdot(grad, z).unsqueeze(-1) / normaliser
        return d_table, d_normaliser, None, None


def steps_apart(q_pos: Tensor, k_pos: Tensor) -> bool:
    """Whether the query positions fall by one (a chunk's queries, latest first) and the key positions rise by one,
    in one row of positions: then the distance of pair (r, j) is q_pos[0] - k_pos[0] - (r + j). Never decided while
    compiling (a data-dependent branch)."""
    if torch.compiler.is_compiling() or q_pos.shape[0] != 1 or k_pos.shape[0] != 1:
        return False
    return bool((q_pos[..., :-1] - q_pos[..., 1:] == 1).all()) and bool((k_pos[..., 1:] - k_pos[..., :-1] == 1).all())


def fire_score(h: Tensor, q_pos: Tensor, k_pos: Tensor, c_distance: Tensor, c_query: Tensor, threshold: Tensor,
               slopes: Tensor, intercepts: Tensor, *breaks: Tensor) -> Tensor:
    """The bias of one (head, query, key) inside FlexAttention (`ScoreMod`; `FIRELayer.score_mod_args` gives the
    arguments): z, its segment (how many breaks lie below it), then that segment's line, as `piecewise_bias`.
    What needs gradients is read once, at the head and at the pair's copy (`FLEX_COPIES`; neighbouring pairs of a
    tile read different ones); the breaks (0-d, no gradient) are compared with z."""
    dtype = c_distance.dtype
    copies = c_distance.shape[-1]
    copy = (q_pos * 31 + k_pos) % copies
    z = torch.log(torch.abs(c_distance[h, copy] * (q_pos - k_pos).to(dtype)) + 1) / (
        torch.log(torch.abs(c_query[h, copy] * torch.maximum(q_pos.to(dtype), threshold[h, copy])) + 1) + EPS)
    segment = torch.zeros_like(q_pos)
    for point in breaks:
        segment = segment + (z > point).to(segment.dtype)
    line = segment * copies + copy  # [H, segments x copies]: indexed like [h, segment] before the copies
    return slopes[h, line] * z + intercepts[h, line]


class FIRELayer(LayerPE):
    def __init__(self, n_heads: int, hidden: int, init_c: float, threshold: float) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))
        self.c = nn.Parameter(torch.tensor(init_c))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))
        self.threshold = threshold

    def psi(self, z: Tensor) -> Tensor:
        return torch.log(torch.abs(self.c * z) + 1)

    def need(self, state: PositionState, average_state: bool) -> ScoreBias:
        """A bias of (query position, distance): attention builds it one chunk of queries at a time (CPU,
        `piecewise_bias`) or evaluates it inside FlexAttention (CUDA), never for all [T, T] pairs at once."""
        return ScoreBias(pairs=self.piecewise_bias, score_mod=ScoreMod(fire_score, self.score_mod_args(), FLEX_TILES),
                         parameters=tuple(self.parameters()))

    def features(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """z = psi(i - j) / (psi(max(i, L)) + eps), [B|1, Tq, Tk], for positions [B|1, Tq] and [B|1, Tk]."""
        return self.normalised(q_pos, k_pos)[0]

    def normalised(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, tuple | None]:
        """`features`, and for positions in steps (`steps_apart`) what `segment_runs` reads: (psi per distance
        [Tq + Tk - 1], largest first; the normaliser [Tq]; the largest distance); None otherwise."""
        dtype = self.c.dtype  # fp32, or fp64 in an fp64 model
        threshold = torch.abs(self.threshold_scale * self.threshold)
        normaliser = self.psi(torch.maximum(q_pos.to(dtype), threshold))[..., :, None] + EPS
        if steps_apart(q_pos, k_pos):
            # psi of each distance once (a 1-D table, from the largest distance down), read as [Tq, Tk] diagonals:
            # the same floats as psi(i - j) computed per pair.
            Tq, Tk = q_pos.shape[-1], k_pos.shape[-1]
            largest = int(q_pos[0, 0] - k_pos[0, 0])
            table = self.psi((largest - torch.arange(Tq + Tk - 1, device=q_pos.device)).to(dtype))
            z = Diagonals.apply(table, normaliser[0], Tq, Tk)[None]
            return z, (table.detach(), normaliser.detach()[0, :, 0], largest)
        psi = self.psi((q_pos[..., :, None] - k_pos[..., None, :]).to(dtype))  # [B, Tq, Tk]
        return psi / normaliser, None

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The definition: f = the MLP, applied to every pair's z. [B|1, H, Tq, Tk]."""
        return self.mlp(self.features(q_pos, k_pos).unsqueeze(-1)).permute(0, 3, 1, 2)

    def pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """f as the piecewise-linear function it is: (breaks [U] sorted, slopes [H, U + 1], intercepts [H, U + 1]),
        f_h(z) = slopes[h, s] z + intercepts[h, s] for z in segment s = (breaks[s-1], breaks[s]]. Unit u of the
        hidden layer switches at z = -b1_u / w1_u (never when w1_u = 0: an infinite break). Differentiable in the
        MLP's weights (which units are active in a segment is a constant of the segment)."""
        first, second = self.mlp[0], self.mlp[2]
        w1, b1 = first.weight[:, 0], first.bias
        with torch.no_grad():
            breaks = torch.where(w1 != 0, -b1 / w1, torch.full_like(b1, float("inf"))).sort().values
            inner = (breaks[:-1] + breaks[1:]) / 2  # one point inside each segment (inf past the last finite break)
            points = torch.cat((breaks[:1] - 1, inner, breaks[-1:] + 1))
            active = torch.where(w1 == 0, b1 > 0, w1 * points[:, None] + b1 > 0).to(w1.dtype)  # [U + 1, U]
        slopes = (second.weight * w1) @ active.T
        intercepts = second.bias[:, None] + (second.weight * b1) @ active.T
        return breaks, slopes, intercepts

    def piecewise_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """`bias` without the [.., hidden] activation: each pair's segment, then one multiply-add per head
        (equal to the MLP up to float rounding, and so are its gradients). [B|1, H, Tq, Tk]. For positions in
        steps (a chunk of the chunked path) the segments are runs of keys found per row (`segment_runs`, the
        same segments as a search per pair), else searched per pair."""
        z, diagonals = self.normalised(q_pos, k_pos)
        breaks, slopes, intercepts = self.pieces()
        runs = None if diagonals is None else segment_runs(*diagonals[:2], breaks, diagonals[2], z.shape[-1])
        if runs is not None:
            return SegmentRuns.apply(z, slopes, intercepts, *runs).transpose(0, 1)  # [H, 1, ..] -> [1, H, ..]
        segment = torch.searchsorted(breaks, z.detach())
        return SegmentLines.apply(z, slopes, intercepts, segment).transpose(0, 1)  # [H, B|1, ..] -> [B|1, H, ..]

    def score_mod_args(self) -> tuple[Tensor, ...]:
        """What `fire_score` reads: c twice and L, each repeated per head and copy ([H, FLEX_COPIES]), the
        slopes and intercepts of `pieces` per copy ([H, (U + 1) x FLEX_COPIES], segment-major), then each break
        (0-d). What requires gradients is its own tensor, read once per call: FlexAttention's backward cannot lower
        several reads of one tensor that requires gradients, nor (torch <= 2.13) the gradient of a 0-d tensor read
        directly (pytorch/pytorch#145208). Gradients reach c, L and the MLP through the repeats and `pieces`
        (autograd sums the copies); the breaks are constants of the segments."""
        heads = self.mlp[2].weight.shape[0]
        threshold = torch.abs(self.threshold_scale * self.threshold)
        breaks, slopes, intercepts = self.pieces()
        per_copy = (heads, FLEX_COPIES)
        return (self.c.repeat(per_copy), self.c.repeat(per_copy), threshold.repeat(per_copy),
                slopes.repeat_interleave(FLEX_COPIES, 1), intercepts.repeat_interleave(FLEX_COPIES, 1),
                *breaks.unbind(0))

    def init_weights(self) -> None:
        for linear in (self.mlp[0], self.mlp[2]):
            nn.init.zeros_(linear.bias)


class FIRE(PositionalEncoding):
    def __init__(self, config, *, hidden: int = 32, init_c: float = 0.1, threshold: float = 512.0) -> None:
        super().__init__(config)
        check_positive_int("hidden", hidden)
        check_range("init_c", init_c, 0, what=" (c in log(c x + 1))")
        check_range("threshold", threshold, 0)
        self.hidden, self.init_c, self.threshold = hidden, init_c, threshold

    def make_layer(self, layer_idx: int) -> LayerPE:
        return FIRELayer(self.config.n_heads, self.hidden, self.init_c, self.threshold)
