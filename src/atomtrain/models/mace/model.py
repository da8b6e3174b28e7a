"""MACE as an atomtrain energy model: mace-torch's ScaleShiftMACE, unchanged, fed the
neighbor pairs' vectors. The trainer's baseline and scale go around it (its own E0s are
zero, its scale one and shift zero, for a model built here)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ...errors import AtomtrainError
from ..data_sizes import one_hot
from ..energy_model import EnergyModel
from ..export import first_line
from . import ARCHITECTURE_NAME, cuequivariance
from .library import import_mace
from .options import ModelOptions

mace_modules, o3, jit = import_mace()
ScaleShiftMACE = mace_modules.ScaleShiftMACE


def new_mace(options: ModelOptions, atomic_types: list[int], average_neighbors: float, extra: dict):
    """mace-torch's ScaleShiftMACE with the section's hyperparameters and the
    constructor settings in ``extra`` (those of a model read from a file), in float64."""
    interactions = mace_modules.interaction_classes
    edge_irreps = o3.Irreps(options.edge_irreps) if options.edge_irreps is not None else None
    settings = {"atomic_inter_scale": 1.0, "atomic_inter_shift": 0.0, **extra}
    return ScaleShiftMACE(
        **settings,
        r_max=options.r_max,
        num_bessel=options.num_radial_basis,
        num_polynomial_cutoff=options.num_cutoff_basis,
        max_ell=options.max_ell,
        interaction_cls=interactions[options.interaction],
        interaction_cls_first=interactions[options.interaction_first],
        num_interactions=options.num_interactions,
        num_elements=len(atomic_types),
        hidden_irreps=o3.Irreps(options.hidden_irreps),
        edge_irreps=edge_irreps,
        MLP_irreps=o3.Irreps(options.MLP_irreps),
        atomic_energies=np.zeros((1, len(atomic_types))),  # one head, as mace_run_train saves
        avg_num_neighbors=average_neighbors,
        atomic_numbers=atomic_types,
        correlation=options.correlation,
        gate=mace_modules.gate_dict[options.gate] if options.gate is not None else None,
        pair_repulsion=options.pair_repulsion,
        apply_cutoff=options.apply_cutoff,
        distance_transform=str(options.distance_transform),
        radial_MLP=options.radial_MLP,
        radial_type=options.radial_type,
        use_embedding_readout=options.use_embedding_readout,
        use_last_readout_only=options.use_last_readout_only,
        use_agnostic_product=options.use_agnostic_product,
    ).to(torch.float64)


def scalar_channels(mace: torch.nn.Module, products: int | None = None) -> torch.Tensor:
    """Positions of the 0e channels in MACE's node_feats (every product's output,
    concatenated), of its first ``products`` products (all when None)."""
    positions: list[int] = []
    offset = 0
    for product in list(mace.products)[:products]:
        irreps = product.linear.irreps_out
        for (multiplicity, irrep), part in zip(irreps, irreps.slices()):
            if irrep.l == 0 and irrep.p == 1:
                positions += range(offset + part.start, offset + part.start + multiplicity)
        offset += irreps.dim
    return torch.tensor(positions, dtype=torch.long)


def readout_inputs(mace: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """What MACE's energy readouts take from node_feats: the 0e channels of each
    interaction read out by a linear map, and where the last interaction's features
    start (a non-linear readout's input)."""
    products = list(mace.products)
    last_start = sum(product.linear.irreps_out.dim for product in products[:-1])
    positions: list[torch.Tensor] = []
    for index, readout in enumerate(mace.readouts):
        interaction = len(products) - 1 if len(mace.readouts) == 1 else index
        if not hasattr(readout, "non_linearity"):
            before = scalar_channels(mace, interaction)
            upto = scalar_channels(mace, interaction + 1)
            positions.append(upto[len(before) :])
    if not positions:
        return torch.zeros(0, dtype=torch.long), last_start
    return torch.cat(positions), last_start


class E3nnTwin:
    """The e3nn-layout ScaleShiftMACE beside one that trains on cuequivariance's kernels:
    not a submodule, so that parameters(), to() and the optimizer see only the one that
    trains; state_dict and load_state_dict go through it."""

    def __init__(self, module: torch.nn.Module):
        self.module = module


@jit.compile_mode("script")
class MaceModel(EnergyModel):
    """Atomic energy: MACE's node energy of the atom's environment within r_max."""

    def __init__(
        self,
        atomic_types: list[int],
        options: ModelOptions,
        average_neighbors: float,
        extra: dict | None = None,
    ):
        extra = extra or {}
        hypers = {
            "architecture": ARCHITECTURE_NAME,
            "atomic_types": list(atomic_types),
            "model": options.model_dump(mode="json"),
            "facts": {"average_neighbors": float(average_neighbors), "extra": extra},
        }
        super().__init__(hypers, options.r_max)
        self.n_types = len(self.atomic_types)
        with warnings.catch_warnings():
            # e3nn scripts parts of itself while built, and TorchScript warns about
            # annotations in e3nn's code, which no user can act on
            warnings.filterwarnings("ignore", "The TorchScript type system", UserWarning)
            self.mace = new_mace(options, self.atomic_types, float(average_neighbors), extra)
        self.e3nn_twin: E3nnTwin | None = None  # set while on cuequivariance's kernels
        # where the invariant (0e) channels of each interaction's node features sit in
        # MACE's node_feats: the features heads for mtt:: targets take
        self.register_buffer("scalar_features", scalar_channels(self.mace), persistent=False)
        # the inputs of the energy's last layers (LLPR's features): the linear readouts'
        # 0e channels and the non-linear readout's hidden layer
        linear_inputs, last_start = readout_inputs(self.mace)
        self.register_buffer("linear_readout_inputs", linear_inputs, persistent=False)
        self.last_interaction_start = last_start
        self.node_features = sum(product.linear.irreps_out.dim for product in self.mace.products)
        # a model read from a file keeps its E0s inside MACE; the baseline stays zero

    def set_precision(self, dtype: torch.dtype) -> MaceModel:
        self.mace.to(dtype)
        self.heads_to(dtype)
        if self.e3nn_twin is not None:
            self.e3nn_twin.module.to(dtype)
        return self

    @torch.jit.unused
    def parameter_layout(self) -> str:
        return cuequivariance.LAYOUT if self.e3nn_twin is not None else super().parameter_layout()

    @torch.jit.unused
    def use_kernels_for(self, device: torch.device) -> None:
        """cuequivariance's kernels when the section's ``cueq`` asks for them on
        ``device``; the same weights, in their layout."""
        if self.e3nn_twin is None and cuequivariance.wanted(self.hypers["model"], device):
            twin = self.mace
            self.mace = cuequivariance.to_cuequivariance(twin, device).to(device)
            self.e3nn_twin = E3nnTwin(twin)

    @torch.jit.unused
    def use_e3nn(self) -> None:
        """Back to e3nn's modules (which TorchScript export and every engine take)."""
        if self.e3nn_twin is not None:
            twin = self.e3nn_twin.module
            cuequivariance.copy_weights(self.mace, twin, to_cueq=False)
            self.mace = twin.to(self.mace_dtype())
            self.e3nn_twin = None

    @contextlib.contextmanager
    def twin_in_place(self) -> Iterator[torch.nn.Module]:
        assert self.e3nn_twin is not None
        trained = self.mace
        self._modules["mace"] = self.e3nn_twin.module
        try:
            yield trained
        finally:
            self._modules["mace"] = trained

    @torch.jit.unused
    def state_dict(self, *args, **kwargs):
        """In e3nn's layout whatever the kernels, so checkpoints and exports are alike."""
        if self.e3nn_twin is None:
            return super().state_dict(*args, **kwargs)
        cuequivariance.copy_weights(self.mace, self.e3nn_twin.module, to_cueq=False)
        with self.twin_in_place():
            return super().state_dict(*args, **kwargs)

    @torch.jit.unused
    def load_state_dict(self, state_dict, *args, **kwargs):
        if self.e3nn_twin is None:
            return super().load_state_dict(state_dict, *args, **kwargs)
        with self.twin_in_place() as trained:
            result = super().load_state_dict(state_dict, *args, **kwargs)
        cuequivariance.copy_weights(self.e3nn_twin.module, trained, to_cueq=True)
        return result

    @torch.jit.unused
    def details(self) -> list[str]:
        model = self.hypers["model"]
        return [
            f"{model['num_interactions']} interactions of {model['hidden_irreps']}",
            f"correlation {model['correlation']}",
            f"{self.hypers['facts']['average_neighbors']:.2f} neighbors on average",
            *([cuequivariance.description()] if self.e3nn_twin is not None else []),
        ]

    @torch.jit.unused
    def feature_width(self) -> int:
        return int(self.scalar_features.shape[0])

    def atomic_outputs(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> torch.Tensor:
        outputs = self.run_mace(edge_vectors, pair_first, pair_second, element_index, mirrored)
        energies = outputs["node_energy"]
        assert energies is not None
        return energies

    def features_and_energies(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
        with_energies: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The invariant (0e) channels of every interaction's node features, and the
        node energies, from one pass of MACE."""
        outputs = self.run_mace(edge_vectors, pair_first, pair_second, element_index, mirrored)
        features = outputs["node_feats"]
        energies = outputs["node_energy"]
        assert features is not None and energies is not None
        features = features.index_select(1, self.scalar_features)
        if not with_energies:
            return features, None
        return features, energies

    def atomic_last_layer_features(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """MACE's node energies and the inputs of its readouts' last linear maps: the 0e
        channels the linear readouts take, and the non-linear readout's hidden layer."""
        outputs = self.run_mace(edge_vectors, pair_first, pair_second, element_index, mirrored)
        features = outputs["node_feats"]
        energies = outputs["node_energy"]
        assert features is not None and energies is not None
        parts = [features.index_select(1, self.linear_readout_inputs)]
        readout = self.mace.readouts[-1]
        if hasattr(readout, "non_linearity"):  # resolved when scripted, as in Python
            last = features[:, self.last_interaction_start :]
            parts.append(readout.non_linearity(readout.linear_1(last)))
        return energies, torch.cat(parts, dim=1)

    def run_mace(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        pair_second: torch.Tensor,
        element_index: torch.Tensor,
        mirrored: bool,
    ) -> dict[str, torch.Tensor | None]:
        # MACE takes each edge's vector as positions[receiver] - positions[sender] +
        # shifts: with all positions at zero, the shifts are the vectors themselves,
        # exactly, and the derivatives flow back to them
        dtype = self.mace_dtype()
        vectors = edge_vectors.to(dtype)
        if mirrored:
            vectors = torch.cat([vectors, -vectors])
        n_atoms = element_index.shape[0]
        if n_atoms == 0:
            # a rank's empty share of a global batch: mace-torch cannot reshape nothing;
            # no energy, still tied to the positions for the force derivative
            tied = vectors.sum() * 0.0
            empty: dict[str, torch.Tensor | None] = {
                "node_energy": vectors.new_zeros(0) + tied,
                "node_feats": vectors.new_zeros((0, self.node_features)) + tied,
            }
            return empty
        device = vectors.device
        data = {
            "positions": torch.zeros((n_atoms, 3), dtype=dtype, device=device),
            "node_attrs": one_hot(element_index, self.n_types, dtype),
            "edge_index": torch.stack([pair_first, pair_second]),
            "shifts": vectors,
            "unit_shifts": torch.zeros_like(vectors),
            "cell": torch.zeros((1, 3, 3), dtype=dtype, device=device),
            # one graph: per-atom energies do not depend on how atoms group into systems
            "batch": torch.zeros(n_atoms, dtype=torch.long, device=device),
            # [0, n_atoms], from the size itself: a traced graph keeps it a symbol
            "ptr": torch.arange(2, dtype=torch.long, device=device) * n_atoms,
        }
        return self.mace(data, training=self.training, compute_force=False)

    def mace_dtype(self) -> torch.dtype:
        """The dtype MACE's parameters are in."""
        return self.mace.atomic_energies_fn.atomic_energies.dtype


def read_mace_file(path: str) -> MaceModel:
    """A ScaleShiftMACE saved by mace-torch's tools (mace_run_train's ``.model``), as
    an atomtrain model: the section and constructor settings read off the module (with
    mace-torch's own extract_config_mace_model), its weights, E0s, scale and shift kept.

    MACE's files are pickled Python objects: loading one runs code from it, as
    mace-torch's own tools do, so read only files you trust."""
    from mace.tools.scripts_utils import extract_config_mace_model

    if not Path(path).is_file():
        raise AtomtrainError(f"{path}: MACE model file not found (architecture.model.mace_model)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise AtomtrainError(
            f"{path}: not a MACE model file ({first_line(error)}); give a .model file "
            "written by mace_run_train"
        ) from error
    if not isinstance(loaded, ScaleShiftMACE):
        raise AtomtrainError(
            f"{path}: a {type(loaded).__name__}, not a ScaleShiftMACE; give a .model file "
            "written by mace_run_train (--model ScaleShiftMACE, its default)"
        )
    heads = list(getattr(loaded, "heads", ["Default"]))
    if len(heads) > 1:
        raise AtomtrainError(
            f"{path}: a MACE model of {len(heads)} heads ({', '.join(heads)}); multi-head "
            "models are not supported yet (mace_head_name): use a single-head model"
        )
    config = extract_config_mace_model(loaded)
    atomic_types = [int(z) for z in config["atomic_numbers"]]
    if atomic_types != sorted(atomic_types):
        raise AtomtrainError(f"{path}: its elements {atomic_types} are not in increasing order")
    gate = config["gate"]
    section = ModelOptions.model_validate(
        {
            "mace_model": str(path),
            "r_max": float(config["r_max"]),
            "num_radial_basis": int(config["num_bessel"]),
            "num_cutoff_basis": int(config["num_polynomial_cutoff"]),
            "max_ell": int(config["max_ell"]),
            "interaction": config["interaction_cls"].__name__,
            "interaction_first": config["interaction_cls_first"].__name__,
            "num_interactions": int(config["num_interactions"]),
            "hidden_irreps": str(config["hidden_irreps"]),
            "edge_irreps": str(config["edge_irreps"]) if config["edge_irreps"] else None,
            "MLP_irreps": str(config["MLP_irreps"]),
            "gate": gate.__name__ if gate is not None else None,
            "correlation": int(np.max(config["correlation"])),
            "radial_type": config["radial_type"],
            "apply_cutoff": bool(config["apply_cutoff"]),
            "radial_MLP": [int(width) for width in config["radial_MLP"]],
            "pair_repulsion": bool(config["pair_repulsion"]),
            "distance_transform": config["distance_transform"],
            "use_embedding_readout": bool(config["use_embedding_readout"]),
            "use_last_readout_only": bool(config["use_last_readout_only"]),
            "use_agnostic_product": bool(config["use_agnostic_product"]),
        }
    )
    extra = {
        "use_reduced_cg": bool(config["use_reduced_cg"]),
        "use_so3": bool(config["use_so3"]),
        "use_edge_irreps_first": bool(config["use_edge_irreps_first"]),
        "atomic_inter_scale": float(np.asarray(config["atomic_inter_scale"]).reshape(-1)[0]),
        "atomic_inter_shift": float(np.asarray(config["atomic_inter_shift"]).reshape(-1)[0]),
    }
    average = float(config["avg_num_neighbors"])
    model = MaceModel(atomic_types, section, average, extra)
    try:
        model.mace.load_state_dict(loaded.state_dict())
    except RuntimeError as error:
        raise AtomtrainError(
            f"{path}: this MACE model's weights do not fit the model its settings describe "
            f"({first_line(error)}); it was written by a mace-torch other than 0.3.16?"
        ) from error
    return model.set_precision(next(loaded.parameters()).dtype)
