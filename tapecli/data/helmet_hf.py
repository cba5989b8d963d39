"""The Hugging Face datasets HELMET reads from the hub (its ICL and long-document QA categories; data.py's
`load_dataset(...)` calls), from the hub or from a local copy, with `datasets` either way.

`dataset(data, hub_id, folder, config)` returns the `DatasetDict` of `datasets.load_dataset(hub_id, config)` when
`data` is None (users with a network), else that of `datasets.load_dataset(DATA/folder)` (or `DATA/folder/config`
when that folder exists: the hub's layout of a configuration's files), where DATA is `data` or its data/ subfolder:
a copy made by `huggingface-cli download --repo-type dataset HUB_ID --local-dir DATA/FOLDER`, or any folder of
train/test/validation files `datasets` reads (jsonl, json, parquet, csv). `json_split` reads one named jsonl file
(InfiniteBench's `longbook_qa_eng.jsonl` ...) with HELMET's features. A folder or copy that is missing, or the hub
unreachable, is one line naming the copy to make.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError


def hint(hub_id: str, folder: str) -> str:
    """The one-line offline hint: the command that makes the local copy, and what to pass."""
    return (f"on a machine with a network run `huggingface-cli download --repo-type dataset {hub_id} --local-dir "
            f"DATA/{folder}` and pass --data DATA")


def local(data: str, folder: str, hub_id: str) -> Path:
    """DATA/folder (or DATA/data/folder): the local copy of `hub_id`; one line when neither exists."""
    root = Path(data).expanduser()
    for candidate in (root / folder, root / "data" / folder):
        if candidate.is_dir():
            return candidate
    raise TapeError(f"--data {data}: no {folder}/ folder (a local copy of the hub dataset {hub_id}); "
                    f"{hint(hub_id, folder)}")


def dataset(data: str | None, hub_id: str, folder: str, config: str | None = None) -> Any:
    """The DatasetDict HELMET's load_dataset(hub_id, config) gives, from the hub or the local copy."""
    import datasets

    if data is None:
        return hub(hub_id, folder, config)
    path = local(data, folder, hub_id)
    if config is not None and (path / config).is_dir():
        path = path / config
    try:
        with quiet(datasets):
            return datasets.load_dataset(str(path))
    except Exception as e:  # noqa: BLE001 - a folder datasets cannot read: the folder and the reason
        raise TapeError(f"{path}: not a dataset folder datasets can read ({type(e).__name__}: {e})"
                        .splitlines()[0]) from None


def json_split(data: str | None, hub_id: str, folder: str, split: str, features: Any) -> Any:
    """One split of a hub dataset whose splits are jsonl files (InfiniteBench), read with `features`."""
    import datasets

    if data is None:
        return hub(hub_id, folder, features=features)[split]
    path = local(data, folder, hub_id) / f"{split}.jsonl"
    if not path.is_file():
        raise TapeError(f"--data {data}: no {folder}/{split}.jsonl (from the hub dataset {hub_id}); "
                        f"{hint(hub_id, folder)}")
    try:
        with quiet(datasets):
            return datasets.load_dataset("json", data_files={split: str(path)}, features=features, split=split)
    except Exception as e:  # noqa: BLE001 - a malformed file: the file and the reason
        raise TapeError(f"{path}: {type(e).__name__}: {e}".splitlines()[0]) from None


@contextmanager
def quiet(datasets: Any) -> Iterator[None]:
    """No "Generating train split" bar for a local copy (as SCROLLS' reader does)."""
    loud = not datasets.utils.are_progress_bars_disabled()
    if loud:
        datasets.utils.disable_progress_bars()
    try:
        yield
    finally:
        if loud:
            datasets.utils.enable_progress_bars()


def hub(hub_id: str, folder: str, *args: Any, **kwargs: Any) -> Any:
    """`datasets.load_dataset(hub_id, *args, **kwargs)` (users with a network); offline, one line."""
    import datasets

    from tapecli.data.sources import hub_unreachable

    try:
        return datasets.load_dataset(hub_id, *args, **kwargs)
    except Exception as e:  # noqa: BLE001 - offline, unreachable or refused: one sentence
        if hub_unreachable(e):
            raise TapeError(f"{hub_id} cannot be read from the Hugging Face hub (offline or unreachable); "
                            f"{hint(hub_id, folder)}") from None
        raise TapeError(f"{hub_id}: {type(e).__name__}: {e}".splitlines()[0]) from None


def split(dataset_dict: Any, name: str, where: str) -> Any:
    """dataset_dict[name]; one line naming the missing split."""
    if name not in dataset_dict:
        raise TapeError(f"{where}: no {name!r} split (has {', '.join(dataset_dict)}); a copy of the hub dataset "
                        "keeps its split names")
    return dataset_dict[name]
