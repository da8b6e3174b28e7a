"""The table of architectures in docs/architectures.md, from the registry:

    python scripts/architectures_doc.py

prints it; tests/unit/test_options.py checks that the docs hold it between the
markers (a new architecture is a package and a registry line, and its row follows)."""

from __future__ import annotations

from atomtrain.models import registry

BEGIN = "<!-- architectures table: python scripts/architectures_doc.py -->"
END = "<!-- end of the architectures table -->"


def table() -> str:
    lines = [BEGIN, "| name | model | extra install |", "|---|---|---|"]
    for name in registry.known():
        architecture = registry.architecture(name)
        names = f"`{name}`" + (" (default)" if name == registry.DEFAULT else "")
        names += "".join(f", `{alias}`" for alias in architecture.aliases)
        lines.append(f"| {names} | {architecture.summary} | {architecture.install} |")
    lines.append(END)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
