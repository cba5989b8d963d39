"""Hugging Face sources: what names one (a directory, a hub id, a short name) and where its files are.

    is_hf_source("qwen3-0.6b") -> True           # a directory with config.json, a short name, or owner/name
    resolve_hf_source("qwen3-0.6b", "--base")    # its local directory: as given, or the hub snapshot

A hub id is downloaded when the hub can be reached and read from the Hugging Face cache otherwise; offline and not
cached, it is one line saying to pass a local directory instead. Which spec is a tape source and which a Hugging Face
one (tape sources are tried first) is decided by `tapecli.store.door`, the one door every model is opened through.
"""

from __future__ import annotations

import re
from pathlib import Path

from tapecli.errors import TapeError, how_to_set
from tapecli.model.hf.load import HF_CONFIG

TAPE_CONFIG = "model_config.json"  # what a tape checkpoint holds beside its weights: such a directory is not a HF one

# Short names for common bases of the classes tape imports (hub ids; the meta-llama ones are gated: `hf auth login`).
SHORT_NAMES: dict[str, str] = {
    "llama2-7b": "meta-llama/Llama-2-7b-hf",
    "llama2-13b": "meta-llama/Llama-2-13b-hf",
    "llama3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama3.2-1b": "meta-llama/Llama-3.2-1B",
    "mistral-7b": "mistralai/Mistral-7B-v0.3",
    "mistral-7b-v0.1": "mistralai/Mistral-7B-v0.1",  # sliding window of 4096 in every layer
    "tinyllama": "TinyLlama/TinyLlama_v1.1",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B",
    "smollm3-3b": "HuggingFaceTB/SmolLM3-3B-Base",  # NoPE every 4th layer
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",  # q/k/v biases
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B-Base",  # QK-norm
    "qwen3-1.7b": "Qwen/Qwen3-1.7B-Base",
    "qwen3-8b": "Qwen/Qwen3-8B-Base",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HF_KINDS = "a Hugging Face model directory (config.json, *.safetensors, tokenizer), hub id or short name"


def is_hf_source(source: str) -> bool:
    """True for a Hugging Face directory (config.json, no tape model_config.json), a known short name, or a string
    that is no local path and looks like a hub id (`owner/name`)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return (path / HF_CONFIG).is_file() and not (path / TAPE_CONFIG).is_file()
    if path.exists():
        return False
    return source.lower() in SHORT_NAMES or bool(_HUB_ID.match(source))


def resolve_hf_source(source: str, what: str = "--model") -> Path:
    """The local directory of `source`: as given, or the hub snapshot (downloaded, or found in the cache offline);
    `what` is the option or recipe key that gave it, for messages."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / HF_CONFIG).is_file():  # a tape run or checkpoint: the door says so (find_source)
            raise TapeError(f"{what}: {path} has no {HF_CONFIG}; {how_to_set(what, 'DIR')} ({HF_KINDS})")
        return path
    repo = SHORT_NAMES.get(source.lower(), source)
    if not _HUB_ID.match(repo):
        names = ", ".join(SHORT_NAMES)
        raise TapeError(f"{what}: {source!r} is neither a directory nor a hub id (owner/name) nor a short name "
                        f"({names})")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo, allow_patterns=["*.json", "*.safetensors", "tokenizer.model"]))
    except GatedRepoError:
        raise TapeError(f"{repo} is gated: accept its licence on huggingface.co and log in (`hf auth login`), "
                        "or pass a local directory") from None
    except RepositoryNotFoundError:
        raise TapeError(f"{repo} does not exist on the Hugging Face hub (or needs a login)") from None
    except LocalEntryNotFoundError:
        local = "" if repo != source else "no directory here, and as a hub id "  # `runs/x`: a mistyped path?
        raise TapeError(f"{what}: {source} is {local}not in the local Hugging Face cache, and the hub cannot be "
                        f"reached; {how_to_set(what, 'DIR')} (a local Hugging Face model directory: config.json, "
                        "*.safetensors, tokenizer)") from None
    except Exception as e:  # network failures surface as several library-specific types
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TapeError(f"{repo} could not be downloaded ({reason}); pass a local directory with config.json, "
                        "*.safetensors and the tokenizer instead") from None
