"""Shared by the CLI fault tests: what a one-line error looks like."""

from __future__ import annotations


def one_line_error(result, code: int, *fragments: str) -> str:
    """The command failed with `code` and printed exactly one `error:` line holding every fragment."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, Exception), result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
