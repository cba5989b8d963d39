"""BABILong's metric, as booydar/babilong's `babilong/metrics.py` (main) scores an answer.

`compare_answers(target, output, question, task_labels)`: the output is lower-cased and cut at its first ".", then at
"<context>" and "<example>" (and at "Question", which can never match after lower-casing: the original's no-op,
kept); the task's labels (`TASK_LABELS`: the six locations for qa1-qa4; the actors and objects for qa5) found in the
output, less those the question names, must be exactly the target. So "The most recent location of Mary is kitchen"
scores for the target kitchen, "kitchen or garden" does not. A task's accuracy is the share of its samples that
score.
"""

from __future__ import annotations

TASK_LABELS = {
    "qa1": {"bathroom", "bedroom", "garden", "hallway", "kitchen", "office"},
    "qa2": {"bathroom", "bedroom", "garden", "hallway", "kitchen", "office"},
    "qa3": {"bathroom", "bedroom", "garden", "hallway", "kitchen", "office"},
    "qa4": {"bathroom", "bedroom", "garden", "hallway", "kitchen", "office"},
    "qa5": {"Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"},
}


def preprocess_output(output: str) -> str:
    output = output.lower()
    output = output.split(".")[0]  # the first sentence
    output = output.split("<context>")[0]  # a model that goes on writing examples
    output = output.split("<example>")[0]
    output = output.split("Question")[0]
    return output


def compare_answers(target: str, output: str, question: str, task_labels: set[str]) -> bool:
    output = preprocess_output(output)
    target = target.lower()
    labels = {label.lower() for label in task_labels}
    in_question = {label for label in labels if label in question.lower()}
    in_output = {label for label in labels if label in output} - in_question
    return target in in_output and len(in_output) == 1
