"""SOAP power spectrum on flat batches of neighbor pairs.

Density coefficients c[i, a, l, n, m] = sum_j R_nl(r_ij) f_c(r_ij) Y_lm(r_ij / |r_ij|)
over neighbors j of element a, with R_nl the Laplacian eigenstates; the power spectrum
sums c c' over m for each l. Everything is a gather over pairs and two batched matrix
products: one sums pairs into centers, one multiplies channels.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
import scipy.special
import sphericart.torch
import torch


def cosine_cutoff(distances: torch.Tensor, radius: float, width: float) -> torch.Tensor:
    """1 below ``radius - width``, a shifted cosine down to 0 at ``radius``: smooth C1."""
    start = radius - width
    scaled = ((distances - start) / width).clamp(0.0, 1.0)
    return 0.5 * (1.0 + torch.cos(math.pi * scaled))


def _bessel_of_order(x: float, order: int) -> float:
    return scipy.special.spherical_jn(order, x)


def spherical_bessel_zeros(max_angular: int, count: int) -> np.ndarray:
    """The first ``count`` positive zeros of j_l for l = 0..max_angular, [l, count].

    The zeros of j_l interlace those of j_(l-1), so each is bracketed by two consecutive
    zeros of the previous order, starting from those of j_0 (multiples of pi).
    """
    zeros = np.zeros((max_angular + 1, count))
    brackets = np.arange(1, count + max_angular + 1) * np.pi
    zeros[0] = brackets[:count]
    for angular_l in range(1, max_angular + 1):
        brackets = np.array(
            [
                scipy.optimize.brentq(_bessel_of_order, low, high, (angular_l,), xtol=1e-14)
                for low, high in zip(brackets[:-1], brackets[1:])
            ]
        )
        zeros[angular_l] = brackets[:count]
    return zeros


class LaplacianEigenstates:
    """Radial basis R_nl(r) = N_nl j_l(z_nl r / cutoff) of the Laplacian eigenstates in a
    sphere (Bigi et al., J. Chem. Phys. 157, 234101 (2022)), the basis of metatrain's
    SOAP-BPNN.

    Functions are ranked by their eigenvalue z_nl^2: every l keeps those at or below the
    eigenvalue of l = 0, n = max_radial (and at least one), so high l gets fewer, smoother
    functions. Each is normalised to 1 under r^2 dr on [0, cutoff].
    """

    def __init__(self, cutoff: float, max_radial: int, max_angular: int):
        self.cutoff = cutoff
        self.zeros = spherical_bessel_zeros(max_angular, max_radial + 1)
        threshold = self.zeros[0, max_radial]
        self.n_per_l = [max(1, int(np.sum(row <= threshold * (1 + 1e-12)))) for row in self.zeros]
        self.max_radial = max_radial

    def normalization(self, angular_l: int, n: int) -> float:
        # integral of r^2 j_l(z r / rc)^2 over [0, rc] is rc^3 j_(l+1)(z)^2 / 2 at a zero z
        zero = self.zeros[angular_l, n]
        return 1.0 / math.sqrt(
            0.5 * self.cutoff**3 * scipy.special.spherical_jn(angular_l + 1, zero) ** 2
        )

    def values_and_derivatives(self, distances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[points, l, n] in float64, zero for the functions trimmed away."""
        shape = (distances.shape[0], len(self.n_per_l), self.max_radial + 1)
        values, derivatives = np.zeros(shape), np.zeros(shape)
        for angular_l, count in enumerate(self.n_per_l):
            for n in range(count):
                wavenumber = self.zeros[angular_l, n] / self.cutoff
                factor = self.normalization(angular_l, n)
                values[:, angular_l, n] = factor * scipy.special.spherical_jn(
                    angular_l, wavenumber * distances
                )
                derivatives[:, angular_l, n] = (
                    factor
                    * wavenumber
                    * scipy.special.spherical_jn(angular_l, wavenumber * distances, derivative=True)
                )
        return values, derivatives

    def spline_coefficients(self, n_intervals: int) -> torch.Tensor:
        """Cubic Hermite polynomial of each interval of a uniform grid on [0, cutoff],
        [interval, power (0..3), l * n] in the interval's own coordinate t in [0, 1].
        The error is below 1e-7 with 512 intervals for the default hyperparameters."""
        step = self.cutoff / n_intervals
        values, derivatives = self.values_and_derivatives(
            np.linspace(0.0, self.cutoff, n_intervals + 1)
        )
        values = values.reshape(n_intervals + 1, -1)
        slopes = derivatives.reshape(n_intervals + 1, -1) * step
        start, end = values[:-1], values[1:]
        start_slope, end_slope = slopes[:-1], slopes[1:]
        coefficients = np.stack(
            [
                start,
                start_slope,
                3.0 * (end - start) - 2.0 * start_slope - end_slope,
                2.0 * (start - end) + start_slope + end_slope,
            ],
            axis=1,
        )
        return torch.from_numpy(coefficients)


class _NoSecondDerivative(torch.autograd.Function):
    """Passes the harmonics' gradients through, tied to the pair vectors so that asking
    for a second derivative with respect to positions raises instead of silently
    leaving out the harmonics' curvature."""

    @staticmethod
    def forward(ctx, gradients: torch.Tensor, edge_vectors: torch.Tensor) -> torch.Tensor:
        return gradients.view_as(gradients)

    @staticmethod
    def backward(ctx, *unused):
        raise RuntimeError(
            "the training model gives no second derivatives with respect to positions: "
            "differentiate a loss on forces or stress with respect to the parameters "
            "only (loss.backward(inputs=list(model.parameters()))); for Hessians use "
            "the exported model (atomtrain export)"
        )


class _HarmonicsWithCachedGradients(torch.autograd.Function):
    """Spherical harmonics whose backward is one batched product with their gradients,
    computed in the forward pass (sphericart's own backward computes them again and
    contracts with a broadcast multiply). Force training differentiates this backward
    again with respect to the incoming gradient only, which it supports."""

    @staticmethod
    def forward(ctx, edge_vectors: torch.Tensor, calculator: torch.nn.Module) -> torch.Tensor:
        values, gradients = calculator.compute_with_gradients(edge_vectors)
        ctx.save_for_backward(edge_vectors, gradients)
        return values

    @staticmethod
    def backward(ctx, grad_values: torch.Tensor):
        edge_vectors, gradients = ctx.saved_tensors
        gradients = _NoSecondDerivative.apply(gradients, edge_vectors)
        return torch.bmm(gradients, grad_values.unsqueeze(2)).squeeze(2), None


class _RadialWithCachedDerivative(torch.autograd.Function):
    """Radial functions whose backward is one multiply by their derivative, computed in
    the forward pass; differentiating the spline and cutoff through autograd builds a
    graph of a dozen [pairs, l * n] operations that force training walks twice."""

    @staticmethod
    def forward(ctx, distances: torch.Tensor, soap: torch.nn.Module) -> torch.Tensor:
        values, derivatives = soap.cut_radial_and_derivative(distances)
        ctx.save_for_backward(distances, derivatives)
        return values

    @staticmethod
    def backward(ctx, grad_values: torch.Tensor):
        distances, derivatives = ctx.saved_tensors
        derivatives = _NoSecondDerivative.apply(derivatives, distances)
        return (grad_values * derivatives).sum(1), None


def neighbor_sums(
    radial: torch.Tensor,
    angular: torch.Tensor,
    center: torch.Tensor,
    element: torch.Tensor,
    n_centers: int,
    n_elements: int,
) -> torch.Tensor:
    """sum over pairs p with center[p] = i and element[p] = a of
    radial[p, l, n] * angular[p, l, m], as [i, l, a, n, m].

    Each pair is copied, once per l, into a zero-padded [(i, l, a), most pairs per
    (i, a), ...] layout, so that the sum is one batched matrix product whose output is
    already in the order the power spectrum wants; its gradients (and theirs, for force
    training) are matrix products too, instead of a [pairs, l, n, m] outer product held
    in memory and scattered.
    """
    n_pairs, n_l, n_radial = radial.shape
    n_m = angular.shape[2]
    target = center * n_elements + element
    counts = torch.bincount(target, minlength=n_centers * n_elements)
    width = int(counts.max()) if n_pairs > 0 else 1
    # the slot of each pair among its target's pairs
    order = torch.argsort(target, stable=True)
    first_of_target = torch.cumsum(counts, 0) - counts
    sorted_slot = torch.arange(n_pairs, device=target.device) - first_of_target.index_select(
        0, target.index_select(0, order)
    )
    slot = torch.empty_like(sorted_slot).index_copy(0, order, sorted_slot)
    rows = target * width + slot
    n_rows = n_centers * n_elements * width
    padded_radial = radial.new_zeros((n_rows, n_l * n_radial)).index_copy(
        0, rows, radial.reshape(n_pairs, n_l * n_radial)
    )
    padded_angular = angular.new_zeros((n_rows, n_l * n_m)).index_copy(
        0, rows, angular.reshape(n_pairs, n_l * n_m)
    )
    # (center, element, slot, l) -> (center, l, element, slot): a copy that moves whole
    # rows of n (or m) values; the product then reads the radial block transposed
    padded_radial = padded_radial.reshape(n_centers, n_elements, width, n_l, n_radial)
    padded_angular = padded_angular.reshape(n_centers, n_elements, width, n_l, n_m)
    n_batches = n_centers * n_l * n_elements
    sums = torch.bmm(
        padded_radial.permute(0, 3, 1, 2, 4).reshape(n_batches, width, n_radial).transpose(1, 2),
        padded_angular.permute(0, 3, 1, 2, 4).reshape(n_batches, width, n_m),
    )
    return sums.reshape(n_centers, n_l, n_elements, n_radial, n_m)


class SoapPowerSpectrum(torch.nn.Module):
    """Rotation-invariant SOAP power spectrum with element channels, on the Laplacian
    eigenstate radial basis."""

    def __init__(
        self,
        n_elements: int,
        cutoff: float,
        cutoff_width: float,
        max_radial: int,
        max_angular: int,
        n_spline_intervals: int = 512,
    ):
        super().__init__()
        self.n_elements = n_elements
        self.cutoff = cutoff
        self.cutoff_width = cutoff_width
        self.n_radial = max_radial + 1
        self.max_angular = max_angular
        basis = LaplacianEigenstates(cutoff, max_radial, max_angular)
        self.n_per_l = basis.n_per_l
        self.n_spline_intervals = n_spline_intervals
        self.register_buffer("radial_spline", basis.spline_coefficients(n_spline_intervals))
        self.spherical_harmonics = sphericart.torch.SphericalHarmonics(max_angular)
        # Each l block of the harmonics (2l + 1 values of m) is spread over
        # 2 max_angular + 1 columns, zeros after its own (taken from an appended zero
        # column), so that all l are one batched matrix product.
        n_l, n_m = max_angular + 1, 2 * max_angular + 1
        spread = torch.full((n_l * n_m,), n_l * n_l, dtype=torch.long)
        for angular_l in range(n_l):
            for m in range(2 * angular_l + 1):
                spread[angular_l * n_m + m] = angular_l * angular_l + m
        self.register_buffer("spread", spread)
        # Features: for each l, the pairs of channels (element, n) with c <= c', both
        # within the l's radial functions. Products are sums over m, without the
        # 1/sqrt(2l + 1) of an average: like metatrain's (spex) power spectrum, this keeps
        # high l as loud as the density overlap has it, and measured better on silicon
        # forces (58 against 89 meV/A over three seeds; docs/performance.md).
        n_channels = n_elements * self.n_radial
        selected: list[int] = []
        for angular_l, count in enumerate(self.n_per_l):
            kept = [c for c in range(n_channels) if c % self.n_radial < count]
            for position, first in enumerate(kept):
                for second in kept[position:]:
                    selected.append((angular_l * n_channels + first) * n_channels + second)
        self.register_buffer("selected", torch.tensor(selected, dtype=torch.long))
        self.n_features = len(selected)

    def forward(
        self,
        edge_vectors: torch.Tensor,
        pair_first: torch.Tensor,
        neighbor_element: torch.Tensor,
        n_atoms: int,
    ) -> torch.Tensor:
        distances = torch.linalg.vector_norm(edge_vectors, dim=1)
        radial = self.radial_with_cutoff(distances)
        angular = self.angular(edge_vectors)
        angular = torch.cat([angular, angular.new_zeros((angular.shape[0], 1))], dim=1)
        n_l, n_m = self.max_angular + 1, 2 * self.max_angular + 1
        angular = angular.index_select(1, self.spread)
        density = neighbor_sums(
            radial.reshape(-1, n_l, self.n_radial),
            angular.reshape(-1, n_l, n_m),
            pair_first,
            neighbor_element,
            n_atoms,
            self.n_elements,
        )
        return self.power_spectrum(density)

    def spline_position(self, distances: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each distance's interval coefficients [pairs, 4, l * n] and its position in
        the interval, [pairs, 1]."""
        scaled = distances.clamp(0.0, self.cutoff) * (self.n_spline_intervals / self.cutoff)
        interval = scaled.detach().floor().clamp(max=self.n_spline_intervals - 1)
        coefficients = self.radial_spline.index_select(0, interval.to(torch.long))
        return coefficients, (scaled - interval).unsqueeze(1)

    def radial(self, distances: torch.Tensor) -> torch.Tensor:
        """R_nl(r), [pairs, l * n], from the cubic spline (exact derivatives of the
        spline to all orders)."""
        coefficients, position = self.spline_position(distances)
        return (
            (coefficients[:, 3] * position + coefficients[:, 2]) * position + coefficients[:, 1]
        ) * position + coefficients[:, 0]

    @torch.jit.unused
    def cut_radial_and_derivative(
        self, distances: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """R_nl(r) f_c(r) and its derivative with respect to r, without autograd."""
        with torch.no_grad():
            coefficients, position = self.spline_position(distances)
            values = (
                (coefficients[:, 3] * position + coefficients[:, 2]) * position + coefficients[:, 1]
            ) * position + coefficients[:, 0]
            slopes = (3.0 * coefficients[:, 3] * position + 2.0 * coefficients[:, 2]) * position
            slopes = (slopes + coefficients[:, 1]) * (self.n_spline_intervals / self.cutoff)
            start = self.cutoff - self.cutoff_width
            phase = math.pi * ((distances - start) / self.cutoff_width).clamp(0.0, 1.0)
            cutoff = (0.5 * (1.0 + torch.cos(phase))).unsqueeze(1)
            cutoff_slope = (-0.5 * math.pi / self.cutoff_width * torch.sin(phase)).unsqueeze(1)
            return values * cutoff, slopes * cutoff + values * cutoff_slope

    def cut_radial(self, distances: torch.Tensor) -> torch.Tensor:
        cutoff = cosine_cutoff(distances, self.cutoff, self.cutoff_width)
        return self.radial(distances) * cutoff.unsqueeze(1)

    def radial_with_cutoff(self, distances: torch.Tensor) -> torch.Tensor:
        """R_nl(r) f_c(r), [pairs, l * n]; like the harmonics, exact to all orders in the
        exported model, and in training through the derivative cached in the forward
        pass (_RadialWithCachedDerivative)."""
        if torch.jit.is_scripting():
            return self.cut_radial(distances)
        return self.radial_for_training(distances)

    @torch.jit.unused
    def radial_for_training(self, distances: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and distances.requires_grad):
            return self.cut_radial(distances)
        return _RadialWithCachedDerivative.apply(distances, self)

    def angular(self, edge_vectors: torch.Tensor) -> torch.Tensor:
        """Spherical harmonics of the pair vectors. The exported (TorchScript) model uses
        sphericart's autograd, exact to all orders; in Python, where training runs, the
        faster first-derivative path of _HarmonicsWithCachedGradients."""
        if torch.jit.is_scripting():
            return self.spherical_harmonics(edge_vectors)
        return self.angular_for_training(edge_vectors)

    @torch.jit.unused
    def angular_for_training(self, edge_vectors: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and edge_vectors.requires_grad):
            return self.spherical_harmonics(edge_vectors)
        return _HarmonicsWithCachedGradients.apply(edge_vectors, self.spherical_harmonics)

    def power_spectrum(self, density: torch.Tensor) -> torch.Tensor:
        """[atoms, l, element, n, m] -> [atoms, features]: for each l, the products of
        channels (element, n) summed over m."""
        n_atoms, n_l, n_elements, n_radial, n_m = density.shape
        n_channels = n_elements * n_radial
        blocks = density.reshape(n_atoms * n_l, n_channels, n_m)
        products = torch.bmm(blocks, blocks.transpose(1, 2))
        # a gather along the last axis of a 2-d tensor: along the last of three it
        # costs several times more per atom once batches grow past ~100 atoms
        products = products.reshape(n_atoms, n_l * n_channels * n_channels)
        return products.index_select(1, self.selected)
