"""Units that data files may use, and their factors to angstrom and eV."""

from __future__ import annotations

import difflib

import ase.units

from .errors import DataError

LENGTH_UNITS = {
    "angstrom": 1.0,
    "a": 1.0,
    "bohr": ase.units.Bohr,
    "nm": 10.0,
}
ENERGY_UNITS = {
    "ev": 1.0,
    "mev": 1e-3,
    "hartree": ase.units.Hartree,
    "ha": ase.units.Hartree,
    "ry": ase.units.Ry,
    "rydberg": ase.units.Ry,
    "kcal/mol": ase.units.kcal / ase.units.mol,
    "kj/mol": ase.units.kJ / ase.units.mol,
}


def unit_problem(unit: str, kind: str) -> str | None:
    """Why ``unit`` is not a known ``kind`` ("length" or "energy") unit, or None."""
    table = LENGTH_UNITS if kind == "length" else ENERGY_UNITS
    key = unit.strip().lower()
    if key in table:
        return None
    close = difflib.get_close_matches(key, table, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"unknown {kind} unit '{unit}'; {hint}known units: {', '.join(sorted(table))}"


def unit_factor(unit: str, kind: str) -> float:
    """Factor that converts a value in ``unit`` to angstrom (length) or eV (energy). The
    options check their units when read (unit_problem); this is for other callers."""
    problem = unit_problem(unit, kind)
    if problem:
        raise DataError(problem)
    table = LENGTH_UNITS if kind == "length" else ENERGY_UNITS
    return table[unit.strip().lower()]
