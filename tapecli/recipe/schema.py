"""Recipes: the typed configuration of a `tape` run, loaded from YAML and `key=value` overrides.

A recipe has five sections -- `model`, `data`, `train`, `eval`, `extend` -- each a dataclass below. Every field has a
default, so a recipe file only needs the keys it changes; the shipped recipes spell out every key anyway, with
comments, so that they double as documentation. Values are type-checked against the dataclass annotations and
then cross-checked (`Recipe.validate`); every user mistake raises `TapeError` with a one-line message naming
the key. `Recipe.set_keys` records which keys the file or an override wrote (defaults never count as set).

This module owns the schema (the section dataclasses and their cross-checks); `recipe_values` type-checks values
and applies `key=value` overrides, `recipe_files` finds shipped recipes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import yaml

from tapecli.errors import TapeError
from tapecli.recipe.files import list_recipes, locate, recipe_text
from tapecli.recipe.values import Tree, apply_override, check_tree, fail

__all__ = ["Recipe", "list_recipes", "load_recipe", "recipe_text"]

DataKind = Literal["text", "pairs", "addition", "scrolls", "selective-copy", "grid-1d", "grid-2d"]
Schedule = Literal["linear", "cosine", "constant"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
LoggerName = Literal["jsonl", "tensorboard", "wandb"]


@dataclass
class ModelSection:
    """Architecture of the Llama-style transformer; mirrors `tapecli.model.ModelConfig`."""

    pe: str = "tape"
    pe_args: dict[str, Any] = field(default_factory=dict)  # free-form; the PE module validates it
    n_layers: int = 12
    dim: int = 768
    n_heads: int = 12
    n_kv_heads: int | None = None  # None = n_heads (multi-head attention)
    ffn_dim: int | None = None  # None = the model's default SwiGLU width
    vocab_size: int | None = None  # None = take it from the tokenizer
    max_seq_len: int = 1024
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    init_std: float = 0.02
    abacus: bool = False  # Abacus digit-position embeddings (arithmetic only)


@dataclass
class DataSection:
    """Where the training tokens come from and how they are cut into sequences."""

    kind: DataKind = "text"
    source: str | None = None  # hub id (`allenai/c4:en`), file, directory, glob or `.bin`; unused by addition
    tokenizer: str = "byte"  # `byte`, a SentencePiece `.model`, a `tokenizer.json`, `addition` or `synthetic`
    seq_len: int = 1024
    val_fraction: float = 0.01
    text_field: str = "text"
    prompt_field: str = "prompt"
    target_field: str = "target"
    max_digits: int = 40
    min_digits: int = 1
    task: str | None = None  # kind scrolls: the SCROLLS task (tapecli.data.scrolls.TASKS)
    compat: Literal["clean", "official"] = "clean"  # kind scrolls: example construction (official = the code's quirks)
    copy_tokens: int = 128  # selective copy: symbols to copy (tapecli.data.synthetic)
    blanks: int = 128  # selective copy: blanks among them in training (the IID split)
    grid_width: int = 64  # grid navigation: cells per side of the torus in training
    p_empty: float = 0.5  # grid navigation: probability that a cell is blank in training


@dataclass
class TrainSection:
    """Optimisation, checkpointing and logging."""

    batch_size: int = 512  # global sequences per optimizer step
    micro_batch_size: int = 8  # sequences per forward/backward; batch_size / micro = accumulation steps
    max_steps: int = 10_000
    lr: float = 1e-4
    min_lr: float = 0.0  # learning rate at the end of the decay
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup: int | float = 0.02  # < 1: fraction of max_steps; >= 1: number of steps
    schedule: Schedule = "linear"
    grad_clip: float = 1.0  # max global gradient norm; 0 = off
    precision: Precision = "auto"  # auto: bf16 autocast on GPUs that support it, fp32 on CPU
    seed: int = 0
    save_every: int = 1000
    keep_last: int = 2  # checkpoints kept on disk; 0 = keep all
    eval_every: int = 500  # 0 = no periodic validation
    eval_batches: int = 50
    log_every: int = 10
    activation_checkpointing: bool = False
    compile: bool = False
    freeze: list[str] = field(default_factory=list)  # glob patterns of parameter names to freeze
    unfreeze: list[str] = field(default_factory=list)  # patterns unfrozen again after `freeze`
    init_from: str | None = None  # checkpoint (run or checkpoint dir), or a Hugging Face model, to start from
    parallel: Literal["ddp", "fsdp"] = "ddp"  # under torchrun: replicate (ddp) or shard (fsdp, FSDP2) the model
    # Where metrics go: jsonl (RUN/metrics.jsonl), tensorboard (RUN/tensorboard/), wandb (offline: WANDB_MODE=offline)
    loggers: list[LoggerName] = field(default_factory=lambda: ["jsonl"])

    @property
    def warmup_steps(self) -> int:
        """Warm-up length in optimizer steps."""
        if self.warmup < 1:
            return round(self.warmup * self.max_steps)
        return int(self.warmup)

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches accumulated per optimizer step."""
        return self.batch_size // self.micro_batch_size


@dataclass
class EvalSection:
    """Evaluation settings of the arithmetic and synthetic evaluations."""

    max_len: int | None = None  # largest operand length evaluated; None = 2 * data.max_digits
    samples: int = 100  # problems per (length, length) cell; sequences per split for the synthetic tasks
    dense_blanks: int = 64  # selective copy, OOD-dense split: blanks per sequence
    sparse_blanks: int = 256  # selective copy, OOD-sparse split
    dense_grid: list[float] = field(default_factory=lambda: [64, 32, 0.2])  # grid OOD-dense: length, width, p_empty
    sparse_grid: list[float] = field(default_factory=lambda: [256, 128, 0.8])  # grid OOD-sparse


@dataclass
class ExtendSection:
    """`tape extend-context`: what is trained on a Hugging Face base and how positions reach the longer context."""

    method: Literal["tape", "lora", "longlora", "full"] | None = None  # None: not a context extension
    scaling: Literal["pi", "yarn", "dynamic", "theta", "none"] = "pi"
    compat: Literal["paper", "official"] = "paper"  # official: PI under every method, TAPE's P frozen
    theta: float = 1e6  # RoPE base of `scaling: theta`
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    trainable: list[str] = field(default_factory=lambda: ["*embed_tokens*", "*norm*"])  # besides the method's own
    group_fraction: float = 0.25  # longlora: S²-Attn groups of this fraction of the training length


_SECTIONS: dict[str, type] = {"model": ModelSection, "data": DataSection, "train": TrainSection, "eval": EvalSection,
                              "extend": ExtendSection}


@dataclass
class Recipe:
    """A complete, validated run configuration."""

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    extend: ExtendSection = field(default_factory=ExtendSection)
    # The dotted keys ("model.pe", "train.lr", ...) the recipe file or an override wrote; every other key holds its
    # default. Only set keys may override what a checkpoint or a base model already says (tapecli.model.merge).
    set_keys: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_dict(cls, data: Any, origin: str = "recipe") -> Recipe:
        """Build and validate a recipe from nested dicts (e.g. a run's recipe.yaml); `origin` names the source
        in error messages."""
        return _build(check_tree(data, origin, _SECTIONS))

    def set_values(self, section: str) -> dict[str, Any]:
        """{key: value} of the keys of `section` that the user set."""
        body = getattr(self, section)
        return {f.name: getattr(body, f.name) for f in dataclasses.fields(body)
                if f"{section}.{f.name}" in self.set_keys}

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain nested dicts (YAML/JSON-able)."""
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The resolved recipe as YAML text that `load_recipe` reads back to an equal recipe."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

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
        """Cross-field checks; raises TapeError naming the first offending key."""
        m, d, t, e = self.model, self.data, self.train, self.eval
        pe_names = _pe_names()
        if m.pe not in pe_names:
            raise TapeError(f"model.pe: unknown positional encoding '{m.pe}'; allowed: {', '.join(pe_names)}")
        for key, value in [
            ("model.n_layers", m.n_layers), ("model.dim", m.dim), ("model.n_heads", m.n_heads),
            ("model.n_kv_heads", m.n_kv_heads), ("model.ffn_dim", m.ffn_dim), ("model.vocab_size", m.vocab_size),
            ("model.max_seq_len", m.max_seq_len), ("data.seq_len", d.seq_len), ("data.min_digits", d.min_digits),
            ("data.max_digits", d.max_digits), ("train.batch_size", t.batch_size),
            ("train.micro_batch_size", t.micro_batch_size), ("train.max_steps", t.max_steps),
            ("train.save_every", t.save_every), ("train.eval_batches", t.eval_batches),
            ("train.log_every", t.log_every), ("eval.max_len", e.max_len), ("eval.samples", e.samples),
        ]:
            if value is not None and value <= 0:
                fail(key, f"must be a positive integer, got {value}")
        for key, value in [
            ("model.norm_eps", m.norm_eps), ("model.init_std", m.init_std), ("train.lr", t.lr),
        ]:
            if not value > 0:
                fail(key, f"must be > 0, got {value}")
        for key, value in [
            ("train.min_lr", t.min_lr), ("train.weight_decay", t.weight_decay), ("train.grad_clip", t.grad_clip),
            ("train.keep_last", t.keep_last), ("train.eval_every", t.eval_every), ("train.seed", t.seed),
        ]:
            if value < 0:
                fail(key, f"must be >= 0, got {value}")
        if m.dim % m.n_heads:
            fail("model.n_heads", f"{m.n_heads} does not divide model.dim ({m.dim})")
        if m.n_kv_heads is not None and m.n_heads % m.n_kv_heads:
            fail("model.n_kv_heads", f"{m.n_kv_heads} does not divide model.n_heads ({m.n_heads})")
        if d.seq_len > m.max_seq_len:
            fail("data.seq_len", f"{d.seq_len} exceeds model.max_seq_len ({m.max_seq_len})")
        if not 0 <= d.val_fraction < 1:
            fail("data.val_fraction", f"must be in [0, 1), got {d.val_fraction}")
        if d.kind in ("text", "pairs") and not d.source:
            fail("data.source", f"data.kind '{d.kind}' needs a source (hub id, file, directory or glob)")
        if d.kind == "scrolls":
            from tapecli.data.scrolls import check_task

            check_task(d.task)
        if (d.kind == "addition") != (d.tokenizer == "addition"):
            fail("data.tokenizer", f"'{d.tokenizer}' does not fit data.kind '{d.kind}'; "
                  "addition data and the `addition` tokenizer go together")
        if d.kind == "addition":
            if d.min_digits > d.max_digits:
                fail("data.min_digits", f"{d.min_digits} exceeds data.max_digits ({d.max_digits})")
            # a + b = c <eos>, with c up to one digit longer than the operands
            needed = 3 * d.max_digits + 4
            if d.seq_len < needed:
                fail("data.seq_len", f"{d.seq_len} is too short for {d.max_digits}-digit addition "
                      f"(needs {needed} tokens)")
        from tapecli.data.synthetic import validate_synthetic

        validate_synthetic(d, e)
        if t.batch_size % t.micro_batch_size:
            fail("train.batch_size", f"{t.batch_size} is not divisible by train.micro_batch_size "
                  f"({t.micro_batch_size})")
        if t.min_lr > t.lr:
            fail("train.min_lr", f"{t.min_lr} exceeds train.lr ({t.lr})")
        if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
            fail("train.betas", f"expected a list of 2 floats in [0, 1), got {t.betas}")
        if t.warmup < 0 or (t.warmup >= 1 and t.warmup != int(t.warmup)):
            fail("train.warmup", f"expected a fraction in [0, 1) or a whole number of steps, got {t.warmup}")
        x = self.extend
        for key, value in (("extend.lora_rank", x.lora_rank), ("extend.lora_alpha", x.lora_alpha),
                           ("extend.theta", x.theta)):
            if not value > 0:
                fail(key, f"must be > 0, got {value}")
        if not 0 <= x.lora_dropout < 1:
            fail("extend.lora_dropout", f"must be in [0, 1), got {x.lora_dropout}")
        if not 0 < x.group_fraction <= 1:
            fail("extend.group_fraction", f"must be in (0, 1], got {x.group_fraction}")
        if len(set(t.loggers)) != len(t.loggers):
            fail("train.loggers", f"lists a logger twice: {t.loggers}")
        if t.warmup_steps >= t.max_steps:
            fail("train.warmup", f"{t.warmup_steps} warm-up steps must be fewer than train.max_steps "
                  f"({t.max_steps})")


def _pe_names() -> tuple[str, ...]:
    """Allowed `model.pe` values: the model's registry (imported lazily: it pulls in torch)."""
    from tapecli.model import PE_NAMES

    return PE_NAMES


def _build(tree: Tree) -> Recipe:
    recipe = Recipe(**{name: cls(**tree.get(name, {})) for name, cls in _SECTIONS.items()})
    recipe.set_keys = frozenset(f"{section}.{key}" for section, body in tree.items() for key in body)
    recipe.validate()
    return recipe


def load_recipe(recipe: str, overrides: list[str] | None = None) -> Recipe:
    """Load a shipped recipe (`c4` or `c4.yaml`) or a YAML path, apply `key=value` overrides, validate.

    Overrides use dotted keys (`train.max_steps=200`, `model.pe_args.theta=500000`); values are read as YAML
    (`null`, `true`, `[0.9, 0.95]`) and type-checked against the schema. Raises TapeError on any mistake.
    """
    origin, text = locate(recipe)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = " ".join(str(err).split())
        raise TapeError(f"{origin}: not valid YAML: {problem}") from None
    tree = check_tree(data, origin, _SECTIONS)
    for override in overrides or []:
        apply_override(tree, override, _SECTIONS)
    return _build(tree)
