"""The `score-mod` check of `tape pe check`: a bias PE's FlexAttention form (`ScoreBias.score_mod`, what a GPU trains
with) gives the attention of its reference form (`ScoreBias.pairs`), in outputs and in gradients.

For every layer whose `need` is a ScoreBias with a score_mod: causal attention of random q, k, v (fp64, positions
3..3+T) through FlexAttention's own unfused forward and backward, with the score_mod tape builds for the layer
(`tapecli.model.attention.flex.score_mod_of`), against softmax(q.k / sqrt(d) + pairs) v with every score
materialised; compared are the outputs and the gradients to q, k, v and to every tensor the layer's parameters
reach. FlexAttention's unfused path is the mathematics its CUDA kernels compile, so a score_mod that disagrees
with `pairs`, or whose gradients FlexAttention cannot take (a 0-d tensor that requires gradients read directly:
its backward fails), fails here, on the CPU. torch refuses that backward on the CPU by a device check only; it is
lifted for the call (`unfused_backward_on_cpu`).
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
from torch import Tensor

from tapecli.model.attention import flex
from tapecli.model.attention.needs import ScoreBias
from tapecli.pe.check.subject import EXACT_TOLERANCE, Subject, relative

LENGTH, HEAD_DIM, START = 20, 8, 3
TOLERANCE = EXACT_TOLERANCE["cpu"]  # fp64: the two forms differ by rounding only


@contextlib.contextmanager
def unfused_backward_on_cpu():
    """FlexAttention's unfused path with its backward allowed on the CPU (torch checks the device, nothing else),
    without its warning that the path is unfused (that is the point here)."""
    module = flex.flex_module()
    previous = getattr(module, "_validate_device", None)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        if previous is None:
            yield
            return
        module._validate_device = lambda *args, **kwargs: None
        try:
            yield
        finally:
            module._validate_device = previous


def layer_difference(need: ScoreBias, parameters: list[Tensor], heads: int) -> float:
    """The largest difference, relative to the reference's largest value, over the output and each gradient."""
    generator = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(1, heads, LENGTH, HEAD_DIM, dtype=torch.float64, generator=generator).requires_grad_()
               for _ in range(3))
    pos = torch.arange(START, START + LENGTH)[None]
    scale = HEAD_DIM ** -0.5
    score_mod = flex.score_mod_of(need.score_mod, pos, pos, torch.tensor(1.0, dtype=torch.float64))
    mask = flex.block_mask(1, LENGTH, LENGTH, None, q.device)
    with unfused_backward_on_cpu():
        got = flex.flex_module().flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    causal = torch.ones(LENGTH, LENGTH, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2)) * scale + need.pairs(pos, pos).to(torch.float64)
    want = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
    inputs = [q, k, v, *parameters]
    weight = torch.randn(want.shape, dtype=torch.float64, generator=generator)
    try:
        got_grads = torch.autograd.grad((got * weight).sum(), inputs, allow_unused=True)
    except Exception as e:  # noqa: BLE001 - torch's message names vmap, not the rule the score_mod broke
        raise ValueError(f"FlexAttention's backward fails ({type(e).__name__}: {str(e).splitlines()[0][:80]}): each "
                         "tensor of the score_mod that requires gradients must be read once and indexed, e.g. "
                         "w[h] (docs/pe-api.md)") from e
    want_grads = torch.autograd.grad((want * weight).sum(), inputs, allow_unused=True)
    worst = relative(got.detach(), want.detach())
    if any((g is None) != (w is None) for g, w in zip(got_grads, want_grads, strict=True)):
        return math.inf  # a gradient one side has and the other has not
    # A gradient that is zero in exact arithmetic (an output bias per head: softmax ignores it) is rounding on both
    # sides: each gradient is compared relative to the largest of all, as the dense check does.
    largest = max(w.abs().max().item() for w in want_grads if w is not None)
    return max([worst] + [relative(g, w, 1e-3 * largest) for g, w in zip(got_grads, want_grads, strict=True)
                          if w is not None])


def score_mod_verdict(subject: Subject) -> tuple[bool, float | None, str]:
    """(passed, the largest relative difference or None, the line `tape pe check` prints)."""
    model = subject.model(torch.float64, torch.device("cpu"), train=True)
    state = model.model.pe.initial_state(torch.arange(START, START + LENGTH)[None], torch.float64)
    worst, layers = 0.0, []
    for i, block in enumerate(model.model.layers):
        need = block.pe.need(state, False)
        if isinstance(need, ScoreBias) and need.score_mod is not None:
            layers.append(str(i))
            parameters = [p for p in block.pe.parameters() if p.requires_grad]
            worst = max(worst, layer_difference(need, parameters, model.config.n_heads))
    if not layers:
        return True, None, "no layer has a FlexAttention form (a ScoreBias with a score_mod)"
    return worst <= TOLERANCE, worst, (
        f"FlexAttention's unfused forward and backward with the score_mod vs the pairs bias (fp64, CPU, layers "
        f"{', '.join(layers)}): max relative diff {worst:.1e} (tolerance {TOLERANCE:.0e})")
