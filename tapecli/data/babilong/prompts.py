"""BABILong's prompts for qa1-qa5, verbatim from booydar/babilong (`babilong/prompts.py` at main: `DEFAULT_TEMPLATE`,
`DEFAULT_PROMPTS`, `get_formatted_input`), and the three prompt styles tape offers.

    {instruction}\\n\\n{examples}\\n\\n{post_prompt}\\n\\n<context>\\n{context}\\n</context>\\n\\nQuestion: {question}

with the context stripped and the whole stripped (`get_formatted_input`). The official runner
(`scripts/run_model_on_babilong.py`) fills the instruction, the few-shot examples and the post-prompt each only when
asked (`--use_instruction`, `--use_examples`, `--use_post_prompt`; an unused part is ""). tape's `--prompt`:

- `full`: all three (BABILong's setting for instruction-tuned models: "instruction_yes_examples_yes_post_prompt_yes");
- `no-examples`: the instruction and the post-prompt, without the few-shot examples;
- `bare`: none of them ("instruction_no_examples_no_post_prompt_no", BABILong's setting for base models): the prompt
  is "<context>\\n...\\n</context>\\n\\nQuestion: ...".

The strings keep their originals' quirks (qa2's missing space after "a question.", qa1's "Judith come back", the
typographic quotes of qa1's and qa2's post-prompts).
"""

from __future__ import annotations

from tapecli.errors import TapeError

TASK_TEMPLATE = "{instruction}\n\n{examples}\n\n{post_prompt}"
USER_TEMPLATE = "<context>\n{context}\n</context>\n\nQuestion: {question}"
DEFAULT_TEMPLATE = f"{TASK_TEMPLATE}\n\n{USER_TEMPLATE}"
STYLES = ("full", "no-examples", "bare")

DEFAULT_PROMPTS = {
    "qa1": {
        "instruction":
            "I will give you context with the facts about positions of different persons hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts. "
            "If a person was in different locations, use the latest location to answer the question.",
        "examples":
            "<example>\n"
            "Charlie went to the hallway. Judith come back to the kitchen. Charlie travelled to balcony. "
            "Where is Charlie?\n"
            "Answer: The most recent location of Charlie is balcony.\n"
            "</example>\n\n"
            "<example>\n"
            "Alan moved to the garage. Charlie went to the beach. Alan went to the shop. Rouse "
            "travelled to balcony. Where is Alan?\n"
            "Answer: The most recent location of Alan is shop.\n"
            "</example>",
        "post_prompt":
            "Always return your answer in the following format: "
            "The most recent location of \u2019person\u2019 is \u2019location\u2019. Do not write anything else after "
            "that.",
    },
    "qa2": {
        "instruction":
            "I give you context with the facts about locations and actions of different persons "
            "hidden in some random text and a question."
            "You need to answer the question based only on the information from the facts.\n"
            "If a person got an item in the first location and travelled to the second location "
            "the item is also in the second location. "
            "If a person dropped an item in the first location and moved to the second location "
            "the item remains in the first location.",
        "examples":
            "<example>\n"
            "Charlie went to the kitchen. Charlie got a bottle. Charlie moved to the balcony. "
            "Where is the bottle?\n"
            "Answer: The bottle is in the balcony.\n"
            "</example>\n"
            "<example>\n"
            "Alan moved to the garage. Alan got a screw driver. Alan moved to the kitchen. Where "
            "is the screw driver?\n"
            "Answer: The screw driver is in the kitchen.\n"
            "</example>",
        "post_prompt":
            "Always return your answer in the following format: The \u2019item\u2019 is in \u2019location\u2019. "
            "Do not write anything else after that.",
    },
    "qa3": {
        "instruction":
            "I give you context with the facts about locations and actions of different persons "
            "hidden in some random text and a question. "
            "You need to answer the question based only on the information from the facts.\n"
            "If a person got an item in the first location and travelled to the second location "
            "the item is also in the second location. "
            "If a person dropped an item in the first location and moved to the second location "
            "the item remains in the first location.",
        "examples":
            "<example>\n"
            "John journeyed to the bedroom. Mary grabbed the apple. Mary went back to the bathroom. "
            "Daniel journeyed to the bedroom. Daniel moved to the garden. Mary travelled to the kitchen. "
            "Where was the apple before the kitchen?\n"
            "Answer: Before the kitchen the apple was in the bathroom.\n"
            "</example>\n"
            "<example>\n"
            "John went back to the bedroom. John went back to the garden. John went back to the kitchen. "
            "Sandra took the football. Sandra travelled to the garden. Sandra journeyed to the bedroom. "
            "Where was the football before the bedroom?\n"
            "Answer: Before the bedroom the football was in the garden.\n"
            "</example>",
        "post_prompt":
            "Always return your answer in the following format: "
            "Before the $location_1$ the $item$ was in the $location_2$. Do not write anything else after that.",
    },
    "qa4": {
        "instruction":
            "I will give you context with the facts about different people, their location and actions, hidden in "
            "some random text and a question. "
            "You need to answer the question based only on the information from the facts.",
        "examples":
            "<example>\n"
            "The hallway is south of the kitchen. The bedroom is north of the kitchen. "
            "What is the kitchen south of?\n"
            "Answer: bedroom\n"
            "</example>\n"
            "<example>\n"
            "The garden is west of the bedroom. The bedroom is west of the kitchen. What is west of the bedroom?\n"
            "Answer: garden\n"
            "</example>",
        "post_prompt":
            "Your answer should contain only one word - location. Do not write anything else after that.",
    },
    "qa5": {
        "instruction":
            "I will give you context with the facts about locations and their relations hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts.",
        "examples":
            "<example>\n"
            "Mary picked up the apple there. Mary gave the apple to Fred. Mary moved to the bedroom. "
            "Bill took the milk there. Who did Mary give the apple to?\n"
            "Answer: Fred\n"
            "</example>\n"
            "<example>\n"
            "Jeff took the football there. Jeff passed the football to Fred. Jeff got the milk there. "
            "Bill travelled to the bedroom. Who gave the football?\n"
            "Answer: Jeff\n"
            "</example>\n"
            "<example>\n"
            "Fred picked up the apple there. Fred handed the apple to Bill. Bill journeyed to the bedroom. "
            "Jeff went back to the garden. What did Fred give to Bill?\n"
            "Answer: apple\n"
            "</example>",
        "post_prompt":
            "Your answer should contain only one word. Do not write anything else after that. "
            "Do not explain your answer.",
    },
}


def get_formatted_input(context: str, question: str, examples: str, instruction: str, post_prompt: str,
                        template: str = DEFAULT_TEMPLATE) -> str:
    """BABILong's `get_formatted_input`."""
    return template.format(instruction=instruction, examples=examples, post_prompt=post_prompt,
                           context=context.strip(), question=question).strip()


def prompt_parts(task: str, style: str) -> dict[str, str]:
    """{instruction, examples, post_prompt} of `task` under a prompt style (see the module docstring)."""
    if style not in STYLES:
        raise TapeError(f"--prompt: expected one of {', '.join(STYLES)}, got {style!r}")
    parts = DEFAULT_PROMPTS[task]
    use = {"full": ("instruction", "examples", "post_prompt"), "no-examples": ("instruction", "post_prompt"),
           "bare": ()}[style]
    return {k: parts[k] if k in use else "" for k in ("instruction", "examples", "post_prompt")}


def format_prompt(task: str, style: str, context: str, question: str) -> str:
    """The text the model reads (before its tokenizer's special tokens)."""
    return get_formatted_input(context, question, **prompt_parts(task, style))
