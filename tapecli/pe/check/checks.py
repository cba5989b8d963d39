"""The conformance checks of `tape pe check`: each a function of the `Subject` giving one `Outcome` (pass or fail and
the number behind it). `CHECKS` lists them in the order they run; `tape doctor` runs four of them per PE.

  causality          changing the tokens from position t on changes no logit before t
  kv-cache           greedy decoding with the KV cache equals the full forward of each prefix, step by step
                     (also for a left-padded row)
  chunked-prefill    a prompt prefilled through the cache in chunks of 5 tokens ends with the full forward's
                     logits (also left-padded)
  dense              fp32 on the device, on the attention paths it picks (linear memory), equals the fp64 CPU
                     reference with every score materialised (attention.forced("dense")): outputs of a left-padded
                     batch, and outputs and gradients of a training forward, without and with padding
  score-mod          a bias PE's FlexAttention form (what a GPU trains with) equals its `pairs` bias: outputs and
                     gradients through FlexAttention's own unfused forward and backward, fp64 on the CPU
                     (score_mod.py)
  padding            each row left- or right-padded by 5 tokens computes what it computes alone
  batch              each row in a batch of 3 computes what it computes alone
  save-load          saved (tapecli.store.checkpoint) and opened again through the door: the same parameter names
                     (also in a second build) and logits
  finite             training step in fp32 and under bf16 autocast: finite logits and gradients
  pe-gradients       every trainable parameter of the PE gets a non-zero gradient
  compile            (--compile) a torch.compile'd training step equals the eager one
  shift-invariance, rotation-equivariance   only when the PE declares them (`PositionalEncoding.claims`)

A check that raises fails with the error's first line: a kit that reports, not a traceback. A comparison with a NaN
or an infinity on either side fails (its difference counts as infinite).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from tapecli.model import KVCache, attention
from tapecli.model.generation import prefill
from tapecli.pe.check.score_mod import score_mod_verdict
from tapecli.pe.check.subject import VOCAB, Subject, max_abs, relative


@dataclass(frozen=True)
class Outcome:
    name: str
    ok: bool
    number: float | None  # the measured value the verdict rests on (None: a count or a yes/no)
    text: str  # what was measured, with the number
    info: dict[str, Any] = field(default_factory=dict)  # extras (the dense check: the attention paths taken)


def _exact(name: str, subject: Subject, worst: float, what: str) -> Outcome:
    return Outcome(name, worst <= subject.tolerance, worst,
                   f"{what}: max |diff| {worst:.1e} (tolerance {subject.tolerance:.0e})")


@torch.no_grad()
def causality(subject: Subject) -> Outcome:
    model, x = subject.model(), subject.tokens(2, 24, seed=2)
    base, worst = model(x), 0.0
    for t in (1, 9, 17):
        changed = x.clone()
        changed[:, t:] = (changed[:, t:] + 1 + torch.arange(24 - t, device=x.device)) % VOCAB
        worst = max(worst, max_abs(model(changed)[:, :t], base[:, :t]))
    return _exact("causality", subject, worst, "logits before changed tokens")


@torch.no_grad()
def kv_cache(subject: Subject) -> Outcome:
    model, worst, agree = subject.model(), 0.0, True
    for mask in (None, subject.left_padding(2, 12, 3)):
        prompt = subject.tokens(2, 12, seed=3)
        cache = KVCache(model.config.n_layers)
        step = model.lm_head(model.run(prompt, cache=cache, attention_mask=mask)[0][:, -1])
        tokens, seen = prompt, mask
        position = torch.full((2,), 12, device=prompt.device) if mask is None else mask.sum(-1)
        for _ in range(5):
            full = model(tokens, attention_mask=seen)[:, -1]
            worst = max(worst, max_abs(step, full))
            token = full.argmax(-1)
            agree &= bool((step.argmax(-1) == token).all())
            tokens = torch.cat((tokens, token[:, None]), dim=1)
            seen = None if seen is None else torch.cat((seen, torch.ones_like(seen[:, :1])), dim=1)
            step = model.lm_head(model.run(token[:, None], position, cache)[0][:, -1])
            position = position + 1
    outcome = _exact("kv-cache", subject, worst, "5 cached greedy steps vs the full forward")
    if agree:
        return outcome
    return Outcome("kv-cache", False, worst, outcome.text + "; the greedy tokens differ")


@torch.no_grad()
def chunked_prefill(subject: Subject) -> Outcome:
    model, worst = subject.model(), 0.0
    for mask in (None, subject.left_padding(2, 24, 5)):
        prompt = subject.tokens(2, 24, seed=4)
        full = model(prompt, attention_mask=mask)[:, -1]
        worst = max(worst, max_abs(prefill(model, prompt, mask, 0, KVCache(model.config.n_layers), 5), full))
    return _exact("chunked-prefill", subject, worst, "prefill in chunks of 5 vs the full forward")


def dense(subject: Subject) -> Outcome:
    cpu, dev = torch.device("cpu"), subject.device
    x, mask = subject.tokens(2, 24, seed=5).cpu(), subject.left_padding(2, 24, 7).cpu()
    real = mask.bool()
    weights = torch.randn(2, 24, VOCAB, generator=torch.Generator().manual_seed(6), dtype=torch.float64)

    paths: dict[str, list[str]] = {}

    def run(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
        """Logits of the padded batch without gradients, then logits and gradients of a training forward without
        and with padding (a loss over the real tokens). Records the attention paths each took."""
        got = {}
        with torch.no_grad(), attention.recording() as taken:
            got["outputs (padded)"] = model(x.to(device), attention_mask=mask.to(device)).cpu()[real]
        paths["eval"] = sorted(set(taken))
        for name, attention_mask in (("training", None), ("padded training", mask)):
            model.zero_grad(set_to_none=True)
            with attention.recording() as taken:
                logits = model(x.to(device), attention_mask=None if attention_mask is None
                               else attention_mask.to(device))
            paths["train" if attention_mask is None else "padded train"] = sorted(set(taken))
            (logits * (weights * real[..., None]).to(device, dtype)).sum().backward()
            got[f"outputs ({name})"] = logits.detach().cpu()[real]
            got.update({f"gradients ({name}) {n}": p.grad.cpu() for n, p in model.named_parameters()
                        if p.grad is not None})
        return got

    with attention.forced("dense"):
        want = run(subject.model(torch.float64, cpu), cpu, torch.float64)
    got = run(subject.model(torch.float32), dev, torch.float32)
    missing = sorted(set(want) - set(got))
    scale = max((t.abs().max().item() for k, t in want.items() if k.startswith("gradients")), default=0.0)
    errors = {key: relative(got[key], value, 1e-3 * scale if key.startswith("gradients") else 0.0)
              for key, value in want.items() if key in got}
    worst_what, worst = max(errors.items(), key=lambda item: item[1])
    tol = subject.fp32_tolerance
    taken = ", ".join(sorted({name for names in paths.values() for name in names}))
    text = (f"fp32 on {dev} ({taken}) vs every score materialised in fp64: max relative diff "
            f"{worst:.1e} in {worst_what} (tolerance {tol:.0e})")
    if missing:
        text += f"; no gradient for {missing[0].split(' ')[-1]} in {missing[0].split(')')[0]})"
    return Outcome("dense", worst <= tol and not missing, worst, text, {"paths": paths})


def score_mod(subject: Subject) -> Outcome:
    return Outcome("score-mod", *score_mod_verdict(subject))


@torch.no_grad()
def padding(subject: Subject) -> Outcome:
    model, x, worst = subject.model(), subject.tokens(2, 16, seed=6), 0.0
    filler = subject.tokens(1, 5, seed=7)
    ones, zeros = torch.ones_like(x[:1]), torch.zeros_like(filler)
    for row in range(2):
        alone = model(x[row:row + 1])
        left = model(torch.cat((filler, x[row:row + 1]), 1), attention_mask=torch.cat((zeros, ones), 1))[:, 5:]
        right = model(torch.cat((x[row:row + 1], filler), 1), attention_mask=torch.cat((ones, zeros), 1))[:, :16]
        worst = max(worst, max_abs(left, alone), max_abs(right, alone))
    return _exact("padding", subject, worst, "rows left- and right-padded vs alone")


@torch.no_grad()
def batch(subject: Subject) -> Outcome:
    model, x = subject.model(), subject.tokens(3, 16, seed=8)
    together = model(x)
    worst = max(max_abs(together[row:row + 1], model(x[row:row + 1])) for row in range(3))
    return _exact("batch", subject, worst, "rows in a batch of 3 vs alone")


def save_load(subject: Subject) -> Outcome:
    from tapecli.data.tokenizer import ByteTokenizer
    from tapecli.store.checkpoint import save_model
    from tapecli.store.door import open_model

    cpu = torch.device("cpu")
    model, again = subject.model(torch.float32, cpu), subject.model(torch.float32, cpu)
    names = list(model.state_dict())
    with tempfile.TemporaryDirectory() as directory:
        save_model(model, ByteTokenizer(), directory)
        torch.manual_seed(12345)  # the reopened model's own initialisation differs from the saved weights
        opened = open_model(directory, device="cpu", dtype="fp32").model
    if list(again.state_dict()) != names:
        return Outcome("save-load", False, None, "a second build names its parameters differently: "
                       f"{sorted(set(again.state_dict()) ^ set(names))[:2]}")
    if list(opened.state_dict()) != names:
        return Outcome("save-load", False, None, "the reopened model names its parameters differently")
    x = subject.tokens(2, 16, seed=9).cpu()
    with torch.no_grad():
        worst = max_abs(opened(x), model(x))
    return Outcome("save-load", worst <= 1e-6, worst, f"{len(names)} tensors saved and opened through the door: "
                   f"same names, logits max |diff| {worst:.1e} (tolerance 1e-06)")


def _training_step(model: torch.nn.Module, x: Tensor, autocast: bool, run: Callable | None = None) -> Tensor:
    torch.manual_seed(3)  # training-time randomness (RandPE's positions) is the same for every run
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = (model if run is None else run)(x[:, :-1])  # not `run or model`: bool() of it calls len()
    loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    return logits.detach()


def finite(subject: Subject) -> Outcome:
    counts = {}
    for precision in ("fp32", "bf16"):
        model = subject.model(torch.float32, train=True)
        logits = _training_step(model, subject.tokens(2, 25, seed=10), autocast=precision == "bf16")
        counts[precision] = int((~torch.isfinite(logits)).sum()) + sum(
            int((~torch.isfinite(p.grad)).sum()) for p in model.parameters() if p.grad is not None)
    return Outcome("finite", not any(counts.values()), float(sum(counts.values())),
                   "non-finite logits and gradients of a training step: "
                   + ", ".join(f"{k} {v}" for k, v in counts.items()))


def pe_gradients(subject: Subject) -> Outcome:
    model = subject.model(torch.float32, train=True)
    own = [(n, p) for n, p in model.named_parameters() if ".pe." in f".{n}" and p.requires_grad]
    if not own:
        return Outcome("pe-gradients", True, None, "the PE has no trainable parameters")
    _training_step(model, subject.tokens(2, 25, seed=11), autocast=False)
    missing = [n for n, p in own if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    text = f"{len(own) - len(missing)} of {len(own)} PE parameters get a non-zero gradient"
    return Outcome("pe-gradients", not missing, float(len(missing)),
                   text + (f"; none reaches {missing[0]}" if missing else ""))


def compiled(subject: Subject) -> Outcome:
    torch._dynamo.reset()
    eager, model = subject.model(torch.float32, train=True), subject.model(torch.float32, train=True)
    x = subject.tokens(2, 17, seed=12)
    want = _training_step(eager, x, autocast=False)
    try:
        got = _training_step(model, x, autocast=False, run=torch.compile(model, backend=subject.compile_backend))
    except Exception as e:  # noqa: BLE001 - what broke, in one line
        return Outcome("compile", False, None, f"torch.compile ({subject.compile_backend}) fails: "
                       f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}")
    grads = dict(eager.named_parameters())
    worst = max([relative(got, want)] + [relative(p.grad, grads[n].grad) for n, p in model.named_parameters()
                                          if p.grad is not None and grads[n].grad is not None])
    tol = subject.fp32_tolerance
    return Outcome("compile", worst <= tol, worst, f"compiled ({subject.compile_backend}) vs eager training step: "
                   f"max relative diff {worst:.1e} (tolerance {tol:.0e})")


@torch.no_grad()
def shift_invariance(subject: Subject) -> Outcome:
    model, x = subject.model(), subject.tokens(2, 16, seed=13)
    base = model(x)
    worst = max(max_abs(model(x, start_pos=shift), base) for shift in (7, 40))
    return _exact("shift-invariance", subject, worst, "claimed: logits at start_pos 7 and 40 vs 0")


def rotate_pairs(rotary: Tensor, angles: Tensor) -> Tensor:
    """One 2-D rotation per rotary pair i (angle angles[i]) of every token's and head's (c_i, s_i)."""
    half = rotary.shape[-1] // 2
    c, s = rotary[..., :half], rotary[..., half:]
    return torch.cat((c * angles.cos() - s * angles.sin(), s * angles.cos() + c * angles.sin()), dim=-1)


@torch.no_grad()
def rotation_equivariance(subject: Subject) -> Outcome:
    model, x = subject.model(), subject.tokens(2, 10, seed=14)
    positions = torch.arange(10, device=x.device)[None]
    state = model.model.pe.initial_state(positions, subject.exact_dtype)
    if state.rotary is None:
        return Outcome("rotation-equivariance", False, None, "claimed, but the PE's state has no rotary part")
    angles = torch.rand(state.rotary.shape[-1] // 2, generator=torch.Generator().manual_seed(15),
                        dtype=torch.float64).to(state.rotary) * 6.3
    hidden, out = model.run(x, state=state)
    hidden_rotated, out_rotated = model.run(x, state=state.replace(rotary=rotate_pairs(state.rotary, angles)))
    worst = max(max_abs(hidden_rotated, hidden), max_abs(out_rotated.rotary, rotate_pairs(out.rotary, angles)))
    return _exact("rotation-equivariance", subject, worst, "claimed: outputs and final state under rotated pairs")


CHECKS: dict[str, Callable[[Subject], Outcome]] = {
    "causality": causality, "kv-cache": kv_cache, "chunked-prefill": chunked_prefill, "dense": dense,
    "score-mod": score_mod, "padding": padding, "batch": batch, "save-load": save_load, "finite": finite,
    "pe-gradients": pe_gradients, "compile": compiled, "shift-invariance": shift_invariance,
    "rotation-equivariance": rotation_equivariance,
}
ON_REQUEST = ("compile",)  # only with --compile
CLAIMED = ("shift-invariance", "rotation-equivariance")  # only when the PE declares them


def run_check(name: str, subject: Subject) -> Outcome:
    """One check; an exception inside it (the PE's code raising) is that check failing, in one line."""
    try:
        return CHECKS[name](subject)
    except Exception as e:  # noqa: BLE001 - a conformance kit reports what broke
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        return Outcome(name, False, None, f"raised {type(e).__name__}: {first}")
