"""The one door every command opens a model through: training (train.init_from, finetune, resume, extend-context's
base, resuming on a base), evaluation (every `tape eval`) and export.

    source = find_source(spec)                         # what `spec` names, found without loading any weights
    opened = open_model(spec_or_source, device="auto", dtype="auto")     # evaluation, export
    opened = open_model(spec, pe_args={"scaling": "linear", "factor": 2})   # evaluation with --pe-arg
    config = model_config(spec, pe_args=...)          # what open_model would build, without any weight
    opened = open_model(spec, dtype="fp32", model_keys=recipe.set_values("model"))          # fine-tune, resume
    opened = open_model(spec, config=plan.config, lora=plan.lora, keep_base=True)           # extend-context
    opened.model, opened.tokenizer, opened.record()

A spec is one of (tape sources are tried first):
    a tape run directory    its newest complete checkpoint (RUN/checkpoints/step-XXXXXXXX/)
    a tape checkpoint       a step-XXXXXXXX/ directory, or a `save_model` export (model.safetensors + model_config.json)
    an extended checkpoint  one written by `tape extend-context` (it holds base_model.json): the frozen Hugging Face
                            base, found again from that record, with the checkpoint's own tensors over it
    a Hugging Face model    a directory (config.json, *.safetensors, tokenizer), a hub id (downloaded when online,
                            read from the Hugging Face cache offline) or a short name (tapecli.model.hf.hub.SHORT_NAMES)

What comes back, in eval mode on `device` (tapecli.runtime: auto is the GPU if there is one):
- the source's own tokenizer (a checkpoint's tokenizer/, a Hugging Face directory's tokenizer files);
- every tensor in `dtype` (auto: bf16 on a GPU, fp32 on the CPU), except for a model kept on its base (below); an
  extended checkpoint opens as a self-contained model, its own configuration with its LoRA merged (in fp32 where
  that costs no device memory: fp32 asked for, or the CPU);
- the saved configuration, changed by at most one of `model_keys` (keys a recipe set, merged by tapecli.model.merge:
  shapes are fixed, but the PE may grow from rope to tape, its new parameters initialised as in a fresh model) or
  `config` (a whole configuration decided elsewhere: an extension plan's), then by `pe_args` (evaluation-time PE
  arguments, which may change no weight's shape);
- `keep_base=True` (training on a Hugging Face base): the model records its base (`model.base_model`), so its
  checkpoints hold only its own tensors; `lora` adapters are added; its base weights are in `dtype` and its own
  tensors (new, LoRA, trained) fp32, the optimizer's master copy. An extended checkpoint is then rebuilt from the
  base's configuration, as training first built it, with `lora` (the recipe's plan), and its own tensors over it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError, how_to_set
from tapecli.model.hf.hub import HF_KINDS, is_hf_source, resolve_hf_source
from tapecli.model.hf.load import HF_CONFIG
from tapecli.store.checkpoint import (
    BASE_MODEL,
    MODEL_CONFIG,
    is_checkpoint,
    list_checkpoints,
    load_checkpoint_tokenizer,
    load_weights,
    read_base_record,
    read_model_config,
    resolve_checkpoint,
)
from tapecli.store.run import CHECKPOINTS, output_kind

if TYPE_CHECKING:
    import torch

    from tapecli.data.tokenizer import Tokenizer
    from tapecli.model import ModelConfig, Transformer
    from tapecli.model.extend.lora import LoraSpec

MODEL_KINDS = "a tape run directory, a checkpoint directory or a Hugging Face model directory or hub id"


# ---------------------------------------------------------------------------------------------------------------
# Sources: what a spec names, without loading anything


@dataclass(frozen=True)
class Source:
    """Where a model's weights come from."""

    spec: str  # as the user gave it (--model, --checkpoint, train.init_from, --base)
    kind: str  # "tape" (a tape checkpoint, extended ones included) or "hf"
    location: str  # tape: the checkpoint directory (absolute); hf: the directory (absolute) or the hub id as given
    name: str  # a short label for tables, plots and default output folders
    checkpoint: Path | None = None  # tape: the checkpoint directory, as resolved from the spec
    base: dict[str, Any] | None = None  # an extended checkpoint's base_model.json: {"source", "directory", "lora"}
    what: str = "--model"  # the option or recipe key that gave `spec`, for messages


def find_source(spec: str, what: str = "--model", kinds: str = MODEL_KINDS) -> Source:
    """The source `spec` names; `what` names the option or recipe key that gave it, `kinds` what it may name, in the
    one-line error when it names none (`--model: runs/x does not exist; pass --model PATH (a tape run ...)`).
    With `kinds=HF_KINDS` (a base to extend) a tape run or checkpoint, or a folder without config.json, is refused."""
    path = Path(spec).expanduser()
    if kinds == HF_KINDS and path.is_dir() and not (path / HF_CONFIG).is_file():  # only a Hugging Face model
        tape = output_kind(path)
        if tape in ("a tape checkpoint", "a tape run directory"):
            raise TapeError(f"{what}: {path} is {tape}, not a Hugging Face model directory (no {HF_CONFIG}); "
                            "pass a Hugging Face directory or hub id (`tape export` turns a RoPE checkpoint into one)")
        resolve_hf_source(spec, what)  # a folder without config.json: one line saying so
    if _is_tape(path):
        checkpoint = resolve_checkpoint(path)
        absolute = checkpoint.resolve()
        # A run is named after its directory; a checkpoint inside a run after both.
        in_run = absolute.parent.name == CHECKPOINTS
        name = (path.resolve().name if absolute != path.resolve() else
                f"{absolute.parent.parent.name}/{absolute.name}" if in_run else absolute.name)
        base = read_base_record(checkpoint) if (checkpoint / BASE_MODEL).is_file() else None
        return Source(spec=spec, kind="tape", location=str(absolute), name=name, checkpoint=checkpoint, base=base,
                      what=what)
    if not is_hf_source(spec):
        problem = "does not exist" if not path.exists() else "holds no tape checkpoint"
        raise TapeError(f"{what}: {spec} {problem}; {how_to_set(what)} ({kinds})")
    if path.exists():
        return Source(spec=spec, kind="hf", location=str(path.resolve()), name=path.resolve().name, what=what)
    return Source(spec=spec, kind="hf", location=spec, name=spec, what=what)


def _is_tape(path: Path) -> bool:
    """A tape checkpoint, or a run directory (one with checkpoints/ or step-* directories)."""
    return path.is_dir() and (is_checkpoint(path) or (path / CHECKPOINTS).is_dir() or bool(list_checkpoints(path)))


def base_record(source: str, directory: Path, lora: LoraSpec | None) -> dict[str, Any]:
    """What a checkpoint on a base stores to find it again and to know it is the same: the source as given, the
    directory it resolved to, and the fingerprint of its weights (`tapecli.model.hf.files.fingerprint`: the hub
    commit when it came from the hub, each weight file's size and a hash of its header and of samples of its data)."""
    from tapecli.model.hf.files import fingerprint

    return {"source": source, "directory": str(Path(directory).resolve()),
            "lora": None if lora is None else lora.to_dict(), "fingerprint": fingerprint(Path(directory))}


def find_base(record: dict[str, Any]) -> Path:
    """The base's directory: the recorded one if it still exists, else a hub source resolved again (hub cache);
    a local base that is gone is one line naming where it was. A base whose weights are not those the checkpoint
    was trained on (its recorded fingerprint) is refused in one line naming both."""
    directory = Path(record["directory"])
    if not (directory / HF_CONFIG).is_file():
        source = Path(record["source"]).expanduser()
        local = directory.parts[-len(source.parts):] == source.parts  # the path given, not a hub snapshot
        if local or not is_hf_source(record["source"]):
            what = f"has no {HF_CONFIG}" if directory.is_dir() else "is gone"
            raise TapeError(f"{directory}: the Hugging Face base this checkpoint was trained on {what}; restore it "
                            "there (base_model.json points to it)")
        directory = resolve_hf_source(record["source"])
    _check_same_base(record.get("fingerprint"), directory)
    return directory


def _check_same_base(recorded: dict[str, Any] | None, directory: Path) -> None:
    """One line naming both bases when `directory` holds other weights than the `recorded` fingerprint says
    (checkpoints written before fingerprints were recorded are not checked)."""
    from tapecli.model.hf.files import fingerprint

    if not recorded:
        return
    found = fingerprint(directory)
    if found["files"] == recorded["files"]:
        return

    def describe(print_: dict[str, Any]) -> str:
        revision = f"revision {print_['revision'][:12]}, " if print_.get("revision") else ""
        n = len(print_["files"])
        return f"{revision}weights {print_['sha256'][:12]} ({n} file{'s' * (n != 1)})"

    raise TapeError(f"{directory}: not the Hugging Face base this checkpoint was trained on (trained on "
                    f"{describe(recorded)}; found {describe(found)}); put that base back there (base_model.json "
                    "records where it was and its fingerprint)")


def base_config(source: Source) -> tuple[dict[str, Any], str]:
    """(the `ModelConfig.to_dict()` of the Hugging Face model a source is or sits on, how messages name it); what an
    extension plan starts from. Resolves (downloads) a hub id; loads no weights."""
    from tapecli.model.hf.load import hf_model_config, read_hf_config

    if source.kind == "hf":
        directory, origin = resolve_hf_source(source.spec, source.what), source.spec
    elif source.base is not None:
        directory, origin = find_base(source.base), source.base["source"]
    else:
        raise TapeError(f"{source.spec} is a tape checkpoint, not a Hugging Face model or a checkpoint on one")
    return hf_model_config(read_hf_config(directory), str(directory / HF_CONFIG)).to_dict(), origin


# ---------------------------------------------------------------------------------------------------------------
# Opening


@dataclass
class OpenedModel:
    """A model ready for use (eval mode, on its device, in its dtype) and where it came from."""

    model: Transformer
    tokenizer: Tokenizer
    spec: str  # what the user passed
    source: str  # the resolved checkpoint directory, Hugging Face directory or hub id (Source.location)
    kind: str  # "tape" or "hf"
    dtype: str  # fp32 | bf16 | fp16
    device: str
    pe_args: dict[str, Any] = field(default_factory=dict)  # the --pe-arg overrides applied (empty: none)
    name: str = ""  # a short label for tables and plots

    def record(self) -> dict[str, Any]:
        """What determines this model's results, for an evaluation's settings.json (the device is not in it:
        a run may resume on another device). The attention keys (window, temperature, length scale, schedule)
        appear only when one differs from its default, so the settings of earlier evaluations stay equal."""
        config = self.model.config
        return {"name": self.name, "source": self.source, "kind": self.kind, "dtype": self.dtype,
                "pe": config.pe, "pe_args": config.pe_args, "pe_overrides": self.pe_args, **config.attention_keys()}


def open_model(spec: str | Source, *, device: str | torch.device = "auto", dtype: str = "auto",
               model_keys: dict[str, Any] | None = None, config: ModelConfig | None = None,
               pe_args: dict[str, Any] | None = None, lora: LoraSpec | None = None, keep_base: bool = False,
               what: str = "--model") -> OpenedModel:
    """Open `spec` (see the module docstring for every argument); `what` names the option in error messages."""
    from tapecli.runtime import resolve_device, resolve_dtype

    source = spec if isinstance(spec, Source) else find_source(spec, what)
    torch_device = resolve_device(str(device))
    dtype_name, torch_dtype = resolve_dtype(dtype, torch_device)
    change = _Change(model_keys or {}, config, pe_args or {})
    if source.kind == "hf":
        model, tokenizer = _open_hf(source, change, torch_dtype, torch_device, lora, keep_base)
    elif source.base is not None:
        model, tokenizer = _open_extended(source, change, torch_dtype, torch_device, lora, keep_base)
    else:
        model, tokenizer = _open_checkpoint(source, change)
    if getattr(model, "base_model", None) is None:
        model.to(device=torch_device, dtype=torch_dtype)  # one dtype throughout
    return OpenedModel(model=model.eval(), tokenizer=tokenizer, spec=source.spec, source=source.location,
                       kind=source.kind, dtype=dtype_name, device=str(torch_device), pe_args=dict(pe_args or {}),
                       name=source.name)


def model_config(spec: str, *, pe_args: dict[str, Any] | None = None, what: str = "--model") -> ModelConfig:
    """The configuration `open_model(spec, pe_args=...)` would build, read without any weight (a hub id is
    resolved, so downloaded when online): what a command checks every model against before any work. A missing
    model, a bad config.json or a bad --pe-arg is the TapeError opening it would raise."""
    from tapecli.model.hf.load import hf_model_config, read_hf_config

    source = find_source(spec, what)
    change = _Change({}, None, pe_args or {})
    if source.kind == "hf":
        directory = resolve_hf_source(source.spec, source.what)
        saved = hf_model_config(read_hf_config(directory), str(directory / HF_CONFIG)).to_dict()
        return change.apply(saved, source.spec, quiet=True)[0]
    return change.apply(read_model_config(source.checkpoint), str(source.checkpoint / MODEL_CONFIG), quiet=True)[0]


def model_tokenizer(spec: str, what: str = "--model") -> Tokenizer:
    """The tokenizer `open_model(spec)` would give, without any weight (an evaluation estimating its prompts)."""
    from tapecli.model.hf.load import load_hf_tokenizer, read_hf_config

    source = find_source(spec, what)
    if source.kind == "hf":
        directory = resolve_hf_source(source.spec, source.what)
        return load_hf_tokenizer(directory, read_hf_config(directory))
    return load_checkpoint_tokenizer(source.checkpoint)


@dataclass
class _Change:
    """How the opened model's configuration differs from the saved one."""

    model_keys: dict[str, Any]
    config: ModelConfig | None
    pe_args: dict[str, Any]

    def apply(self, saved: dict[str, Any], origin: str, quiet: bool = False) -> tuple[ModelConfig, bool]:
        """(the configuration to build, whether the PE grew from rope to tape); `quiet`: no note on a changed
        plugin (the model is only being checked; opening it prints the note)."""
        from tapecli.model import ModelConfig
        from tapecli.model.merge import GROWTH, merge_model_config

        if self.config is not None:
            config, grown = self.config, (saved.get("pe"), self.config.pe) in GROWTH
        elif self.model_keys:
            config, grown = merge_model_config(saved, self.model_keys, origin)
        else:
            try:
                config, grown = ModelConfig.from_dict(saved), False
            except ValueError as e:
                raise TapeError(f"{origin}: {e}") from None
        if self.pe_args:
            config = _with_pe_args(config, self.pe_args)
        if not quiet:
            _note_plugin_change(saved.get("pe_plugin"), config.pe_plugin, origin)
        return config, grown


def _note_plugin_change(saved: dict[str, Any] | None, now: dict[str, Any] | None, origin: str) -> None:
    """One note when a plugin PE's code is not what the model was saved with (another version or file content)."""
    if saved and now and saved != now:
        from tapecli.model.pe.plugins import describe

        print(f"note: {origin} was saved with the PE from {describe(saved)}; it now comes from {describe(now)}",
              file=sys.stderr)


def _with_pe_args(config: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """`config` with its PE arguments updated (validated by the PE); one that changes a weight's shape (e.g. TAPE's
    `hidden`) is refused with one line."""
    from tapecli.model import ModelConfig
    from tapecli.model.merge import parameter_shapes

    try:
        updated = ModelConfig.from_dict({**config.to_dict(), "pe_args": {**config.pe_args, **overrides}})
    except ValueError as e:
        raise TapeError(f"--pe-arg: {str(e).replace('model.pe_args.', '')}") from None
    before, after = parameter_shapes(config), parameter_shapes(updated)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    if changed:
        name = changed[0]
        raise TapeError(f"--pe-arg {', '.join(overrides)}: changes the shape of the model's weights ({name}: "
                        f"{before.get(name)} -> {after.get(name)}); only PE arguments without weights can change "
                        "at evaluation time")
    return updated


def _open_checkpoint(source: Source, change: _Change) -> tuple[Transformer, Tokenizer]:
    """A tape checkpoint: the model built as a fresh one (fp32, on the CPU; a grown PE keeps its fresh
    initialisation), then the checkpoint's weights."""
    from tapecli.model import Transformer
    from tapecli.model.merge import new_parameter_names

    checkpoint = source.checkpoint
    origin = str(checkpoint) if change.model_keys else str(checkpoint / MODEL_CONFIG)
    config, grown = change.apply(read_model_config(checkpoint), origin)
    model = Transformer(config)
    load_weights(model, checkpoint, missing_ok=new_parameter_names(model) if grown else set())
    return model, load_checkpoint_tokenizer(checkpoint)


def _open_hf(source: Source, change: _Change, dtype: torch.dtype, device: torch.device, lora: LoraSpec | None,
             keep_base: bool) -> tuple[Transformer, Tokenizer]:
    """A Hugging Face model: its weights assigned straight from its safetensors in `dtype` (tapecli.model.hf.load), its
    own tokenizer."""
    from tapecli.model.extend.extended import build_from_base
    from tapecli.model.hf.load import hf_model_config, load_hf_tokenizer, read_hf_config

    directory = resolve_hf_source(source.spec, source.what)
    hf = read_hf_config(directory)
    config, _ = change.apply(hf_model_config(hf, str(directory / HF_CONFIG)).to_dict(), source.spec)
    tokenizer = load_hf_tokenizer(directory, hf)  # before the weights: a missing tokenizer fails in a second
    model = build_from_base(config, directory, dtype=dtype, device=device, lora=lora)
    if keep_base:
        model.base_model = base_record(source.spec, directory, lora)
    return model, tokenizer


def _open_extended(source: Source, change: _Change, dtype: torch.dtype, device: torch.device,
                   lora: LoraSpec | None, keep_base: bool) -> tuple[Transformer, Tokenizer]:
    """A checkpoint on a frozen Hugging Face base: the base again, then the checkpoint's own tensors over it."""
    from tapecli.model.extend.extended import build_from_base
    from tapecli.model.extend.lora import LoraSpec, merge_lora
    from tapecli.model.hf.load import hf_model_config, read_hf_config

    checkpoint, record = source.checkpoint, source.base
    directory = find_base(record)
    if keep_base:  # training goes on: rebuilt from the base as training first built it
        config, _ = change.apply(hf_model_config(read_hf_config(directory), str(directory / HF_CONFIG)).to_dict(),
                                 record["source"])
    else:  # a self-contained model: the checkpoint's own configuration and LoRA, merged below
        origin = str(checkpoint) if change.model_keys else str(checkpoint / MODEL_CONFIG)
        config, grown = change.apply(read_model_config(checkpoint), origin)
        if grown:
            raise TapeError(f"model.pe: {checkpoint} sits on a frozen base; grow its PE with extend-context")
        lora = None if record.get("lora") is None else LoraSpec(**record["lora"])
        dtype = _merge_dtype(dtype, device)
    tokenizer = load_checkpoint_tokenizer(checkpoint)  # before the weights, as for a Hugging Face model
    model = build_from_base(config, directory, dtype=dtype, device=device, lora=lora)
    # Whatever the checkpoint lacks comes from the base; what it holds (new or trained tensors) stays fp32.
    load_weights(model, checkpoint, missing_ok=set(model.state_dict()), keep_saved_dtype=True)
    if keep_base:
        model.base_model = base_record(record["source"], directory, lora)
    else:
        merge_lora(model)
    return model, tokenizer


def _merge_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a base is read in to merge LoRA into it: fp32 where that costs no extra device memory (fp32 asked
    for, or the CPU, where `auto` is fp32), so the merged weights are rounded to `dtype` once; else `dtype`."""
    import torch

    from tapecli.runtime import resolve_dtype

    return torch.float32 if torch.float32 in (dtype, resolve_dtype("auto", device)[1]) else dtype
