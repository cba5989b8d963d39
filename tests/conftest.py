"""Shared fixtures: every test runs offline with a private Hugging Face cache.

- `tiny_corpus`: a few KB of text in the test's own folder; `shared_corpus`: the same documents, once per session
  (read-only).
- `trained`: tiny runs trained once per session and shared (tests/shared_runs.py): `trained()` is the TINY recipe of
  train_helpers trained 2 steps (one checkpoint, step-00000002) on `shared_corpus`; `trained(recipe, *overrides)`
  any other; `trained.copy(dest, ...)` a private copy for tests that write into a run.
- `tiny_hf_llama`: a tiny Hugging Face Llama directory (hf_helpers.make_hf_llama with 2 KV heads, 32 positions,
  byte-level BPE tokenizer.json, 40 KB shards), made once per session (read-only).
- `plugin_site`: the plugin package of plugin_helpers pip-installed into a folder, once per session (read-only).
- `torch_on_one_thread` (automatic): torch runs on one thread in every test; `one_thread`: the same for a module,
  stated where a test depends on it (in-process results equal to a subprocess's bit for bit).
- `eager_flex`: the FlexAttention path through flex_attention's unfused eager form, backward included, on the CPU.

`pytest --cpu-durations=N` prints the N tests that took the most CPU time (this process and the subprocesses it
waited for, setup to teardown): on a shared machine, where `--durations` measures the load as much as the tests.
"""

from __future__ import annotations

import gc
import random
import resource
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from shared_runs import TrainedRuns


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="show the N tests that used the most CPU time (with the subprocesses they waited for)")


_CPU_SECONDS: dict[str, float] = {}  # nodeid -> CPU seconds, gathered from the reports (also those of xdist workers)
_STARTED: dict[str, float] = {}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _STARTED[item.nodeid] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    if call.when == "teardown" and item.nodeid in _STARTED:
        outcome.get_result().user_properties.append(("cpu_seconds", _cpu_seconds() - _STARTED.pop(item.nodeid)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == "cpu_seconds":
            _CPU_SECONDS[report.nodeid] = value


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, the test modules) lives as long as the test run: out of the garbage
    collector's full passes (gc.freeze), which would otherwise walk it again each time (a good part of a second)."""
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding `slow` tests first, each file's tests still together and in order: the long end-to-end runs
    start early, and the last minutes of a parallel run (pytest -n) are short tests spread over every worker
    instead of one long test holding one worker while the others wait."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the order within each group stays


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    n = config.getoption("--cpu-durations")
    if n is None:
        return
    terminalreporter.section(f"most CPU time: {n} of {len(_CPU_SECONDS)} tests, {sum(_CPU_SECONDS.values()):.1f} s "
                             "in all")
    for nodeid, seconds in sorted(_CPU_SECONDS.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{seconds:8.2f}s  {nodeid}")


@pytest.fixture(scope="session", autouse=True)
def one_command_tree() -> Iterator[None]:
    """Typer's CliRunner builds the Click command tree of `app` anew at every `invoke` (~0.1 s for tape's commands,
    a minute over the suite's invocations): it takes cli_helpers.command_tree's, built once per app."""
    import typer.testing
    from cli_helpers import command_tree

    build = typer.testing._get_command
    typer.testing._get_command = command_tree
    yield
    typer.testing._get_command = build


@pytest.fixture(scope="session", autouse=True)
def torch_on_one_thread() -> Iterator[None]:
    """Every test runs torch on one thread, as the CLI's subprocesses do (train_helpers.subprocess_env): the models
    are tiny, so a second thread gains little on an idle machine, and on a shared one a process's threads wait for
    each other at every operation (the SCROLLS end-to-end tests took 9x the CPU time on two threads at load 40)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def hf_offline(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may touch the network or the user's HF cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
    # Both libraries read the offline flag once, at import; if an earlier test imported them, flip it there too.
    if "huggingface_hub" in sys.modules:
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    if "datasets" in sys.modules:
        monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)


_WORDS = ("the model reads a long sequence of tokens and learns where each one sits relative to the others "
          "position encoding rotary attention bias layer head train evaluate value query key small large fast "
          "slowly quickly river mountain city garden window paper number letter question answer").split()


def write_corpus(root: Path) -> Path:
    """ROOT holding 8 `.txt` documents (~6 KB): sentences, digits, tabs, double spaces, blank lines, unicode."""
    rng = random.Random(0)
    root.mkdir(parents=True)
    for d in range(8):
        paragraphs = []
        for _ in range(rng.randint(3, 6)):
            sentences = []
            for _ in range(rng.randint(2, 5)):
                words = rng.choices(_WORDS, k=rng.randint(4, 12))
                end = rng.choice([".", "!", "?", f" {rng.randint(0, 9999)}."])
                sentences.append(" ".join(words).capitalize() + end)
            paragraphs.append(" ".join(sentences))
        extras = "\tTabbed  line with  double spaces.\nCafé naïve — 東京 🙂\n"
        (root / f"doc{d:02d}.txt").write_text("\n\n".join(paragraphs) + "\n" + extras, encoding="utf-8")
    return root


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """A directory of 8 `.txt` documents (~6 KB): sentences, digits, tabs, double spaces, blank lines, unicode."""
    return write_corpus(tmp_path / "corpus")


@pytest.fixture(scope="session")
def shared_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The documents of `tiny_corpus`, written once per session; read-only."""
    return write_corpus(tmp_path_factory.mktemp("shared") / "corpus")


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, shared_corpus: Path) -> Iterator[TrainedRuns]:
    """Tiny runs trained once per session (tests/shared_runs.py); the session fails if a test changed one."""
    runs = TrainedRuns(tmp_path_factory.mktemp("trained"), shared_corpus)
    yield runs
    changed = runs.changed()
    assert not changed, f"a test wrote into shared runs (use trained.copy): {changed}"


@pytest.fixture(scope="session")
def tiny_hf_llama(tmp_path_factory: pytest.TempPathFactory, trained: TrainedRuns) -> Path:
    """A tiny Hugging Face Llama directory, saved once per session by transformers' save_pretrained; read-only."""
    pytest.importorskip("transformers")
    from hf_helpers import make_hf_llama

    directory = tmp_path_factory.mktemp("hf_llama") / "hf"
    make_hf_llama(directory, n_kv_heads=2, max_position_embeddings=32)
    return trained.keep(directory)


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin package of plugin_helpers, really built and pip-installed (`--target`) once per session: the folder
    to put on sys.path; read-only (not fingerprinted: importing from it may write bytecode caches)."""
    from plugin_helpers import install_plugin

    return install_plugin(tmp_path_factory.mktemp("plugin"))


@pytest.fixture
def eager_flex(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The FlexAttention path through flex_attention's eager form with its backward (its unfused math, every score
    materialised), which torch 2.13 refuses on the CPU by a device check only: lifted as `tape pe check`'s
    score-mod check lifts it (`unfused_backward_on_cpu`). The compiled kernel's numbers are CUDA's; the compiled
    forward on the CPU is checked in `test_flex_forward_on_cpu_equals_the_reference`."""
    from tapecli.model.attention import flex
    from tapecli.pe.check.score_mod import unfused_backward_on_cpu

    monkeypatch.setattr(flex, "compiled_flex", lambda: flex.flex_module().flex_attention)
    with unfused_backward_on_cpu():
        yield


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """torch on one thread for a whole module (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny models
    run fastest so on a shared machine, and compute what subprocesses started with OMP_NUM_THREADS=1 compute."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
