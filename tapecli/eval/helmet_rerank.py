"""HELMET's re-ranking metric (princeton-nlp/HELMET utils.py): the ranking parsed from the output and NDCG@10.

- `parse_rankings(output)`: utils.py's parser: brackets, colons and "id" removed, the longest run of integers joined by
  ">" taken as the ranking, each id scored len(ranking) - position (a repeated id keeps its first score); without
  any integer, the whole output is the one "id" (scoring nothing);
- `ndcg_at_10(ranking, labels)`: utils.py's `calculate_retrieval_metrics` for one query: trec_eval's ndcg_cut_10,
  through pytrec_eval (the library HELMET and BEIR use), rounded to 5 decimals as it rounds its mean.
"""

from __future__ import annotations

import re


def parse_rankings(output: str) -> dict[str, int]:
    """utils.py's parse_rankings."""
    output = re.sub(r"[\[\]:]", "", output)
    output = output.lower().replace("id", "")
    longest = ""
    for match in re.finditer(r"(\d+)(?:\s*>\s*(\d+))*", output):
        if len(match.group(0)) > len(longest):
            longest = match.group(0)
    if longest:
        rankings = [num.strip() for num in longest.split(">") if num.strip().isdigit()]
    else:
        rankings = [output]
    results: dict[str, int] = {}
    for i, rank in enumerate(rankings):
        if rank not in results:
            results[rank] = len(rankings) - i
    return results


def ndcg_at_10(ranking: dict[str, int], labels: dict[str, int], qid: str = "q") -> float:
    """NDCG@10 of one query's parsed ranking against its passages' relevance labels (trec_eval's ndcg_cut_10)."""
    import pytrec_eval

    evaluator = pytrec_eval.RelevanceEvaluator({qid: labels}, {"ndcg_cut.10"})
    scores = evaluator.evaluate({qid: ranking})
    return round(sum(s["ndcg_cut_10"] for s in scores.values()) / len(scores), 5) if scores else 0.0
