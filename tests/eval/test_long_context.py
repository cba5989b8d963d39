"""The long-context reporting every length-based evaluation shares (`tapecli.eval.long_context`): RULER's and NoLiMa's
effective lengths and LongScore, each against numbers worked out by hand."""

from __future__ import annotations

import pytest

from tapecli.errors import TapeError
from tapecli.eval.long_context import (
    check_base_lengths,
    effective_length,
    headline,
    length_summary,
    long_score,
    relative_effective_length,
    table,
)

SCORES = {0: 100.0, 1024: 90.0, 2048: 86.0, 4096: 85.6, 8192: 40.0}


def test_ruler_and_nolima_effective_lengths():
    assert effective_length(SCORES, 85.6) == 2048  # 85.6 does not exceed 85.6
    assert effective_length({1024: 80.0, 2048: 95.0}, 85.6) is None  # the shortest fails: none, even if 2048 passes
    # NoLiMa: at least 85 % of the base score; base 100 -> 85.0, so 85.6 at 4096 passes.
    assert relative_effective_length(SCORES, 100.0) == 4096
    assert relative_effective_length({512: 50.0, 1024: 42.5, 2048: 42.4}, 50.0) == 1024  # 42.5 = 0.85 x 50
    assert relative_effective_length({512: 0.0, 1024: 0.0}, 0.0) is None  # no ability to keep


def test_long_score_is_the_mean_relative_change_beyond_the_base():
    # Base = mean(S_0, S_1024) = 95; LC = 100 (S - 95) / 95 at 2048, 4096, 8192: -9.47, -9.89, -57.89.
    score, per_length = long_score(SCORES, [0, 1024])
    assert per_length == {2048: -9.47, 4096: -9.89, 8192: -57.89}
    assert score == round((-900 / 95 - 940 / 95 - 5500 / 95) / 3, 2) == -25.75
    assert long_score({1024: 0.0, 2048: 10.0}, [1024]) == (None, {})  # base 0
    summary = length_summary(SCORES, 85.6, [0])  # (-10 - 14 - 14.4 - 60) / 4 = -24.6
    assert summary == {"effective_length": 2048, "threshold": 85.6, "base_lengths": [0], "base_score": 100.0,
                       "nolima_threshold": 85.0, "effective_length_nolima": 4096, "long_score": -24.6,
                       "long_scores": {"1024": -10.0, "2048": -14.0, "4096": -14.4, "8192": -60.0}}
    assert headline("m", summary) == ("m: effective length 2048 (threshold 85.6); 4096 at 85% of its base score "
                                      "100.0; LongScore -24.6")


def test_base_lengths_and_the_table():
    assert check_base_lengths(None, [1024, 0, 2048]) == [0]
    assert check_base_lengths([2048, 1024], [1024, 2048]) == [1024, 2048]
    with pytest.raises(TapeError, match=r"^--base-lengths: 512 is not among the lengths evaluated \(1024, 2048\)$"):
        check_base_lengths([512], [1024, 2048])
    assert table({"qa1": {"0": 100.0, "1024": 50.0}}, [0, 1024]) == ("| task | 0 | 1024 |\n| --- | --- | --- |\n"
                                                                     "| qa1 | 100.0 | 50.0 |")
