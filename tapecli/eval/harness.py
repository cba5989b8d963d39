"""`tape eval harness`: any lm-evaluation-harness task on any tape model, through lm-eval's own `simple_evaluate`.

    run_harness(model_spec, tasks, include_path=[...], num_fewshot=None, limit=None, out=DIR, log_samples=False,
                dtype=, device=, pe_args=, batch_size=, max_length=, ...) -> (results dict, out dir)
    evaluate(lm, tasks, task_manager(tasks, include_path), ...) -> results dict   # any lm-eval model object

Tasks are looked up in a `TaskManager` that indexes only the `--include-path` folders, unless a task is not found
there: then lm-eval's ~16k built-in task files are indexed too (what lm-eval's own CLI always does, ~10 s).
A task may also be named by the path of its YAML file.

Files in the output directory (--out, or the one default of every evaluation, `tapecli.store.run.eval_dir`:
RUN/eval-harness/<checkpoint>; the JSON ones written through a temporary name and a rename):
    settings.json             the model and the options that change its answers (checked when the directory is reused)
    requests_rank0.db         lm-eval's request cache: every answer, stored as soon as it is computed, so a run
                              started again after an interruption redoes only the requests it had not answered
    results.json              lm-eval's results dict, as lm-eval's own tracker dumps it (without the samples)
    samples_<task>.jsonl      with --log-samples: lm-eval's per-sample records (prompt, responses, metrics)
Offline, a task whose data (or metric) lives on the Hugging Face Hub fails with one line saying how to point it at
local files instead.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.common import RESULTS_FILE, claim_settings
from tapecli.files import write_atomic

CACHE_PREFIX = "requests"  # lm-eval appends _rank0.db
CACHE_FILE = f"{CACHE_PREFIX}_rank0.db"

OFFLINE_HINT = ("copy the task's YAML into a folder, set `dataset_path: json` (or csv, parquet, arrow) and "
                "`dataset_kwargs: {data_files: {test: /absolute/path/file.jsonl}}`, and pass the folder with "
                "--include-path")


def resolve_task_files(tasks: list[str], include_path: list[str] | None) -> tuple[list[str], list[str]]:
    """(task names, include paths) with every task given as a YAML file replaced by its `task:` name and its folder
    added to the include paths (lm-eval < 0.4.13 accepts only names). Every task file tape passes on to lm-eval (these
    files, the YAMLs under the include paths, the files they `include:`) is read first by `tapecli.yamlsafe`: a
    Python tag, a duplicated key, an alias bomb or deep nesting is one line naming the file and the line, and lm-eval
    never sees the file."""
    names, paths, files = [], list(include_path or []), []
    for task in tasks:
        path = Path(task).expanduser()
        if path.suffix in (".yaml", ".yml") and path.is_file():
            config = read_task_file(path)
            if not isinstance(config, dict) or not isinstance(config.get("task"), str):
                raise TapeError(f"--tasks {task}: the YAML file has no `task:` name")
            names.append(config["task"])
            paths.append(str(path.parent))
            files.append(path)
        else:
            names.append(task)
    for folder in include_path or []:
        if Path(folder).is_dir():
            files += sorted(p for p in Path(folder).expanduser().rglob("*") if p.suffix in (".yaml", ".yml"))
    checked: set[Path] = set()
    while files:  # each file once, and what it includes
        path = files.pop().resolve()
        if path in checked or not path.is_file():
            continue
        checked.add(path)
        config = read_task_file(path)
        included = config.get("include") if isinstance(config, dict) else None
        if isinstance(included, str):
            files.append(path.parent / included)
    return names, list(dict.fromkeys(paths))


def read_task_file(path: Path) -> Any:
    """An lm-eval task YAML as plain values (its `!function` tags as text), through `tapecli.yamlsafe`."""
    from tapecli import yamlsafe
    from tapecli.faults import reading

    with reading(path):
        text = path.read_text(encoding="utf-8")
    return yamlsafe.load(text, str(path), tags={"!function"})


def task_manager(tasks: list[str], include_path: list[str] | None = None) -> Any:
    """A TaskManager that knows every requested task (names, not files: see `resolve_task_files`), indexing
    lm-eval's built-in tasks only when needed."""
    from lm_eval.tasks import TaskManager

    for folder in include_path or []:
        if not Path(folder).is_dir():
            raise TapeError(f"--include-path {folder} is not a directory")
    paths = [str(Path(p).resolve()) for p in include_path or []] or None
    manager = TaskManager(include_path=paths, include_defaults=False)
    if _missing(manager, tasks):
        manager = TaskManager(include_path=paths, include_defaults=True)
        missing = _missing(manager, tasks)
        if missing:
            where = f" in {', '.join(include_path)} or" if include_path else ""
            raise TapeError(f"unknown task(s) {', '.join(missing)}: not found{where} among lm-eval's built-in tasks "
                            "(list them with `lm-eval ls tasks`; local YAMLs need --include-path)")
    return manager


def _missing(manager: Any, tasks: list[str]) -> list[str]:
    return [t for t in tasks if not manager.match_tasks([t])]


def _offline_error(error: BaseException) -> TapeError | None:
    """A one-line TapeError when `error` (or its cause) means the Hub could not be reached, else None."""
    seen, visited = error, set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        name = type(seen).__name__
        if isinstance(seen, ConnectionError) or name in ("OfflineModeIsEnabled", "LocalEntryNotFoundError"):
            found = re.search(r"reach '([^']+)'", str(seen))
            what = f"the Hub dataset {found.group(1)}" if found else "files from the Hugging Face Hub"
            return TapeError(f"a task needs {what}, which cannot be downloaded here ({str(seen).splitlines()[0]}); "
                             f"to run it offline, {OFFLINE_HINT}")
        seen = seen.__cause__ or seen.__context__
    return None


def write_results(results: dict[str, Any], out: Path) -> Path:
    """results.json and (if lm-eval logged them) samples_<task>.jsonl, serialised as lm-eval's tracker does."""
    from lm_eval.utils import handle_non_serializable, sanitize_list

    out.mkdir(parents=True, exist_ok=True)
    summary = {key: value for key, value in results.items() if key != "samples"}
    write_atomic(out / RESULTS_FILE, json.dumps(summary, indent=2, default=handle_non_serializable,
                                                ensure_ascii=False) + "\n")
    for task, samples in (results.get("samples") or {}).items():
        lines = []
        for sample in samples:
            record = dict(sample)
            # lm-eval's tracker flattens the request arguments so `datasets` can load the file back.
            record["arguments"] = {f"gen_args_{i}": {f"arg_{j}": arg for j, arg in enumerate(args)}
                                   for i, args in enumerate(sample["arguments"])}
            record["resps"], record["filtered_resps"] = (sanitize_list(sample["resps"]),
                                                         sanitize_list(sample["filtered_resps"]))
            record["target"] = str(sample["target"])
            lines.append(json.dumps(record, default=handle_non_serializable, ensure_ascii=False) + "\n")
        write_atomic(out / f"samples_{task}.jsonl", "".join(lines))
    return out


def run_harness(model: str, tasks: list[str], *, include_path: list[str] | None = None,
                num_fewshot: int | None = None, limit: float | None = None, out: Path | None = None,
                log_samples: bool = False, bootstrap_iters: int = 100000, seed: int = 1234, dtype: str = "auto",
                device: str = "auto", pe_args: dict[str, Any] | None = None, **lm_options: Any
                ) -> tuple[dict[str, Any], Path]:
    """Open `model`, evaluate it on `tasks` with lm-eval's `simple_evaluate`, write the files; (results, out dir).

    `lm_options` go to `TapeLM` (batch_size, max_length, max_gen_toks, add_bos_token)."""
    from tapecli.eval.lm_adapter import TapeLM, check_lm_eval_version
    from tapecli.store.door import open_model
    from tapecli.store.run import check_output, eval_dir

    if out:
        check_output(out)
    check_lm_eval_version()
    if not tasks:
        raise TapeError("--tasks: name at least one task")
    tasks, include_path = resolve_task_files(tasks, include_path)
    manager = task_manager(tasks, include_path)  # before opening the model: a typo fails in a second
    opened = open_model(model, dtype=dtype, device=device, pe_args=pe_args)
    lm = TapeLM.from_opened(opened, seed=seed, **lm_options)
    out_dir = Path(out) if out else eval_dir("harness", opened.kind, opened.source)
    # The request cache holds answers keyed by request only, so the directory is tied to one model and its options.
    claim_settings(out_dir, lm.settings(), started=_cached_answers(out_dir / CACHE_FILE) > 0, stale=[CACHE_FILE])
    results = evaluate(lm, tasks, manager, num_fewshot=num_fewshot, limit=limit, log_samples=log_samples,
                       bootstrap_iters=bootstrap_iters, seed=seed, cache=out_dir / CACHE_PREFIX)
    write_results(results, out_dir)
    return results, out_dir


def _cached_answers(path: Path) -> int:
    """How many answers lm-eval's request cache holds (0 when there is none)."""
    if not path.is_file():
        return 0
    from sqlitedict import SqliteDict  # lm-eval's own cache store

    with SqliteDict(str(path), flag="r") as cache:
        return len(cache)


def evaluate(lm: Any, tasks: list[str | dict], manager: Any, *, num_fewshot: int | None = None,
             limit: float | None = None, log_samples: bool = False, bootstrap_iters: int = 100000,
             seed: int = 1234, cache: Path | None = None) -> dict[str, Any]:
    """lm-eval's `simple_evaluate` on an lm-eval model object; an unreachable Hub becomes one line. With `cache`
    (a path prefix), every answer is stored in lm-eval's sqlite request cache as it is computed, and answers already
    there are reused: an interrupted run, started again, redoes only what it had not finished."""
    from lm_eval import simple_evaluate

    try:
        return simple_evaluate(model=lm, model_args=getattr(lm, "settings", dict)(), tasks=tasks,
                               num_fewshot=num_fewshot, limit=limit, task_manager=manager, log_samples=log_samples,
                               bootstrap_iters=bootstrap_iters, random_seed=seed, numpy_random_seed=seed,
                               torch_random_seed=seed, fewshot_random_seed=seed,
                               use_cache=None if cache is None else str(cache))
    except Exception as e:  # noqa: BLE001 -- only the offline case is turned into a one-liner
        offline = _offline_error(e)
        if offline is None:
            raise
        raise offline from None


def results_table(results: dict[str, Any]) -> str:
    """lm-eval's own markdown tables: per task, then per group when there are groups."""
    from lm_eval.utils import make_table

    text = make_table(results)
    if results.get("groups"):
        text += "\n" + make_table(results, "groups")
    return text
