"""What every options section is built from: strict pydantic models whose field
docstrings are the reference docs, and metatrain keys accepted at their defaults only.
Architecture packages define their model sections with these."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class Strict(BaseModel):
    # Field docstrings are read when the docs are rendered (field_docstrings), not at
    # import: pydantic's use_attribute_docstrings walks every frame against every loaded
    # module on Python < 3.13, 0.12 s of each command's start.
    model_config = ConfigDict(extra="forbid")


def field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Each field's description: ``Field(description=...)``, else the docstring under
    the field in its class's source (a base class's for an inherited field)."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if issubclass(cls, BaseModel) and cls is not BaseModel:
            found.update(_docstrings_in_source(cls))
    return {
        name: field.description or found.get(name, "") for name, field in model.model_fields.items()
    }


@functools.cache
def _docstrings_in_source(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # a class made by create_model has no source
        return {}
    (definition,) = ast.parse(source).body
    assert isinstance(definition, ast.ClassDef)
    body = definition.body
    docstrings = {}
    for statement, following in zip(body, body[1:]):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docstrings[statement.target.id] = inspect.cleandoc(following.value.value)
    return docstrings


def default_only(reasons: dict[str, str]) -> Any:
    """A validator for metatrain keys of features atomtrain lacks ({field: what is
    missing}): each is accepted at its default value only."""

    def check(cls, value: Any, info: ValidationInfo) -> Any:
        if value != cls.model_fields[info.field_name].default:
            reason = reasons[str(info.field_name)]
            raise ValueError(f"{reason} in atomtrain; remove the key or use its default")
        return value

    return field_validator(*reasons)(classmethod(check))  # type: ignore[arg-type]


class LongRangeOptions(Strict):
    enable: bool = False
    """metatrain's long-range (Ewald or P3M) part: not implemented, accepted when false."""
    use_ewald: bool = False
    """metatrain's; unused while enable is false."""
    smearing: float = 1.4
    """metatrain's; unused while enable is false."""
    kspace_resolution: float = 1.33
    """metatrain's; unused while enable is false."""
    interpolation_nodes: int = 5
    """metatrain's; unused while enable is false."""

    _lacking = default_only({"enable": "long-range interactions are not implemented"})
