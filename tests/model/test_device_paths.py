"""FoX and stick-breaking on every device present: a training step's logits and gradients equal the fp64 CPU
reference (every score materialised), with padding and grouped-query heads; bf16 steps stay close and finite.

On the CPU this checks the CPU paths (fox-flash, stickbreaking-recompute); on a machine with CUDA the same tests
also run there and check the CUDA paths (FoX: FlexAttention, fla's kernel for unpadded bf16 when installed;
stick-breaking: the chunked torch path, fla's kernel when installed):

    PYTHONPATH=. python3 -m pytest tests/model/test_device_paths.py -q
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_model import VOCAB, randomize_tape, tiny

from tapecli.model import attention

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOLERANCE = {"cpu": 1e-5, "cuda": 2e-3}  # fp32 against fp64, relative to the largest entry (CUDA: TF32 kernels)
PRO_ROPE = {"rope": True, "qk_norm": True, "k_shift": True, "v_shift": True, "output_gate": True,
            "output_norm": True}
CASES = [("fox", {}), ("fox", PRO_ROPE), ("stickbreaking", {}),
         ("stickbreaking", {"attend_current": True, "remainder": True})]
IDS = ["fox", "fox-pro-rope", "stickbreaking", "stickbreaking-options"]


def step(model, x, mask):
    """Logits and the gradient of every parameter for a weighted sum of the real tokens' logits."""
    model.zero_grad(set_to_none=True)
    logits = model(x, attention_mask=mask)
    weight = torch.linspace(-1, 1, logits.shape[-1], device=logits.device, dtype=torch.float32)
    (logits.float() * weight * mask[..., None]).sum().backward()
    return logits.detach().double().cpu(), [p.grad.double().cpu() for p in model.parameters()]


def relative(got, want) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp(min=1e-12)).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pe,pe_args", CASES, ids=IDS)
def test_training_step_equals_the_fp64_reference(device, pe, pe_args):
    # head_dim 16: the smallest FlexAttention and fla take on CUDA
    model = randomize_tape(tiny(pe, dim=64, n_kv_heads=2, pe_args=pe_args), std=0.3).train()
    x = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, :5] = 0
    with attention.forced("dense"):
        want_logits, want_grads = step(copy.deepcopy(model).double(), x, mask)
    model = model.to(device)
    x, mask = x.to(device), mask.to(device)
    with attention.recording() as taken:
        logits, grads = step(model, x, mask)
    real = mask.bool().cpu()
    assert relative(logits[real], want_logits[real]) <= TOLERANCE[device], taken
    for (name, _), got, want in zip(model.named_parameters(), grads, want_grads, strict=True):
        assert relative(got, want) <= 10 * TOLERANCE[device], (name, taken)
    if device == "cuda" and pe == "fox":
        assert taken == ["fox-flex"] * 2
    # bf16 autocast: unpadded (fla's kernels when installed) and padded steps, close to the reference
    for rows in (slice(0, 1), slice(0, 2)):
        with torch.autocast(device, dtype=torch.bfloat16):
            half_logits, half_grads = step(model, x[rows], mask[rows])
        assert relative(half_logits[real[rows]], want_logits[rows][real[rows]]) <= 0.05
        assert all(torch.isfinite(g).all() for g in half_grads)
