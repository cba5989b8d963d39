"""Recipes: the typed configuration of a `tape` run, loaded from YAML and `key=value` overrides.

A recipe has up to five sections, each a dataclass:
    model    ModelSection: the architecture; checked by `tapecli.model.ModelConfig` itself
    data     chosen by `data.kind`: the schema that kind owns in its module under tapecli/data/ (keys, checks, how its
             datasets are built; `tapecli.data.build.KINDS` is the table of kinds)
    train    TrainSection: optimisation, checkpointing, logging
    eval     the kind's evaluation keys (`DataSchema.Eval`); absent for kinds that have none (text, pairs, scrolls)
    extend   ExtendSection: only in context-extension recipes and what `tape extend-context` sets; else None
A recipe holds only what its kind uses: any other key is a one-line error ("data.blanks is not a key of kind text").
Every key has a default, so a file needs only the keys it changes; the shipped recipes spell out every key their
kind has, with comments, so that they double as documentation. Values are type-checked against the annotations
(`tapecli.recipe.values`), each section checks itself, `Recipe.validate` adds what spans sections; every user mistake
raises TapeError with a one-line message naming the key. `Recipe.set_keys` records which keys the file or an
override wrote (defaults never count as set); `Recipe.notes` holds one-line notes for the command to print, among
them one per key set that the other options make meaningless (`Recipe.unused_keys`: `train.min_lr` under a constant
schedule, `data.tokenizer` when the run starts from a model, a kind's own cases), so a recipe records only what
its run uses.
Recipes written by tape 0.1 (every key of every kind spelled) are read through `tapecli.recipe.legacy`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import yaml

from tapecli import yamlsafe
from tapecli.errors import TapeError
from tapecli.recipe.files import list_recipes, locate, recipe_text
from tapecli.recipe.legacy import upgrade
from tapecli.recipe.values import Layout, apply_override, check_tree, fail, field_types, parse_value, split_override

if TYPE_CHECKING:
    from tapecli.data.schema import DataSchema

__all__ = ["Recipe", "list_recipes", "load_recipe", "recipe_text"]

MAX_STEPS = 99_999_999  # checkpoint directories are step-XXXXXXXX (tapecli.store.checkpoint)
Schedule = Literal["linear", "cosine", "constant"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
LoggerName = Literal["jsonl", "tensorboard", "wandb"]


@dataclass
class ModelSection:
    """Architecture of the Llama-style transformer; mirrors `tapecli.model.ModelConfig`."""

    pe: str = "tape"  # positional encoding: a built-in (nope, rope, ..., pope, mapwm: tape pe list) or a plugin
    pe_args: dict[str, Any] = field(default_factory=dict)  # the PE's own options; {} = its defaults
    n_layers: int = 12  # transformer blocks
    dim: int = 768  # hidden size
    n_heads: int = 12  # attention heads (head size dim / n_heads)
    n_kv_heads: int | None = None  # None = n_heads (multi-head attention)
    ffn_dim: int | None = None  # None = the model's default SwiGLU width
    vocab_size: int | None = None  # None = take it from the tokenizer
    max_seq_len: int = 1024  # the training context (RoPE scalings take it as the original length)
    tie_embeddings: bool = False  # share the input embedding with the output layer
    norm_eps: float = 1e-5  # RMSNorm epsilon
    init_std: float = 0.02  # standard deviation of the initial weights
    dropout: float = 0.0  # training only: dropout on the embeddings and each residual branch; off at evaluation
    abacus: bool = False  # Abacus digit-position embeddings (arithmetic only)
    window: int | None = None  # sliding-window attention: keys each query sees, itself included; None = every one
    temperature: float = 1.0  # attention temperature: softmax(logits / temperature)
    length_scale: str = "none"  # none | llama4 | log: queries scaled by a function of their position
    length_scale_args: dict[str, Any] = field(default_factory=dict)  # the length scale's options; {} = defaults
    schedule: dict[str, Any] = field(default_factory=dict)  # per-layer pe, window, temperature, length scale
    qk_norm: bool = False  # RMS-normalise each head's query and key before the PE (Qwen3's q_norm / k_norm)
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2)
    output_gate: str = "none"  # none | elementwise | headwise: a sigmoid gate on each head's attention output
    sinks: bool = False  # a learned sink logit per head in each softmax's denominator (GPT-OSS's attention sinks)
    block: dict[str, Any] = field(default_factory=dict)  # the block's layout: norms, norm, qk_norm, ...; {} = Llama's

    def check(self, pe_args: bool = True) -> None:
        """`ModelConfig` checks the section (shapes, pe and, with `pe_args`, the PE's arguments). What comes from
        the tokenizer stands in: a null vocab_size, Abacus's digit ids."""
        from tapecli.model import ModelConfig

        kwargs = {**dataclasses.asdict(self), "pe_args": self.pe_args if pe_args else {}}
        if self.vocab_size is None:
            kwargs["vocab_size"] = 256
        if self.abacus:
            kwargs["abacus_digit_ids"] = list(range(10))
        try:
            ModelConfig(**kwargs)
        except ValueError as err:
            raise TapeError(str(err)) from None


@dataclass
class TrainSection:
    """Optimisation, checkpointing and logging."""

    batch_size: int = 512  # global sequences per optimizer step
    micro_batch_size: int = 8  # sequences per forward/backward; batch_size / micro = accumulation steps
    max_steps: int | None = 10_000  # optimizer steps; null: from train.epochs
    epochs: int | None = None  # passes over the data.train_size sequences instead; sets max_steps (see `Recipe`)
    lr: float = 1e-4  # peak AdamW learning rate (0: the weights do not move)
    min_lr: float = 0.0  # learning rate at the end of the decay
    weight_decay: float = 0.01  # AdamW weight decay (matrices only)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    warmup: int | float = 0.02  # < 1: fraction of max_steps; >= 1: number of steps (always fewer than max_steps)
    schedule: Schedule = "linear"  # after warm-up: linear or cosine decay to min_lr, or constant
    grad_clip: float = 1.0  # max global gradient norm; 0 = off
    precision: Precision = "auto"  # auto: bf16 autocast on GPUs that support it, fp32 on CPU
    seed: int = 0  # seeds torch/numpy/python and the data order
    save_every: int = 1000  # steps between checkpoints
    keep_last: int = 2  # checkpoints kept on disk; 0 = keep all
    eval_every: int = 500  # steps between validation-loss evaluations; 0 = never
    eval_batches: int = 50  # micro-batches per validation
    log_every: int = 10  # steps between log lines
    activation_checkpointing: bool = False  # recompute activations in the backward pass (less memory)
    compile: bool = False  # torch.compile the model
    freeze: list[str] = field(default_factory=list)  # glob patterns of parameter names to freeze
    unfreeze: list[str] = field(default_factory=list)  # patterns unfrozen again after `freeze`
    init_from: str | None = None  # checkpoint (run or checkpoint dir), or a Hugging Face model, to start from
    parallel: Literal["ddp", "fsdp"] = "ddp"  # under torchrun: replicate (ddp) or shard (fsdp, FSDP2) the model
    # jsonl (RUN/metrics.jsonl), tensorboard (RUN/tensorboard/), wandb (offline: WANDB_MODE=offline)
    loggers: list[LoggerName] = field(default_factory=lambda: ["jsonl"])  # where metrics go

    @property
    def warmup_steps(self) -> int:
        """Warm-up length in optimizer steps: a fraction of max_steps rounded, a count as given; at most
        max_steps - 1, so the schedule always reaches its peak (`Recipe` refuses a count that does not fit when
        the command line set it)."""
        steps = round(self.warmup * self.max_steps) if self.warmup < 1 else int(self.warmup)
        return max(0, min(steps, self.max_steps - 1))

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches accumulated per optimizer step."""
        return self.batch_size // self.micro_batch_size

    def check(self) -> None:
        for key in ("batch_size", "micro_batch_size", "max_steps", "epochs", "save_every", "eval_batches",
                    "log_every"):
            if getattr(self, key) is not None and getattr(self, key) <= 0:
                fail(f"train.{key}", f"must be a positive integer, got {getattr(self, key)}")
        if self.max_steps is not None and self.max_steps > MAX_STEPS:
            fail("train.max_steps", f"{self.max_steps:,} is more than {MAX_STEPS:,} (checkpoints are named by 8 "
                 "digits, step-XXXXXXXX)")
        # lr 0 is allowed: a run that must not move the weights (e.g. checking that an export reproduces its base)
        for key in ("lr", "min_lr", "weight_decay", "grad_clip", "keep_last", "eval_every", "seed"):
            if getattr(self, key) < 0:
                fail(f"train.{key}", f"must be >= 0, got {getattr(self, key)}")
        if self.batch_size % self.micro_batch_size:
            fail("train.batch_size", f"{self.batch_size} is not divisible by train.micro_batch_size "
                 f"({self.micro_batch_size})")
        if self.min_lr > self.lr:
            fail("train.min_lr", f"{self.min_lr} exceeds train.lr ({self.lr})")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            fail("train.betas", f"expected a list of 2 floats in [0, 1), got {self.betas}")
        if self.warmup < 0 or (self.warmup >= 1 and self.warmup != int(self.warmup)):
            fail("train.warmup", f"expected a fraction in [0, 1) or a whole number of steps, got {self.warmup}")
        if len(set(self.loggers)) != len(self.loggers):
            fail("train.loggers", f"lists a logger twice: {self.loggers}")


@dataclass
class ExtendSection:
    """`tape extend-context`: what is trained on a Hugging Face base and how positions reach the longer context.
    A recipe has this section only when it extends a context (`Recipe.extend` is None otherwise)."""

    method: Literal["tape", "lora", "longlora", "full", "drope"] = "tape"  # what is trained (--method)
    scaling: Literal["pi", "yarn", "dynamic", "theta", "longrope", "none"] = "pi"  # how positions reach N (--scaling)
    compat: Literal["paper", "official"] = "paper"  # official: PI under every method, TAPE's P frozen (--compat)
    theta: float = 1e6  # RoPE base of `scaling: theta`
    lora_rank: int = 8  # lora, longlora: rank r of the adapters
    lora_alpha: float = 16.0  # lora, longlora: scale alpha (the update is alpha / r x B A)
    lora_dropout: float = 0.0  # lora, longlora: dropout on the adapters' input
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])  # adapted layers
    trainable: list[str] = field(default_factory=lambda: ["*embed_tokens*", "*norm*"])  # besides the method's own
    group_fraction: float = 0.25  # longlora: S²-Attn groups of this fraction of the training length

    def check(self) -> None:
        for key in ("lora_rank", "lora_alpha", "theta"):
            if not getattr(self, key) > 0:
                fail(f"extend.{key}", f"must be > 0, got {getattr(self, key)}")
        if not 0 <= self.lora_dropout < 1:
            fail("extend.lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        if not 0 < self.group_fraction <= 1:
            fail("extend.group_fraction", f"must be in (0, 1], got {self.group_fraction}")


def _default_data() -> DataSchema:
    from tapecli.data.text import TextData

    return TextData()


@dataclass
class Recipe:
    """A complete, validated run configuration."""

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSchema = field(default_factory=_default_data)  # the schema of data.kind (tapecli.data.build.KINDS)
    train: TrainSection = field(default_factory=TrainSection)
    eval: Any | None = None  # the kind's `Eval` schema; None for kinds without evaluation keys
    extend: ExtendSection | None = None  # only for context extensions
    # The dotted keys ("model.pe", "train.lr", ...) the recipe file or an override wrote; every other key holds its
    # default. Only set keys may override what a checkpoint or a base model already says (tapecli.model.merge).
    set_keys: ClassVar[frozenset[str]] = frozenset()
    # One-line notes about how the recipe was read (an old format, a shortened warm-up), for the command to print.
    notes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, data: Any, origin: str = "recipe") -> Recipe:
        """Build and validate a recipe from nested dicts (e.g. a run's recipe.yaml); `origin` names the source
        in error messages."""
        return _build(data, origin, [])

    def sections(self) -> dict[str, Any]:
        """{name: section} of the sections this recipe has, in file order."""
        present = {"model": self.model, "data": self.data, "train": self.train, "eval": self.eval,
                   "extend": self.extend}
        return {name: body for name, body in present.items() if body is not None}

    @property
    def extends(self) -> bool:
        """True when the run extends a context: the recipe has an `extend` section and `extend.method` was set (by
        `tape extend-context --method`, an override or the file). A context-extension recipe whose method is left
        unset (the shipped ones) used by `tape finetune` or `tape pretrain` trains the model as it is."""
        return self.extend is not None and "extend.method" in self.set_keys

    def set_values(self, section: str) -> dict[str, Any]:
        """{key: value} of the keys of `section` that the user set ({} for a section the recipe does not have)."""
        body = getattr(self, section)
        if body is None:
            return {}
        return {f.name: getattr(body, f.name) for f in dataclasses.fields(body)
                if f"{section}.{f.name}" in self.set_keys}

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain nested dicts (YAML/JSON-able): the sections it has, every key of each."""
        return {name: dataclasses.asdict(body) for name, body in self.sections().items()}

    def to_yaml(self) -> str:
        """The resolved recipe as YAML text that `load_recipe` reads back to an equal recipe."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def ignored_keys(self) -> dict[str, str]:
        """{dotted key: why} of the keys that this recipe's other options make meaningless, set or not."""
        found = {}
        if self.train.schedule == "constant":
            found["train.min_lr"] = "unused by train.schedule: constant (it is where a decay ends)"
        if self.train.init_from is not None and "tokenizer" in {f.name for f in dataclasses.fields(self.data)}:
            found["data.tokenizer"] = "unused with train.init_from, whose model keeps its own tokenizer"
        return {**found, **self.data.ignored_keys()}

    def unused_keys(self) -> list[str]:
        """One line per key the recipe sets that its other options make meaningless (the command prints them as
        notes; a recipe records only what its run uses)."""
        return [f"{key}: {why}; leave it out" for key, why in self.ignored_keys().items() if key in self.set_keys]

    def model_config_kwargs(self, tokenizer_vocab_size: int | None = None) -> dict[str, Any]:
        """Keyword arguments for `tapecli.model.ModelConfig`, with `vocab_size` filled in from the tokenizer.

        A recipe may leave `model.vocab_size` null (use the tokenizer's size) or set it larger (padding
        for efficiency); smaller than the tokenizer's vocabulary is an error.
        """
        kwargs = dataclasses.asdict(self.model)
        if tokenizer_vocab_size is not None:
            if kwargs["vocab_size"] is None:
                kwargs["vocab_size"] = tokenizer_vocab_size
            elif kwargs["vocab_size"] < tokenizer_vocab_size:
                raise TapeError(
                    f"model.vocab_size: {kwargs['vocab_size']} is smaller than the tokenizer's vocabulary "
                    f"({tokenizer_vocab_size}); set it to null to use the tokenizer's size"
                )
        if kwargs["vocab_size"] is None:
            raise TapeError("model.vocab_size: null needs a tokenizer to take the vocabulary size from")
        return kwargs

    def validate(self) -> None:
        """Each section checks itself, then what spans sections; raises TapeError naming the first offending key.
        PE arguments set without `model.pe` belong to the PE of the checkpoint or base the run starts from, which
        checks them when the model is built."""
        self.model.check(pe_args="model.pe" in self.set_keys or "model.pe_args" not in self.set_keys)
        self.data.check()
        if self.eval is not None:
            self.eval.check()
        self.train.check()
        if self.extend is not None:
            self.extend.check()
        if self.data.seq_len > self.model.max_seq_len:
            fail("data.seq_len", f"{self.data.seq_len} exceeds model.max_seq_len ({self.model.max_seq_len})")


def _layout(kind: str) -> Layout:
    """The sections and keys a recipe of data kind `kind` may hold."""
    from tapecli.data.build import KINDS

    schema = KINDS[kind]
    kind_keys = {f"{section}.{key}" for other in KINDS.values()
                 for section, cls in (("data", other), ("eval", other.Eval)) if cls is not None
                 for key in field_types(cls)}
    return Layout(kind, {"model": ModelSection, "data": schema, "train": TrainSection, "eval": schema.Eval,
                         "extend": ExtendSection}, frozenset(kind_keys))


def _kind(data: Any, origin: str, overrides: list[str]) -> tuple[str, bool]:
    """(the data kind, whether the file or an override wrote it): the last `data.kind=` override, else the file's
    `data.kind`, else text."""
    from tapecli.data.build import KINDS

    kind, where, written = "text", "", False
    body = data.get("data") if isinstance(data, dict) else None
    if isinstance(body, dict) and "kind" in body:
        kind, where, written = body["kind"], f"{origin}: ", True
    for override in overrides:
        parts, raw = split_override(override)
        if parts == ["data", "kind"]:
            kind, where, written = parse_value(raw, "data.kind"), "", True
    if not isinstance(kind, str) or kind not in KINDS:
        raise TapeError(f"{where}data.kind: expected one of {', '.join(KINDS)}; got {kind!r}")
    return kind, written


def _build(data: Any, origin: str, overrides: list[str], resolved: bool = False) -> Recipe:
    data, legacy_note = upgrade(data)
    kind, kind_written = _kind(data, origin, overrides)
    if isinstance(data, dict) and isinstance(data.get("data"), dict):
        data = {**data, "data": {k: v for k, v in data["data"].items() if k != "kind"}}  # `_kind` read it
    layout = _layout(kind)
    tree = check_tree(data, origin, layout)
    on_command_line = set()
    for override in overrides:
        parts, _ = split_override(override)
        if parts != ["data", "kind"]:
            apply_override(tree, override, layout)
            on_command_line.add(".".join(parts[:2]))
    data_schema, eval_schema = layout.sections["data"], layout.sections["eval"]
    recipe = Recipe(model=ModelSection(**tree.get("model", {})),
                    data=data_schema(**tree.get("data", {}), kind=kind),
                    train=TrainSection(**tree.get("train", {})),
                    eval=eval_schema(**tree.get("eval", {})) if eval_schema is not None else None,
                    extend=ExtendSection(**tree["extend"]) if "extend" in tree else None)
    recipe.set_keys = frozenset({f"{section}.{key}" for section, body in tree.items() for key in body}
                                | ({"data.kind"} if kind_written else set()))
    recipe.validate()
    _resolve_epochs(recipe)
    notes = [f"{origin}: {legacy_note}"] if legacy_note else []
    # A run's resolved recipe: training shortened a warm-up that did not fit only when train.max_steps came from
    # its command line, so reading the recipe back shortens it again rather than refusing what training accepted.
    warmup = _fit_warmup(recipe.train, on_command_line | ({"train.max_steps"} if resolved else set()))
    unused = [] if legacy_note else recipe.unused_keys()  # 0.1 spelled every key: its recipes record no choice
    recipe.notes = tuple(notes + ([warmup] if warmup else []) + unused)
    return recipe


def _resolve_epochs(recipe: Recipe) -> None:
    """`train.epochs` over a fixed training set of `data.train_size` sequences sets `train.max_steps` to
    ceil(epochs x train_size / batch_size) (batches run on across epoch boundaries, so no sequence is dropped); a
    max_steps also given must equal it. Without epochs, max_steps must be given."""
    t = recipe.train
    if t.epochs is None:
        if t.max_steps is None:
            fail("train.max_steps", "null needs train.epochs (passes over data.train_size sequences)")
        return
    size = getattr(recipe.data, "train_size", None)
    if size is None:
        where = ("set data.train_size" if hasattr(recipe.data, "train_size") else
                 f"data.kind '{recipe.data.kind}' has no fixed training set; use train.max_steps")
        fail("train.epochs", f"counts passes over a fixed training set of data.train_size sequences: {where}")
    steps = math.ceil(t.epochs * size / t.batch_size)
    if t.max_steps is not None and t.max_steps != steps:
        fail("train.max_steps", f"{t.max_steps} disagrees with train.epochs={t.epochs} over data.train_size={size} "
             f"at batch {t.batch_size} ({steps} steps); give one of them (train.max_steps=null or train.epochs=null)")
    t.max_steps = steps


def _fit_warmup(t: TrainSection, on_command_line: set[str]) -> str | None:
    """A warm-up count that does not fit max_steps: shortened, with a note, when only max_steps came from the
    command line (e.g. a one-step smoke run of a recipe with a warm-up); an error naming the key otherwise."""
    if t.warmup < 1 or t.warmup < t.max_steps:
        return None
    if "train.warmup" in on_command_line or "train.max_steps" not in on_command_line:
        fail("train.warmup", f"{int(t.warmup)} warm-up steps must be fewer than train.max_steps ({t.max_steps}); "
             "lower it, or give a fraction of the steps (e.g. train.warmup=0.02)")
    return (f"train.warmup: {int(t.warmup)} warm-up steps do not fit train.max_steps={t.max_steps}; warming up for "
            f"{t.warmup_steps}")


def load_recipe(recipe: str, overrides: list[str] | None = None, resolved: bool = False) -> Recipe:
    """Load a shipped recipe (`c4` or `c4.yaml`) or a YAML path, apply `key=value` overrides, validate.

    Overrides use dotted keys (`train.max_steps=200`, `model.pe_args.theta=500000`); values are read by
    `tapecli.recipe.values.parse_value` (YAML: `null`, `true`, `[0.9, 0.95]`) and type-checked against the schema.
    `resolved`: the file is a run's RUN/recipe.yaml, read as the training that wrote it read its recipe.
    Raises TapeError on any mistake.
    """
    origin, text = locate(recipe)
    return _build(yamlsafe.load(text, origin), origin, overrides or [], resolved)
