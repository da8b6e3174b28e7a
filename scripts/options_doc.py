"""Render docs/options.md from the options models' field docstrings.

Run ``python scripts/options_doc.py > docs/options.md``; a test checks it is current.
"""

from __future__ import annotations

from pydantic import BaseModel

from atomtrain.models import registry
from atomtrain.options import SECTIONS, ArchitectureCommon, Options, nested_model
from atomtrain.options_base import field_docstrings


def _render(model: type[BaseModel], prefix: str, lines: list[str]) -> None:
    descriptions = field_docstrings(model)
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        description = " ".join(descriptions[name].split())
        if key == "architecture":  # a section per architecture, in tables of their own
            lines.append(f"| `{key}` | {description} | see below |")
            _render(ArchitectureCommon, f"{key}.", lines)
            continue
        default = "required" if field.is_required() else repr(field.get_default())
        if nested_model(field.annotation) is not None and not field.is_required():
            default = "see below"
        lines.append(f"| `{key}` | {description} | `{default}` |")
        sub = nested_model(field.annotation)
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
    for name, section in SECTIONS.items():
        lines += [
            "",
            f"## `architecture.model` of `architecture.name: {name}`",
            "",
            "| key | meaning | default |",
            "|---|---|---|",
        ]
        _render(
            nested_model(section.model_fields["model"].annotation), "architecture.model.", lines
        )
        defaults = registry.training_defaults(name)
        if defaults:
            lines += [
                "",
                f"Training defaults of `{name}` (metatrain's for it), where the training "
                "section leaves them unset:",
                "",
                "| key | default |",
                "|---|---|",
            ]
            lines += [f"| `architecture.training.{k}` | `{v!r}` |" for k, v in defaults.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
