"""`tape pe check`: a conformance kit for a positional encoding (a built-in, an installed plugin or a file).

    outcomes = run_pe_check("kerple.py:Kerple", pe_args={}, device="auto", compile=False, keys=None)

`keys`: further model keys of the checked models (`tape pe check --sinks`: {"sinks": True}).

Builds tiny models with the PE (subject.py) and runs the checks (checks.py), one line each: its name, ok or FAILED,
and the number behind the verdict. Returns the outcomes; the command exits with 1 when one failed, after the PE's
row of `tape bench` (`tapecli.experiments.bench.pe_speed_rows`). `tape doctor` runs four of the same checks per PE
(DOCTOR_CHECKS).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from tapecli.pe.check.checks import CHECKS, CLAIMED, ON_REQUEST, Outcome, run_check
from tapecli.pe.check.subject import SIZE_TEXT, Subject

DOCTOR_CHECKS = ("dense", "kv-cache", "chunked-prefill", "finite")


def chosen_checks(subject: Subject, compile: bool) -> list[str]:
    """Every check that applies: `compile` only when asked, a claim only when the PE declares it."""
    from tapecli.model.pe import build_pe
    from tapecli.model.pe.base import CLAIMS

    claims = tuple(build_pe(subject.config()).claims)
    unknown = [c for c in claims if c not in CLAIMS]
    if unknown:
        from tapecli.errors import TapeError

        raise TapeError(f"the PE claims {unknown[0]!r}, which tape cannot check; known claims: {', '.join(CLAIMS)}")
    return [name for name in CHECKS
            if (name not in ON_REQUEST or compile) and (name not in CLAIMED or name in claims)]


def run_pe_check(pe: str, pe_args: dict[str, Any] | None = None, device: str = "auto", compile: bool = False,
                 compile_backend: str = "inductor", console: Console | None = None,
                 keys: dict[str, Any] | None = None) -> list[Outcome]:
    from tapecli.model.pe import resolve_pe
    from tapecli.model.pe.plugins import describe
    from tapecli.runtime import resolve_device

    console = console or Console()
    subject = Subject(pe, dict(pe_args or {}), resolve_device(device), compile_backend, dict(keys or {}))
    names = chosen_checks(subject, compile)  # builds the PE: a bad name or pe_args is one line here
    resolved = resolve_pe(pe)
    # Not "tape pe check ...": a line starting "tape " reads as a command line in the docs.
    extras = "".join(f", model.{key}={value}" for key, value in subject.keys.items())
    console.print(f"PE {resolved.name} ({describe(resolved.record)}): {SIZE_TEXT}{extras}, on {subject.device}; exact "
                  f"checks in {str(subject.exact_dtype).removeprefix('torch.')}", markup=False, highlight=False,
                  soft_wrap=True)
    outcomes = []
    for name in names:
        start = time.perf_counter()
        outcome = run_check(name, subject)
        outcomes.append(outcome)
        mark = "ok" if outcome.ok else "FAILED"
        console.print(f"  {name:<22} {mark:<7} {outcome.text}  ({time.perf_counter() - start:.1f} s)",
                      markup=False, highlight=False, soft_wrap=True, style=None if outcome.ok else "red")
    failed = [o.name for o in outcomes if not o.ok]
    console.print(f"all {len(outcomes)} checks passed" if not failed else f"failed: {', '.join(failed)}",
                  markup=False, highlight=False, style=None if not failed else "red")
    return outcomes


__all__ = ["CHECKS", "DOCTOR_CHECKS", "Outcome", "Subject", "run_check", "run_pe_check"]
