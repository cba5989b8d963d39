"""What tape says about itself holds: the docs (README.md, docs/**/*.md), CHANGELOG.md, the command-line help and the
package's docstrings are read for mistakes a merge or a hurried edit leaves behind. Each check is a function of text
that returns what it found; the first tests feed each one a bad sample (so every check is seen to fail), the others
run it on the real files. Seconds in all: nothing is built or run.

- unfinished: a line that is only a placeholder word (MEASUREMENT, TODO, TBD, ...), or a promise of later
  figures ("at the time of writing", "added here ... when they finish", "will be added");
- repeated: a CHANGELOG bullet given twice; a prose line (not a table row, heading or code) twice within one page;
- internal: a tracker's issue number ("issue 12", "#35"), or a file the repository does not ship (`method.md`);
- stale PE lists: a count of the built-in PEs ("the ten built-in PEs") or a list of eight or more PE names that is
  not the registry's (tapecli.model.pe.registry.BUILTINS);
- unsourced results: a results page (docs/results/) that names no commit ("commit 1a2b3c4") or no hardware;
- dead pointers: a `docs/....md` named in the package, a shipped recipe or a script that the repository lacks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CHANGELOG = ROOT / "CHANGELOG.md"
SOURCES = sorted((ROOT / "tapecli").rglob("*.py"))

_FENCE = re.compile(r"^\s*(```+|~~~+)")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opening = _FENCE.match(line)
        if opening and (fence is None or line.strip().startswith(fence)):
            fence = opening.group(1) if fence is None else None
        elif fence is None:
            found.append((number, line))
    return found


# ---------------------------------------------------------------------------------------------------------------
# The checks: each returns "line: what" strings, empty when the text is fine.

_PLACEHOLDER_LINE = re.compile(r"^\s*(MEASUREMENT|MEASUREMENTS|TODO|TBD|FIXME|XXX|PLACEHOLDER|RESULTS?|TABLE)\s*:?\s*$")
_PLACEHOLDER_WORD = re.compile(r"\b(TODO|TBD|FIXME)\b")
_PROMISE = re.compile(r"at the time of writing|when (they|it) finish(es)?\b|"
                      r"(will be|are|is) added (here )?(later|when)|added here\b.*\bwhen\b|\bcoming soon\b|"
                      r"\bnot (yet )?re-run since\b", re.IGNORECASE)


def unfinished(text: str) -> list[str]:
    found = []
    for number, line in prose_lines(text):
        if _PLACEHOLDER_LINE.match(line) or _PLACEHOLDER_WORD.search(line) or _PROMISE.search(line):
            found.append(f"{number}: {line.strip()}")
    return found


def repeated_bullets(text: str) -> list[str]:
    """Bullets ("- ...", with their continuation lines) that appear twice, anywhere in the file."""
    bullets: list[tuple[int, list[str]]] = []
    for number, line in prose_lines(text):
        if re.match(r"^\s*[-*] ", line):
            bullets.append((number, [line.strip()]))
        elif bullets and line.startswith("  ") and line.strip():
            bullets[-1][1].append(line.strip())
        elif not line.strip() or line.startswith("#"):
            bullets.append((number, []))  # a break: the next indented line belongs to no bullet
    return _repeats((number, " ".join(lines)) for number, lines in bullets if len(" ".join(lines)) >= 20)


def _repeats(items) -> list[str]:
    """"line: repeats line N: text" for each (line number, text) whose text (spaces normalised) came before."""
    seen: dict[str, int] = {}
    found = []
    for number, text in items:
        key = " ".join(text.split())
        if key in seen:
            found.append(f"{number}: repeats line {seen[key]}: {key[:80]}")
        else:
            seen[key] = number
    return found


def repeated_prose(text: str) -> list[str]:
    """A prose line (40 characters or more; not a table row, heading, link definition or bullet-less fragment of
    punctuation) that appears twice within one page."""
    return _repeats((number, line) for number, line in prose_lines(text)
                    if len(line.strip()) >= 40 and not line.strip().startswith(("|", "#", "[", "<")))


_ISSUE = re.compile(r"\bissues? (#\s?)?\d+\b|(?<![\w&/#`])(?<!PR )#\d{1,4}\b|\bthe issue('s)?\b(?! of\b)|"
                    r"\bdesign card\b|\bthe project's goals?\b|\bSIGSTOP\b.*\bpaused\b|\bpaused with SIGSTOP\b|"
                    r"\bseparate worktree\b|\bits call's time limit\b|\bcould not be reproduced here\b", re.IGNORECASE)
_NOT_SHIPPED = ("method.md", "paper-results.md", "anchors.md", "environment.md", "protocols.md", "shared/", "notes/")


def internal(text: str) -> list[str]:
    """Words about things a reader cannot see: a tracker's issue numbers, files of the project's own notes, how the
    development machine was handled."""
    found = []
    for number, line in prose_lines(text):
        hit = _ISSUE.search(line)
        if hit:
            found.append(f"{number}: {hit.group(0)!r}: {line.strip()[:100]}")
        for name in _NOT_SHIPPED:
            if re.search(rf"(?<![\w/.-]){re.escape(name)}", line) and not (ROOT / name).exists():
                found.append(f"{number}: names {name}, which the repository does not ship: {line.strip()[:100]}")
    return found


def _builtins() -> tuple[str, ...]:
    from tapecli.model.pe import BUILTINS

    return tuple(BUILTINS)


def _aliases() -> dict[str, str]:
    """Every way the docs write a built-in PE (lower case) -> its registry name."""
    from tapecli.model.pe import BUILTINS

    names = {}
    for name, cls in BUILTINS.items():
        names[name] = names[cls.__name__.lower()] = name
        names[name.replace("-", "_")] = names[name.replace("-", " ")] = name  # clipped_rope (a file), clipped RoPE
    names.update({"t5 bias": "t5", "stick-breaking": "stickbreaking", "randomized pe": "randpe",
                  "randomised pe": "randpe"})
    return names


_NUMBERS = {"six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
            "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19,
            "twenty": 20}
_COUNT = re.compile(r"\b(?:the|all|its|tape's|our)\s+(\d+|" + "|".join(_NUMBERS) + r")\s+(built-in\s+)?"
                    r"(PEs|positional encodings)\b", re.IGNORECASE)


def stale_pe_lists(text: str) -> list[str]:
    """A count of the built-in PEs, or a list of 8 or more PE names in a paragraph that does not name every one of
    the registry's (a paragraph may name them in several lists). Fenced code is left out: a command names the PEs
    it runs, and a verbatim output is what its commit printed."""
    builtins, aliases = _builtins(), _aliases()
    text = re.sub(r"^(`{3,}|~{3,}).*?^\1", "", text, flags=re.DOTALL | re.MULTILINE)
    name = "|".join(sorted((re.escape(a) for a in aliases), key=len, reverse=True))
    item = rf"[`*]{{0,2}}(?:{name})[`*]{{0,2}}"
    listing = re.compile(rf"(?<![\w-]){item}(?:(?:\s*[,/]\s*|\s*,?\s+and\s+|\s*,?\s+or\s+){item}){{7,}}(?![\w-])",
                         re.IGNORECASE)
    found = []
    for paragraph in re.split(r"\n\s*\n", text):
        flat = " ".join(paragraph.split())
        for hit in _COUNT.finditer(flat):
            count = hit.group(1).lower()
            if int(_NUMBERS.get(count, count) if not count.isdigit() else count) != len(builtins):
                found.append(f"counts {hit.group(0)!r}; the registry has {len(builtins)}")
        hit = listing.search(flat)
        if hit:
            named = {aliases[re.sub(r"[`*]", "", word).lower()] for word in
                     re.findall(rf"(?<![\w-])({item})(?![\w-])", flat, flags=re.IGNORECASE)}
            missing = [n for n in builtins if n not in named]
            if missing:
                found.append(f"lists {hit.group(0)[:80]!r}: missing {', '.join(missing)}")
    return found


_COMMIT = re.compile(r"\bcommits? [0-9a-f]{7,40}\b")
_HARDWARE = re.compile(r"\b\d+-core x86 CPU\b|\bH100\b|\bH200\b|\bA100\b")


def unsourced(text: str) -> list[str]:
    """A results page must say at which commit and on which hardware its figures were measured."""
    flat = " ".join(text.split())
    return ([] if _COMMIT.search(flat) else ["names no commit (`commit 1a2b3c4`)"]) + \
        ([] if _HARDWARE.search(flat) else ["names no hardware (e.g. `a 2-core x86 CPU (24 GB)`)"])


# ---------------------------------------------------------------------------------------------------------------
# Each check fails on a bad sample.

BAD = {
    unfinished: ["Measured on a 2-core CPU:\n\nMEASUREMENT\n", "The tables are added here when they finish.",
                 "At the time of writing the run was at step 10."],
    repeated_bullets: ["### Added\n- `tape bench` times a training step per PE.\n\n### Fixed\n"
                       "- `tape bench` times a training step per PE.\n"],
    repeated_prose: ["The grid models were trained on an H100 in fp32.\n\nSomething else.\n\n"
                     "The grid models were trained on an H100 in fp32.\n"],
    internal: ["See issue 12 for the details.", "Fixed in #35.", "The exact math is in method.md.",
               "Issue 20's example", "The issue's setting", "as the design card says"],
    unsourced: ["RoPE 0.48, TAPE 0.88, measured on the CPU.", "Measured at commit 1a2b3c4 on the shared machine."],
    stale_pe_lists: ["The ten built-in PEs use this API.",
                     "Train and evaluate positional encodings (RoPE, ALiBi, FIRE, xPos, NoPE, RandPE, T5 bias, TAPE, "
                     "CoPE, PaTH).",
                     "1. a built-in name: `nope`, `rope`, `randpe`, `alibi`, `fire`, `xpos`, `t5`, `tape`, `cope`, "
                     "`path`;",
                     "RoPE, ALiBi, FIRE, xPos, NoPE, randomized PE, T5 bias, **TAPE** (Zhu et al.) and two more"],
}
GOOD = {
    unfinished: "Measured on a 2-core CPU: 1.2 s.\n```\nTODO inside a code block is code\n```\n",
    repeated_bullets: "### Added\n- one thing that was added\n- another thing that was added\n",
    repeated_prose: "| a | table row that repeats itself often |\n| a | table row that repeats itself often |\n",
    internal: "See [the anchor](speed.md#gpu) and issue tracking of your own; the issue of long contexts.",
    stale_pe_lists: "Compare RoPE, ALiBi, FIRE and TAPE.",
    unsourced: "What `tape demo` printed at commit\n448441d on a 2-core x86 CPU (24 GB):",
}


@pytest.mark.parametrize("check, sample", [(c, s) for c, samples in BAD.items() for s in samples],
                         ids=lambda v: getattr(v, "__name__", "")[:40] or None)
def test_each_check_finds_its_mistake(check, sample):
    assert check(sample), f"{check.__name__} missed: {sample!r}"


@pytest.mark.parametrize("check", list(GOOD), ids=lambda c: c.__name__)
def test_each_check_passes_good_text(check):
    assert check(GOOD[check]) == []


def test_a_full_registry_list_passes():
    assert stale_pe_lists("Built in: " + ", ".join(f"`{n}`" for n in _builtins()) + ".") == []
    assert stale_pe_lists(f"All {len(_builtins())} built-in PEs.") == []


# ---------------------------------------------------------------------------------------------------------------
# The real files.


def _report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{where}:{line}" for where, lines in found.items() for line in lines)


def _pages_found(check) -> dict[str, list[str]]:
    found = {str(p.relative_to(ROOT)): check(p.read_text(encoding="utf-8")) for p in PAGES}
    return {where: lines for where, lines in found.items() if lines}


@pytest.mark.parametrize("check", [unfinished, repeated_prose, internal, stale_pe_lists], ids=lambda c: c.__name__)
def test_the_docs(check):
    found = _pages_found(check)
    assert not found, _report(found)


# A page that reports no measurement of its own: the index, and a test's assertions.
NOT_MEASURED = {"index.md", "harness-equivalence.md"}


def test_every_results_page_names_its_commit_and_hardware():
    found = {str(p.relative_to(ROOT)): unsourced(p.read_text(encoding="utf-8"))
             for p in sorted((ROOT / "docs" / "results").glob("*.md")) if p.name not in NOT_MEASURED}
    found = {where: lines for where, lines in found.items() if lines}
    assert not found, _report(found)


def test_the_changelog():
    text = CHANGELOG.read_text(encoding="utf-8")
    found = {"CHANGELOG.md": repeated_bullets(text) + internal(text) + unfinished(text)}
    assert not found["CHANGELOG.md"], _report(found)


def test_docstrings_and_help_name_the_registry_s_pes():
    from cli_helpers import command_tree

    from tapecli.cli import app

    found = {str(p.relative_to(ROOT)): stale_pe_lists(p.read_text(encoding="utf-8")) for p in SOURCES}
    helps = []

    def walk(command, path):
        helps.append((path, command.help or ""))
        helps.extend((f"{path} {param.opts[0] if getattr(param, 'opts', None) else param.name}",
                      getattr(param, "help", None) or "") for param in command.params)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(command_tree(app), "tape")
    found.update({f"help of {path}": stale_pe_lists(text) for path, text in helps})
    found = {where: lines for where, lines in found.items() if lines}
    assert not found, _report(found)


def test_the_pe_names_of_the_help_are_the_registry_s():
    """`tape --help` and the defaults of `tape bench --pe` / `tape doctor --pe` read the registry's source without
    importing torch (tapecli.cli.pe_names): what they read is BUILTINS."""
    from tapecli.cli import app
    from tapecli.cli.pe_names import builtin_pes

    assert builtin_pes() == _builtins()
    assert ", ".join(_builtins()) in app.info.help


def test_the_code_and_recipes_point_only_at_pages_that_exist():
    """A `docs/....md` named in the package, the shipped recipes or the scripts is a page the repository ships."""
    files = [*SOURCES, *sorted((ROOT / "recipes").glob("*.yaml")), *sorted((ROOT / "scripts").glob("*"))]
    missing = [f"{path.relative_to(ROOT)}: {page}" for path in files if path.is_file()
               for page in re.findall(r"\bdocs/[\w/.-]+\.md\b", path.read_text(encoding="utf-8"))
               if not (ROOT / page).is_file()]
    assert not missing, "\n".join(missing)
