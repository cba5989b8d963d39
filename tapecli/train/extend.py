"""`tape extend-context`: the plan of a context extension (method.md 1.10, 3, 4.4), decided from the recipe's `extend`
section and the base's configuration. The engine trains it like any run (`tapecli.train.build` builds the model).

Two independent choices:
- `extend.method`, what is trained (besides `extend.trainable`, by default embeddings and norms):
    tape      TAPE on top of the base's RoPE; its modules start at zero, so step 0 equals the base (same scaling)
    lora      LoRA on `extend.lora_targets` (r=8, alpha=16, dropout 0 on q, k, v, o): LongLoRA's "LoRA+"
    longlora  lora plus shifted sparse attention while training (groups of `group_fraction` of the length)
    full      every weight
    drope     DroPE (arXiv 2512.12167): every layer's positional embedding removed (`tapecli.model.extend.drope`),
              every weight recalibrated at the base's length (rows of at most L tokens; scaling none)
- `extend.scaling`, how positions reach the target context N = model.max_seq_len from the base's L
  (`max_position_embeddings`): pi (linear interpolation by N/L), yarn, dynamic (NTK), theta (RoPE base
  `extend.theta`, 1e6), longrope (LongRoPE: per-frequency short and long factors, switched at the base's length;
  the factors are `model.pe_args.short_factor` / `long_factor` where the recipe gives them, else the base's own when
  its config.json has LongRoPE, which then keeps its original length too; the attention factor, unless given,
  follows N over the original length, as transformers computes it), none (refused for
  longlora, which is defined with interpolation: LongLoRA's fine-tune.py). pi, yarn or dynamic on a LongRoPE base
  replaces it (its factors and attention factor dropped).
`extend.compat: official` reproduces the official scripts: interpolation by N/L under every method (theta
included) and TAPE's post-attention map left frozen at zero.

A recipe that sets the layer keys (`model.schedule`, `model.window`) converts the base's layers the same way: a
RoPE model trained on as a RoPE/NoPE hybrid or with sliding-window local layers (SWAN-GPT, arXiv 2504.08719; DroPE,
arXiv 2512.12167), with the same methods, checkpoints and resume. Such a conversion may stay at the base's length
(`model.max_seq_len` equal to it, with `--scaling none`). What step 0 computes: with TAPE grown in the layers that
keep the model's PE, exactly the converted layout (TAPE's updates start at zero); a windowed layer, exactly the base
on the first `window` tokens of every sequence; a layer whose RoPE is removed, the base without that rotation (no
parameter can make that exact; `tape eval perplexity` of the run and the base measures the gap and the recovery).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError

if TYPE_CHECKING:

    from tapecli.model import ModelConfig
    from tapecli.model.extend.lora import LoraSpec
    from tapecli.recipe import Recipe

METHOD_PARAMETERS = {"tape": ["*.pe.*"], "lora": ["*.lora_A", "*.lora_B"], "longlora": ["*.lora_A", "*.lora_B"],
                     "full": ["*"], "drope": ["*"]}


@dataclass
class Plan:
    config: ModelConfig  # the extended model (pe, pe_args, max_seq_len)
    grown: bool  # the PE grew from rope to tape
    lora: LoraSpec | None
    unfreeze: list[str]  # fnmatch patterns of trained parameters (everything else frozen)
    freeze_after: list[str]  # patterns frozen again (official protocol: TAPE's post-attention map)
    s2_fraction: float | None  # longlora: S²-Attn group fraction while training
    summary: str  # one line: base length -> target, method, scaling, protocol


def scaling_args(scaling: str, compat: str, theta: float, factor: float, base_len: int) -> dict[str, Any]:
    """RoPE pe_args for a scaling choice (tapecli.model.pe.rope)."""
    if compat == "official" and scaling in ("yarn", "dynamic", "longrope"):
        raise TapeError(f"extend.scaling: {scaling} does not exist in the official protocol (it interpolates "
                        "linearly); use extend.compat=paper")
    stretch = {"original_max_len": base_len, "factor": factor}
    args: dict[str, Any] = {}
    if scaling == "theta":
        args["theta"] = theta
    if scaling in ("pi", "yarn", "dynamic", "longrope"):
        args.update(scaling={"pi": "linear"}.get(scaling, scaling), **stretch)
    elif compat == "official":  # the official scripts interpolate whenever N > L, theta included
        args.update(scaling="linear", **stretch)
    return args


LONGROPE_KEYS = ("short_factor", "long_factor", "attention_factor")


def longrope_args(scaling: str, base_args: dict[str, Any], requested: dict[str, Any], args: dict[str, Any],
                  origin: str) -> dict[str, Any]:
    """`args` (scaling_args') fitted to LongRoPE: on a LongRoPE base, --scaling longrope keeps the base's original
    length and factors (where the recipe gives none) and another scaling drops its factors and attention factor;
    on any other base, --scaling longrope needs the factors in the recipe (one line naming the keys otherwise)."""
    base_longrope = base_args.get("scaling") == "longrope"
    if scaling != "longrope":  # a scaling that replaces the base's LongRoPE drops its factors
        return {**args, **dict.fromkeys(LONGROPE_KEYS)} if base_longrope and "scaling" in args else args
    args = {key: value for key, value in args.items() if key != "factor"}  # its attention factor follows N / L
    if base_longrope:
        return {**args, "original_max_len": base_args.get("original_max_len", args["original_max_len"])}
    lacking = [key for key in ("short_factor", "long_factor") if key not in requested]
    if lacking:
        raise TapeError(f"model.pe_args.{lacking[0]}: --scaling longrope needs the short and long rescale factors "
                        f"(one per rotary frequency) and {origin} has none (its RoPE is not LongRoPE); pass "
                        "model.pe_args.short_factor=[...] model.pe_args.long_factor=[...]")
    return args


def check_drope(recipe: Recipe, base: dict[str, Any], origin: str) -> None:
    """What DroPE refuses, each in one line: position scalings (there is no RoPE left to scale), a schedule of the
    user's (DroPE sets every layer's), the TAPE paper's official protocol, a base without positional embedding, and
    recalibration rows longer than the base's length (the paper recalibrates at the original length)."""
    from tapecli.model.extend.drope import has_positional_embedding

    x, base_len = recipe.extend, base["max_seq_len"]
    if x.scaling != "none":
        raise TapeError(f"extend.scaling: {x.scaling} scales RoPE, which --method drope removes from every layer; "
                        "pass --scaling none (or leave --scaling out)")
    if x.compat != "paper":
        raise TapeError("extend.compat: official is the TAPE paper's scripts' protocol; --method drope follows "
                        "the DroPE paper and its official code: leave --compat out")
    if "model.schedule" in recipe.set_keys:
        raise TapeError("model.schedule: --method drope sets every layer's schedule (the base's windows, PE "
                        "removed); remove the key")
    if not has_positional_embedding(base):
        raise TapeError(f"extend.method: {origin} has no positional embedding in any layer; there is nothing for "
                        "drope to remove")
    from tapecli.model import ModelConfig
    from tapecli.model.merge import parameter_shapes

    own = sorted(name for name in parameter_shapes(ModelConfig.from_dict(base)) if ".pe." in f".{name}")
    if own:
        raise TapeError(f"extend.method: drope would drop the weights of {origin}'s positional encoding "
                        f"{base.get('pe')!r} ({own[0]}, ...); it removes PEs without weights of their own (rope, "
                        "alibi, ...)")
    if recipe.data.seq_len > base_len:
        raise TapeError(f"data.seq_len: {recipe.data.seq_len} exceeds the base's length {base_len} ({origin}); "
                        f"DroPE recalibrates at the original length: set data.seq_len "
                        f"<= {base_len}")


def plan_extension(recipe: Recipe, base: dict[str, Any], origin: str) -> Plan:
    """The extended model's config and what to train, from the recipe and the base's `ModelConfig.to_dict()`."""
    from tapecli.model.extend.lora import LoraSpec
    from tapecli.model.merge import merge_model_config

    x = recipe.extend
    if "model.max_seq_len" not in recipe.set_keys:
        raise TapeError("model.max_seq_len: set the target context length (e.g. model.max_seq_len=8192)")
    for key in ("train.freeze", "train.unfreeze"):
        if key in recipe.set_keys:
            raise TapeError(f"{key}: extend-context trains what --method says plus extend.trainable; "
                            "remove the key and use extend.trainable")
    base_len, target = base["max_seq_len"], recipe.model.max_seq_len
    if x.method == "drope":
        check_drope(recipe, base, origin)
    converts = bool({"model.schedule", "model.window"} & recipe.set_keys) or x.method == "drope"
    if target < base_len or (target == base_len and not converts):
        raise TapeError(f"model.max_seq_len: the target context {target} must exceed the base's {base_len} "
                        f"({origin} max_position_embeddings), or equal it in a conversion of the layers "
                        "(model.schedule, model.window)")
    if target == base_len and x.scaling != "none":
        raise TapeError(f"extend.scaling: {x.scaling} stretches positions from {base_len} to {target} tokens, which "
                        "is no stretch; a conversion at the base's length takes --scaling none")
    if x.method == "longlora" and x.scaling == "none" and x.compat != "official":
        raise TapeError("extend.scaling: none with method longlora is not LongLoRA, which is defined with position "
                        "interpolation (its fine-tune.py scales RoPE linearly by ceil(N/L) whenever N > L; S²-Attn "
                        "only makes training at length N cheaper); pass --scaling pi (or yarn, dynamic, theta), or "
                        "--method lora --scaling none for LoRA without interpolation")
    own = sorted(name for name, kind in (base.get("schedule") or {}).get("kinds", {}).items() if "pe_args" in kind)
    if own and "model.schedule" not in recipe.set_keys:
        raise TapeError(f"model.schedule: {origin} gives its {', '.join(own)} layers a RoPE of their own (as Gemma "
                        "3's global layers), which --scaling leaves as it is; restate the schedule with those "
                        "kinds' pe_args scaled (model.schedule=...)")
    factor = target / base_len
    requested = recipe.set_values("model")
    own_args = requested.get("pe_args", {})
    args = longrope_args(x.scaling, base.get("pe_args") or {}, own_args,
                         scaling_args(x.scaling, x.compat, x.theta, factor, base_len), origin)
    requested["pe_args"] = {**own_args, **args}
    if x.method == "tape":
        requested["pe"] = "tape"
    if x.method == "drope":
        from tapecli.model.extend.drope import drope_schedule

        requested["schedule"] = drope_schedule(base)
    config, grown = merge_model_config(base, requested, origin)
    if x.method == "tape" and not grown and base.get("pe") != "tape":
        raise TapeError(f"extend.method: tape needs a RoPE base, {origin} has pe {base.get('pe')!r}")
    group = int(recipe.data.seq_len * x.group_fraction)
    if x.method == "longlora" and (group < 2 or group % 2 or recipe.data.seq_len % group):
        raise TapeError(f"extend.group_fraction: {x.group_fraction} of data.seq_len {recipe.data.seq_len} gives "
                        f"groups of {group} tokens; S²-Attn needs an even group size that divides the rows")
    lora = None
    if x.method in ("lora", "longlora"):
        lora = LoraSpec(rank=x.lora_rank, alpha=x.lora_alpha, dropout=x.lora_dropout, targets=list(x.lora_targets))
    freeze_after = ["*.post_attn_proj.*"] if x.method == "tape" and x.compat == "official" else []
    scaled = config.pe_args.get("scaling", "none")
    stretch = "no interpolation" if scaled == "none" else f"{scaled} x{config.pe_args['factor']:g}" if (
        scaled != "longrope") else f"longrope from {config.pe_args.get('original_max_len', base_len)}"
    how = f"{x.scaling} ({stretch}, RoPE theta {config.pe_args.get('theta', 10000.0):g})"
    summary = (f"extend-context: {origin} from {base_len} to {target} tokens; method {x.method}, scaling {how}; "
               f"protocol {x.compat}" + (" (PI under every method, TAPE's post-attention map frozen)"
                                         if x.compat == "official" else ""))
    if x.method == "drope":
        summary = (f"extend-context: {origin} to {target} tokens; method drope (every layer's positional embedding "
                   f"removed, recalibration at the base's {base_len} tokens on rows of {recipe.data.seq_len})")
    if converts:
        from tapecli.model import ModelConfig
        from tapecli.model.schedule import describe

        summary += f"; layers {describe(ModelConfig.from_dict(base).layers())} -> {describe(config.layers())}"
    return Plan(config=config, grown=grown, lora=lora, unfreeze=METHOD_PARAMETERS[x.method] + list(x.trainable),
                freeze_after=freeze_after, s2_fraction=x.group_fraction if x.method == "longlora" else None,
                summary=summary)
