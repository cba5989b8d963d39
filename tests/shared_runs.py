"""Tiny runs trained once per test session and shared by every test that only reads them (tests/conftest.py's
`trained` fixture).

`trained()` trains the TINY recipe of train_helpers (2 layers, dim 32, byte tokenizer, seq_len 32) for 2 steps
(checkpoint step-00000002) on the session's `shared_corpus` the first time any test asks, in a temporary directory,
and returns the same run directory to every later caller; `trained("tiny", "model.pe=alibi")` does the same with
overrides, `trained("selective-copy-smoke", "train.max_steps=2")` for a shipped recipe (or a recipe file). Runs are
keyed by the resolved recipe, so two ways of asking for the same recipe share one run. Every run is trained on one
thread (as the CLI's subprocesses run), so its weights do not depend on which test asked first.

The runs are read-only: a test that writes into one (a resume, an evaluation with its default --out folder, a
damaged file) works on `trained.copy(tmp_path / "run", ...)`. At the end of the session every shared run is
compared with what it held when it was trained; a run that changed fails the session, naming the run.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from train_helpers import write_recipe

if TYPE_CHECKING:
    from tapecli.recipe import Recipe

# Shared runs that more than one test file uses: `trained(*ADDITION_RUN)`.
ADDITION_RUN = ("arithmetic-smoke", "train.max_steps=1", "train.save_every=1", "train.warmup=0", "data.max_digits=2",
                "data.seq_len=12")  # 1 step, problems of up to 2 digits


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under `folder` with the SHA-256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class TrainedRuns:
    """Runs keyed by their resolved recipe, trained on first use; see the module docstring."""

    def __init__(self, root: Path, corpus: Path) -> None:
        self.root, self.corpus = root, corpus
        self.runs: dict[str, Path] = {}
        self.fingerprints: dict[Path, dict[str, str]] = {}

    def __call__(self, recipe: str = "tiny", *overrides: str) -> Path:
        from tapecli.recipe import load_recipe

        resolved = load_recipe(self.recipe(recipe), list(overrides))
        key = resolved.to_yaml()  # two ways of asking for the same recipe share one run
        if key not in self.runs:
            self.runs[key] = self.keep(self._train(resolved, self.root / f"{len(self.runs):02d}-{recipe}"))
        return self.runs[key]

    def keep(self, folder: Path) -> Path:
        """Check at the end of the session that `folder` (another shared, read-only folder) is unchanged."""
        self.fingerprints[folder] = fingerprint(folder)
        return folder

    def copy(self, dest: Path, recipe: str = "tiny", *overrides: str) -> Path:
        """A private copy of the shared run at `dest` (for tests that write into a run)."""
        shutil.copytree(self(recipe, *overrides), dest, symlinks=True)
        return dest

    def recipe(self, recipe: str = "tiny") -> str:
        """What `--recipe` takes for `recipe`: for "tiny" the path of a file holding TINY with train.max_steps 2 and
        `shared_corpus` as its source, else `recipe` itself (a shipped name or a path)."""
        if recipe != "tiny":
            return recipe
        path = self.root / "tiny.yaml"
        if not path.exists():
            write_recipe(path, self.corpus, train={"max_steps": 2})
        return str(path)

    @staticmethod
    def _train(recipe: Recipe, out: Path) -> Path:
        import torch

        from tapecli.train.engine import pretrain

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return pretrain(recipe, out)
        finally:
            torch.set_num_threads(threads)

    def changed(self) -> list[str]:
        """The shared folders whose files differ from what they held when made."""
        return [str(run) for run, before in self.fingerprints.items() if fingerprint(run) != before]
