"""What a run reports: one-line descriptions of its data and model, per-epoch errors,
and the table of final metrics."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models import registry
from ..models.energy_model import EnergyModel
from ..targets import target_of_metric
from .datasets import Datasets


def describe_data(datasets: Datasets) -> str:
    training = datasets.training
    with_forces, with_stress = training.count_known()
    others = "".join(
        describe_share(name, int(training.target_known(name).sum()), len(training), always=True)
        for name in training.target_columns()
    )
    energy = "energy" if training.gathered("energy_known").any() else "no energy"
    if datasets.left_out:
        others += f"; {datasets.left_out} structures of weight 0 left out of training"
    return (
        f"data: {len(training)} training, {len(datasets.validation)} validation, "
        f"{len(datasets.test)} test structures; targets: {energy}"
        + describe_share("forces", with_forces, len(training))
        + describe_share("stress", with_stress, len(training))
        + others
    )


def describe_extra_data(sections: list) -> str | None:
    """What the log says of metatrain's extra data, when a section gives some."""
    named = {
        name: options.key or name
        for section in sections
        for name, options in section.extra_data.items()
    }
    if not named:
        return None
    listed = ", ".join(f"{name} (key {key})" for name, key in named.items())
    return (
        f"extra_data {listed}: read and checked in every frame, not trained on (metatrain "
        "uses extra data in its masked losses only)"
    )


def describe_training(datasets: Datasets, finetuned_from: str | None) -> str:
    """What the model was trained on, for the exported model's description."""
    files = sorted({Path(path).name for path, _ in datasets.files["training"]})
    training = datasets.training
    with_forces, with_stress = training.count_known()
    targets = "energy" + (", forces" if with_forces else "") + (", stress" if with_stress else "")
    text = f"trained on {len(training)} structures of {', '.join(files)} ({targets})"
    if finetuned_from is not None:
        text = f"fine-tuned from {Path(finetuned_from).name}, {text}"
    return text


def describe_model(model: EnergyModel, dtype: torch.dtype) -> str:
    n_parameters = sum(parameter.numel() for parameter in model.parameters())
    architecture = registry.architecture(model.hypers["architecture"])
    details = "".join(f"{detail}, " for detail in model.details())
    return (
        f"model: {architecture.display_name}, {details}{n_parameters} parameters, "
        f"elements {model.atomic_types}, {dtype}"
    )


def describe_share(target: str, given: int, total: int, always: bool = False) -> str:
    if given == 0 and not always:
        return ""
    return f", {target}" + (f" ({given} of {total} structures)" if given < total else "")


def describe(metrics: dict[str, float]) -> str:
    parts = []
    for target, label, unit, factor in (
        ("energy_per_atom", "E", "meV/atom", 1e3),
        ("forces", "F", "meV/A", 1e3),
        ("stress", "S", "meV/A^3", 1e3),
    ):
        if f"{target}_rmse" in metrics:
            parts.append(f"{label} RMSE {metrics[f'{target}_rmse'] * factor:.4g} {unit}")
    for name, value in metrics.items():  # the other targets, in their own units
        if name.endswith("_rmse") and target_of_metric(name):
            parts.append(f"{name.removesuffix('_rmse')} RMSE {value:.4g}")
    return ", ".join(parts) if parts else "no targets"


def metrics_table(
    results: dict[str, dict[str, float]], title: str = "metrics of the best model"
) -> str:
    """Final metrics, one row per set: RMSE and MAE per target, energies in meV."""
    columns = [
        ("energy_per_atom_rmse", "E/atom RMSE", 1e3),
        ("energy_per_atom_mae", "E/atom MAE", 1e3),
        ("energy_rmse", "E RMSE", 1e3),
        ("energy_mae", "E MAE", 1e3),
        ("forces_rmse", "F RMSE", 1e3),
        ("forces_mae", "F MAE", 1e3),
        ("stress_rmse", "S RMSE", 1e3),
        ("stress_mae", "S MAE", 1e3),
    ]
    others = dict.fromkeys(
        key for metrics in results.values() for key in metrics if target_of_metric(key)
    )
    columns += [(key, key.replace("_rmse", " RMSE").replace("_mae", " MAE"), 1.0) for key in others]
    present = [c for c in columns if any(c[0] in metrics for metrics in results.values())]
    width = max(12, *(len(name) + 2 for name in results))
    cell = max(14, *(len(label) + 2 for _, label, _ in present))
    header = f"{'set':<{width}}" + "".join(f"{label:>{cell}}" for _, label, _ in present)
    units = "meV, meV/atom, meV/A, meV/A^3" + (
        "; other targets in their files' units" if others else ""
    )
    lines = [f"{title} ({units}):", header]
    for name, metrics in results.items():
        cells = "".join(
            f"{metrics[key] * factor:>{cell}.4f}" if key in metrics else f"{'-':>{cell}}"
            for key, _, factor in present
        )
        lines.append(f"{name:<{width}}" + cells)
    return "\n".join(lines)
