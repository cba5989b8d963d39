"""Interrupt a tape command at a chosen point: `python tests/interrupt_helpers.py SPEC` runs `tape ARGS` with one
function wrapped so that, right after its N-th call returns, the process sends itself a signal (SIGKILL, SIGTERM or
SIGINT, i.e. Ctrl-C). The point is deterministic (after the first samples row, the first checkpoint...), where a
timer would race the command on a loaded machine. Also a torchrun script: every worker arms the same hook.

SPEC is JSON: {"args": [...], "hook": "module:attr.path", "after": N, "signal": number, "setup": "python code"}.
`setup` runs first (e.g. shrinking a demo budget); the hook is looked up after it. Tests build the command line with
`argv(...)` (put `sys.executable`, or torchrun's, before it).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
from typing import Any


def argv(args: list[str], hook: str, signal_number: int, after: int = 1, setup: str = "") -> list[str]:
    """[this script, SPEC]: what runs `tape ARGS` and sends `signal_number` right after the `after`-th call of
    `hook`."""
    spec = {"args": args, "hook": hook, "after": after, "signal": int(signal_number), "setup": setup}
    return [os.path.abspath(__file__), json.dumps(spec)]


def arm(hook: str, after: int, signal_number: int) -> None:
    """Wrap `module:attr.path` so that its `after`-th call, once returned, sends `signal_number` to this process."""
    module_name, _, path = hook.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    original, calls = getattr(owner, name), [0]

    def hooked(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == after:
            os.kill(os.getpid(), signal_number)
        return result

    setattr(owner, name, hooked)


def main(spec: dict[str, Any]) -> None:
    exec(spec.get("setup") or "", {})  # noqa: S102 -- test-controlled code
    arm(spec["hook"], spec["after"], spec["signal"])
    sys.argv = ["tape", *spec["args"]]
    runpy.run_module("tapecli.cli", run_name="__main__")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
