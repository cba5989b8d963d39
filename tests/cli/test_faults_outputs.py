"""No command writes its output into a run's own files: a run's checkpoints folder (or anything inside it), a
checkpoint, or a run directory (except training, which writes runs). `tapecli.store.run.check_output` is the one
check; each command calls it before any work. Each case: exit 2, one `error:` line naming the option, the path and
the fix, no traceback, and the run unchanged (the shared run is read-only: `trained` fails the test run if it
changed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")

STEP = "checkpoints/step-00000002"
INSIDE = "{out} is inside the checkpoints of the run {run}, which hold only what its training saves; pass an --out " \
         "outside {run}/checkpoints"
CHECKPOINT = "{out} is a tape checkpoint; pass a new --out (a checkpoint holds only what its training saved)"
RUN = "{out} is a tape run directory, which only its training writes into; pass a new --out"
PASSKEY = ["eval", "passkey", "-m", "{run}", "--budgets", "40", "--trials", "1", "--device", "cpu"]

CASES = [
    (PASSKEY, "checkpoints", INSIDE),
    (PASSKEY, STEP, INSIDE),
    (PASSKEY, "", RUN),
    (["eval", "perplexity", "-m", "{run}", "--data", "{corpus}", "--device", "cpu"], "", RUN),
    (["analyze", "position-loss", "-m", "{run}", "--data", "{corpus}", "--seq-len", "16", "--device", "cpu"],
     f"{STEP}/mine", INSIDE),
    (["eval", "scrolls", "--model", "{run}", "--task", "qasper"], "", RUN),
    (["eval", "harness", "-m", "{run}", "--tasks", "lambada_openai"], "checkpoints", INSIDE),
    (["export", "-c", "{run}"], "checkpoints/hf", INSIDE),
    (["export", "-c", "{run}"], "", RUN),
    (["sweep", "--recipe", "selective-copy-smoke", "--pe", "rope"], "checkpoints", INSIDE),
    (["demo", "--task", "flip-flop"], "", RUN),
    (["bench", "--pe", "rope", "--seq-len", "8"], f"{STEP}/bench.json", INSIDE),
    (["bench", "--decode", "--pe", "rope"], "checkpoints/decode.json", INSIDE),
    (["pe", "new", "mine"], "checkpoints/mine.py", INSIDE),
    (["tokenizer", "train", "--data", "{corpus}", "--vocab-size", "300"], "checkpoints/tok.model", INSIDE),
    (["pretrain", "--recipe", "{recipe}"], "checkpoints", INSIDE),
    (["pretrain", "--recipe", "{recipe}"], STEP, INSIDE),
    (["finetune", "--checkpoint", "{run}", "--recipe", "{recipe}"], "checkpoints/ft", INSIDE),
]


@pytest.mark.parametrize(("args", "where", "line"), CASES,
                         ids=[f"{' '.join(a[:2])} {w or 'RUN'}" for a, w, _ in CASES])
def test_an_output_inside_a_run_is_refused_before_any_work(trained, shared_corpus: Path, args: list[str], where: str,
                                                            line: str) -> None:
    run = trained()
    out = run / where if where else run
    values = {"run": str(run), "corpus": str(shared_corpus), "recipe": trained.recipe(), "out": str(out)}
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    result = runner.invoke(app, [a.format(**values) for a in args] + ["--out", str(out)])
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
    assert one_line_error(result, 2) == "error: --out " + line.format(**values)
