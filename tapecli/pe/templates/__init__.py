"""The skeletons `tape pe new NAME` writes: each a working PE (`tape pe check` passes it as written, a test says
so), whose source is copied with the class renamed. `bias.py`: a logit bias of the distance; `rotary.py`: a
rotation of queries and keys by position, from scratch.

    source = template_source("bias", "MyBias")
"""

from __future__ import annotations

from importlib.resources import files

TEMPLATES = {"bias": "LinearBias", "rotary": "Rotary"}  # template -> the class name it defines


def template_source(kind: str, class_name: str) -> str:
    """The template's source with its class called `class_name`."""
    text = files(__package__).joinpath(f"{kind}.py").read_text(encoding="utf-8")
    return text.replace(TEMPLATES[kind], class_name)
