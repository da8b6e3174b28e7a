"""Render docs/options.md from the options models' field docstrings.

Run ``python scripts/options_doc.py > docs/options.md``; a test checks it is current.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel

from atomtrain.options import Options


def _submodel(annotation) -> type[BaseModel] | None:
    candidates = [annotation, *typing.get_args(annotation)]
    for candidate in candidates:
        for inner in [candidate, *typing.get_args(candidate)]:
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                return inner
    return None


def _type_name(annotation) -> str:
    text = str(annotation).replace("typing.", "").replace("atomtrain.options.", "")
    text = text.replace("<class '", "").replace("'>", "")
    return text


def _render(model: type[BaseModel], prefix: str, lines: list[str]) -> None:
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        default = "required" if field.is_required() else repr(field.get_default())
        if _submodel(field.annotation) is not None and not field.is_required():
            default = "see below"
        description = " ".join((field.description or "").split())
        lines.append(f"| `{key}` | {description} | `{default}` |")
        sub = _submodel(field.annotation)
        if sub is not None and sub is not model:
            _render(sub, f"{key}.", lines)


def render() -> str:
    lines = [
        "# Options reference",
        "",
        "Generated from the field docstrings of `atomtrain.options` by "
        "`python scripts/options_doc.py > docs/options.md`.",
        "",
        "| key | meaning | default |",
        "|---|---|---|",
    ]
    _render(Options, "", lines)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
