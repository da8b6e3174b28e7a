"""What every options section is built from: strict pydantic models whose field
docstrings are the reference docs, and metatrain keys accepted at their defaults only.
Architecture packages define their model sections with these."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


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
