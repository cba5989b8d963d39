"""The run directory's rules: where a checkpoint's run is, and where `tape eval` writes by default."""

from __future__ import annotations

from pathlib import Path

from tapecli.store.run import eval_dir, run_of, safe_name


def test_default_evaluation_folders(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000004"
    assert run_of(checkpoint) == tmp_path / "run" and run_of(tmp_path / "lone") is None
    assert eval_dir("passkey", "tape", str(checkpoint)) == tmp_path / "run" / "eval-passkey" / "step-00000004"
    assert eval_dir("scrolls", "tape", str(checkpoint), per_checkpoint=False) == tmp_path / "run" / "eval-scrolls"
    assert eval_dir("passkey", "tape", str(tmp_path / "lone")) == tmp_path / "lone" / "eval-passkey"
    (tmp_path / "my llama").mkdir()
    assert eval_dir("harness", "hf", str(tmp_path / "my llama")) == Path("eval-harness") / "my_llama"
    assert eval_dir("harness", "hf", "HuggingFaceTB/SmolLM2-135M") == Path("eval-harness/HuggingFaceTB_SmolLM2-135M")
    assert safe_name("a/b c{task}") == "a_b_c_task_"
