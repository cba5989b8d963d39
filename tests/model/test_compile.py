"""`train.compile: true` works for every PE: a torch.compile'd training step (forward + backward) equals eager.

One tiny model per PE (1 layer, grouped-query heads, trained-like PE weights); the loss and every gradient of the
compiled step match the eager step of an identical model.

- Every PE through dynamo and AOTAutograd (backend `aot_eager`): this is where PE code breaks under compile
  (data-dependent branches, custom autograd Functions, checkpointed chunks). Every PE but T5 and FIRE compiles into
  one graph (`fullgraph=True`); their chunked attention call runs eagerly under compile (`chunked.eager_apply`: its
  backward calls torch.autograd.grad), a deliberate graph break.
- Inductor (the backend `train.compile: true` uses; gcc on the CPU) for ALiBi: the chunked path's custom Function,
  with the fused CPU flash kernels, inside the compiled graph. Inductor takes tens of seconds per PE on a 2-core CPU,
  so the other PEs are left to `tape pe check NAME --compile`. The inductor cache is a temporary directory.
"""

from __future__ import annotations

import pytest
import torch
from test_model import VOCAB, randomize_tape, tiny

from tapecli.model import PE_NAMES

GRAPH_BREAKS = ("t5", "fire")  # chunked.eager_apply: a deliberate graph break
INDUCTOR_PES = ("alibi",)


@pytest.fixture(scope="module", autouse=True)
def inductor_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield


def step(model, x, run=None):
    """One training step of `model` (through `run`, its compiled form, when given): the loss and every gradient."""
    logits = (model if run is None else run)(x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def check_compiled_step(pe: str, backend: str) -> None:
    from torch._dynamo.testing import CompileCounterWithBackend  # imports torch._dynamo (~2.5 s): not at collection

    torch._dynamo.reset()  # a fresh model per PE would otherwise count as recompilations of the same frames
    x = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    eager = randomize_tape(tiny(pe, n_layers=1, n_kv_heads=2), std=0.3).train()
    model = randomize_tape(tiny(pe, n_layers=1, n_kv_heads=2), std=0.3).train()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, fullgraph=pe not in GRAPH_BREAKS)
    torch.manual_seed(0)  # RandPE draws its training positions (eager RNG: aot_eager only)
    want_loss, want = step(eager, x)
    torch.manual_seed(0)
    got_loss, got = step(model, x, compiled)
    assert counter.frame_count >= 1 and counter.op_count > 0  # something really was compiled
    assert torch.allclose(got_loss, want_loss, atol=1e-5), (got_loss, want_loss)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.slow
@pytest.mark.parametrize("pe", PE_NAMES)
def test_every_pe_traces_one_training_step(pe):
    check_compiled_step(pe, "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("pe", INDUCTOR_PES)
def test_inductor_compiles_one_training_step(pe):
    check_compiled_step(pe, "inductor")
