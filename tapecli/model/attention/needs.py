"""What a positional encoding needs from attention, declared by the PE in its own file (`LayerPE.need`).

Attention computes softmax_j(q_i . k_j / sqrt(d) + bias_ij) v_j over the visible keys (causal, not padding). A PE
changes that in one of three ways, and says which by returning one of these objects (None: plain q.k, e.g. RoPE,
whose work is all in `rotate`):

- `ScoreBias`: an additive logit bias per head and (query position, key position) pair (ALiBi, T5, FIRE). Given
  three ways, each exact wherever it is used: `pairs` for any positions (always), `table` when the bias depends on
  the distance only (ALiBi, T5: lets the CPU path pass the bias as a strided view of one small table, and T5's
  gradients come from a band of distances), `score_mod` (a `ScoreMod`) for FlexAttention (CUDA).
- `WideValue`: extra value columns averaged with the same attention weights (TAPE's state E: the values are
  [V | E]); attention returns [B, H, Tq, d + extra width] and the caller splits it.
- `OwnAttention`: the PE computes attention itself because its logits are not q.k plus a bias (CoPE, PaTH); it
  also names the path it takes (`plan`), so `tape doctor` and `tape bench` can print it, and may report its
  attention weights while they are probed (`reports_weights`: `tape analyze attention`); its PE declares which
  per-layer attention options it implements (`PositionalEncoding.attention_options`).

The ScoreMod contract (FlexAttention compiles one kernel that must serve every layer of a model):
`ScoreMod(fn, args, kernel_options=None)` where `fn(h, q_pos, k_pos, *args) -> bias` is a MODULE-LEVEL function
(the same object for every layer and every model, never a bound method or a closure: torch.compile guards on the
function's identity, so a per-layer function would recompile per layer and, past dynamo's recompile limit, fall
back to an unfused O(T^2) kernel), evaluated on 0-d tensors with pointwise torch ops only. `args` holds everything
`fn` reads that belongs to the layer: tensors (guarded by dtype, shape and device only, so every layer shares the
compiled kernel) and plain Python numbers (guarded by value: use them only for hyperparameters every layer shares,
e.g. T5's bucket counts). A tensor that requires gradients must be read once per call of `fn`, indexed (e.g.
`w[h]`): FlexAttention's compiled backward cannot lower several reads of one grad-requiring tensor, nor (torch 2.11
and 2.13) the gradient of a 0-d tensor read directly; give each use its own tensor (`.clone()`; a scalar as
`.repeat(H)`, read at the head), as FIRE does for c and L. The tensors are built when `need` is called, so
gradients flow from them back to the layer's parameters through ordinary autograd. A `fn` that is not a
module-level function, or a `score_mod` that is not a ScoreMod, is refused when made (a ContractError).
`kernel_options` (FlexAttention's own, e.g. {"BLOCK_M": 64, "num_stages": 1}) goes to every CUDA call with this
score_mod: smaller tiles for a fn whose kernels do not compile with FlexAttention's default ones (FIRE's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor


class ContractError(ValueError):
    """A PE's hook returned what its contract does not allow; `hook` is that function (its file names the PE)."""

    def __init__(self, message: str, hook: Callable) -> None:
        super().__init__(message)
        self.hook = hook


def _shape(value: object) -> str:
    return f"shape {list(value.shape)}" if isinstance(value, Tensor) else f"a {type(value).__name__}"


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def from_outside(fn: object) -> bool:
    """Whether `fn` is code from outside the package (a plugin's), whose results tape checks (`ScoreBias.checked`)."""
    return str(getattr(fn, "__module__", None) or "").split(".")[0] != "tapecli"


@dataclass(frozen=True)
class ScoreMod:
    """The FlexAttention form of a bias: fn(h, q_pos, k_pos, *args) on 0-d tensors (module docstring). A `fn` that
    is not a module-level function (a bound method, a lambda, a nested function) is refused when the ScoreMod is
    made, on every device: on CUDA it would compile one kernel per layer."""

    fn: Callable[..., Tensor]
    args: tuple = ()
    # FlexAttention's kernel_options on CUDA (tile sizes, pipeline stages), for a fn whose kernels do not compile
    # with FlexAttention's default tiles (FIRE's); None: the defaults.
    kernel_options: dict | None = None

    def __post_init__(self) -> None:
        if torch.compiler.is_compiling():  # dynamo cannot trace the check; eager forwards and `tape pe check` make it
            return
        name = getattr(self.fn, "__qualname__", None)
        if not callable(self.fn) or not isinstance(name, str) or "." in name or "<" in name:
            raise ContractError(f"ScoreMod(fn, args) takes a module-level function as fn, got {_name(self.fn)}: "
                                "FlexAttention compiles one kernel per function, so a bound method, a lambda or a "
                                "nested function would compile once per layer; define fn(h, q_pos, k_pos, *args) at "
                                "the top of the file and pass the layer's tensors in args (docs/pe-api.md)", self.fn)
        if self.kernel_options is not None and not isinstance(self.kernel_options, dict):
            raise ContractError(f"ScoreMod.kernel_options takes a dict of FlexAttention's kernel options (e.g. "
                                f'{{"BLOCK_M": 64}}) or None, got {_name(self.kernel_options)}', self.fn)


@dataclass(frozen=True)
class ScoreBias:
    """logit_ij += f_h(pos_i, pos_j).

    pairs(q_pos [B|1, Tq], k_pos [B|1, Tk]) -> [B|1, H, Tq, Tk]: the bias for any positions (float, not masked).
    table(n) -> [H, m], m <= n: f_h as a function of the distance pos_i - pos_j >= 0 only, for distances
        0..m-1, the last entry standing for every longer distance too (T5's clamp); None when f is not a function of
        the distance alone (FIRE). It may require gradients (T5's learned buckets).
    score_mod: a `ScoreMod` (module docstring) for FlexAttention; None: the PE has no FlexAttention form.
    parameters: the tensors `pairs` reads that may need gradients and that `table` does not carry (FIRE's MLP).
    """

    pairs: Callable[[Tensor, Tensor], Tensor]
    table: Callable[[int], Tensor] | None = None
    score_mod: ScoreMod | None = None
    parameters: tuple[Tensor, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if torch.compiler.is_compiling():  # dynamo cannot trace the check; eager forwards and `tape pe check` make it
            return
        if self.score_mod is not None and not isinstance(self.score_mod, ScoreMod):
            hook = self.score_mod if callable(self.score_mod) else self.pairs
            raise ContractError(f"ScoreBias.score_mod takes a ScoreMod(fn, args) (tapecli.pe.ScoreMod), got "
                                f"{_name(self.score_mod)}: wrap a module-level function of (h, q_pos, k_pos, *args) "
                                "and the tensors it reads (docs/pe-api.md)", hook)

    def checked(self, heads: int) -> ScoreBias:
        """The same bias, every `pairs` and `table` result checked against the contract's shape for `heads` query
        heads (a ContractError naming the hook otherwise): attention wraps a plugin's bias in it, so that a wrong
        shape is reported as the plugin's, not as an IndexError deep inside attention."""
        pairs, table = self.pairs, self.table

        def checked_pairs(q_pos: Tensor, k_pos: Tensor) -> Tensor:
            bias = pairs(q_pos, k_pos)
            batch, want = max(q_pos.shape[0], k_pos.shape[0]), (q_pos.shape[-1], k_pos.shape[-1])
            if not (isinstance(bias, Tensor) and bias.ndim == 4 and bias.shape[0] in (1, batch)
                    and bias.shape[1] == heads and tuple(bias.shape[2:]) == want):
                raise ContractError(f"{_name(pairs)} (ScoreBias.pairs) returned {_shape(bias)}; the contract is "
                                    f"[B|1, H, Tq, Tk] = [{batch}|1, {heads}, {want[0]}, {want[1]}]", pairs)
            return bias

        def checked_table(n: int) -> Tensor:
            values = table(n)
            if not (isinstance(values, Tensor) and values.ndim == 2 and values.shape[0] == heads
                    and 1 <= values.shape[1] <= n):
                raise ContractError(f"{_name(table)} (ScoreBias.table) returned {_shape(values)} for n = {n}; the "
                                    f"contract is [H, m] = [{heads}, m] with 1 <= m <= {n}", table)
            return values

        return ScoreBias(pairs=checked_pairs, table=None if table is None else checked_table,
                         score_mod=self.score_mod, parameters=self.parameters)

    def times(self, factor: float) -> ScoreBias:
        """The same bias multiplied by `factor` (an attention temperature's 1 / T) in `pairs` and `table`; the
        FlexAttention path takes the factor as its own argument (one compiled kernel for every temperature)."""
        if factor == 1.0:
            return self
        pairs, table = self.pairs, self.table
        return ScoreBias(pairs=lambda q_pos, k_pos: pairs(q_pos, k_pos) * factor,
                         table=None if table is None else (lambda n: table(n) * factor),
                         score_mod=self.score_mod, parameters=self.parameters)


@dataclass(frozen=True)
class WideValue:
    """values [B|1, H, Tq, e] of the current tokens, appended to each value head and averaged with the same weights.

    mode: concat (one attention over [V | E]) | separate (a second attention with E as the values): both exact; the
    dispatcher honours it where both paths exist."""

    values: Tensor
    mode: str = "concat"


@dataclass(frozen=True)
class OwnAttention:
    """attend(x, q, k, v, mask, is_causal, key_mask, cache, **options) -> [B, H, Tq, d], the `LayerPE.attend`
    contract; `mask` already holds the causal, padding and window rules (None: plain causal). `options` are the
    per-layer attention options the layer sets and its PE declares in `PositionalEncoding.attention_options`:
    temperature=T (softmax(logits / T)) and window=W (the keys outside the window are hidden by `mask`; the PE
    may use W to skip them). The model refuses, when it is built, an option a layer sets that its PE does not
    declare, so `attend` never receives one it does not know.

    plan(device_type, dtype, q_len, k_len, grad, cached) -> str: the path `attend` will take (a short name).
    reports_weights: the optional probing hook (`tapecli.model.attention.probe`). True promises that while
        `probe.active()`, `attend` takes a path that forms its softmax weights one chunk of queries at a time (never
        [Tq, Tk] per head at once, not a fused kernel) and calls `probe.report(weights, first, **extras)` for every
        chunk: `weights` [B, H, C, K] exactly the weights it multiplies the values with, keys in order (columns
        0..K-1; a key the query cannot see holds 0), `first` the key index of the chunk's first query, `extras` any
        PE-specific [B, H, C, K] quantity of the same pairs (CoPE: "positions"). False (the default): probing the
        PE is an error."""

    attend: Callable[..., Tensor]
    plan: Callable[..., str]
    reports_weights: bool = False


Need = ScoreBias | WideValue | OwnAttention | None
