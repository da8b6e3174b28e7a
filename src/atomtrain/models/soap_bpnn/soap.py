"""SOAP power spectrum on flat batches of neighbor pairs.

Density coefficients c[i, a, n, lm] = sum_j R_n(r_ij) f_c(r_ij) Y_lm(r_ij / |r_ij|) over
neighbors j of element a; the power spectrum sums c c' over m for each l. Everything is
a gather over pairs, one batched matrix product into centers and one over channels.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..data_sizes import most_pairs, occurrences, traced
from .harmonics_library import import_sphericart_torch

sphericart_torch = import_sphericart_torch()


def cosine_cutoff(distances: torch.Tensor, radius: float, width: float) -> torch.Tensor:
    """1 below ``radius - width``, a shifted cosine down to 0 at ``radius``: smooth C1."""
    start = radius - width
    scaled = ((distances - start) / width).clamp(0.0, 1.0)
    return 0.5 * (1.0 + torch.cos(math.pi * scaled))


def spherical_bessel_radial_basis(
    distances: torch.Tensor, wavenumbers: torch.Tensor, cutoff: float
) -> torch.Tensor:
    """R_n(r) = j_0(k_n r) = sin(k_n r) / (k_n r) normalised to 1 under r^2 dr on
    [0, cutoff], k_n = (n + 1) pi / cutoff: the l = 0 eigenstates of the Laplacian in
    the cutoff sphere. Written out rather than through torch.sinc (10x slower): the
    distances of neighbor pairs are never zero."""
    scaled = distances.unsqueeze(1) * wavenumbers
    return torch.sin(scaled) / scaled * (wavenumbers * math.sqrt(2.0 / cutoff))


def spherical_bessel(order: int, x: np.ndarray) -> np.ndarray:
    """j_order(x) for x > 0 by its closed form (Abramowitz and Stegun 10.1.8): sin and
    cos of x - order pi / 2 times polynomials in 1 / x. Accurate to float64 where the
    zeros below are sought (x beyond the previous order's first zero); scipy.special's
    spherical_jn, which tests compare it with, takes 0.14 s to import at every start."""
    phase = x - order * np.pi / 2
    even, odd = np.zeros_like(x), np.zeros_like(x)
    for k in range(order + 1):
        term = math.factorial(order + k) / (2**k * math.factorial(k) * math.factorial(order - k))
        term = (-1) ** (k // 2) * term / x**k
        if k % 2 == 0:
            even += term
        else:
            odd += term
    return (np.sin(phase) * even + np.cos(phase) * odd) / x


def spherical_bessel_zeros(max_angular: int, count: int) -> np.ndarray:
    """The first ``count`` positive zeros of j_l for l = 0..max_angular, [l, count].

    The zeros of j_l interlace those of j_(l-1), so each is bracketed by two consecutive
    zeros of the previous order, starting from those of j_0 (multiples of pi), and found
    by bisection, all of an order at once: 60 halvings of a bracket under 4 leave less
    than float64 resolves. (scipy.optimize's root finders take 0.25 s to import, a
    tenth of a short run's start.)
    """
    zeros = np.zeros((max_angular + 1, count))
    brackets = np.arange(1, count + max_angular + 1) * np.pi
    zeros[0] = brackets[:count]
    for angular_l in range(1, max_angular + 1):
        low, high = brackets[:-1], brackets[1:]
        sign_at_low = np.sign(spherical_bessel(angular_l, low))
        for _ in range(60):
            middle = 0.5 * (low + high)
            beyond = np.sign(spherical_bessel(angular_l, middle)) == sign_at_low
            low, high = np.where(beyond, middle, low), np.where(beyond, high, middle)
        brackets = 0.5 * (low + high)
        zeros[angular_l] = brackets[:count]
    return zeros


def radial_functions_per_l(max_radial: int, max_angular: int) -> list[int]:
    """How many radial functions each l keeps: those of the Laplacian eigenstates whose
    eigenvalue (z_nl / cutoff)^2 is at most that of l = 0, n = max_radial, and at least
    one, as metatrain's basis trims them (8, 7, 7, 6, 6, 5, 5 for 7 and 6). High l
    then has fewer, smoother radial channels."""
    zeros = spherical_bessel_zeros(max_angular, max_radial + 1)
    threshold = zeros[0, max_radial] * (1 + 1e-12)
    return [max(1, int(np.sum(row <= threshold))) for row in zeros]


class _NoSecondDerivative(torch.autograd.Function):
    """Zero, tied to the pair vectors: added to the harmonics' backward, it makes asking
    for a second derivative with respect to positions raise instead of silently leaving
    out the harmonics' curvature. Training's backward (to the parameters only) never
    reaches it."""

    @staticmethod
    def forward(ctx, edge_vectors: torch.Tensor) -> torch.Tensor:
        return edge_vectors.new_zeros(())

    @staticmethod
    def backward(ctx, *unused):
        raise RuntimeError(
            "the training model gives no second derivatives with respect to positions: "
            "differentiate a loss on forces or stress with respect to the parameters "
            "only (loss.backward(inputs=list(model.parameters()))); for Hessians use "
            "the exported model (atomtrain export)"
        )


class _ContractWithGradients(torch.autograd.Function):
    """sum over lm of gradients[p, c, lm] * incoming[p, lm], [pairs, 3]: the gradient
    with respect to the pair vectors. Its own derivative with respect to ``incoming``
    (what force training needs) is three multiply-adds of [pairs, lm] slices, 2x faster
    than the batched product of thousands of 49 x 3 matrices autograd would use."""

    @staticmethod
    def forward(ctx, gradients: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gradients)
        return torch.bmm(gradients, incoming.unsqueeze(2)).squeeze(2)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (gradients,) = ctx.saved_tensors
        result = gradients[:, 0] * grad_output[:, 0:1]
        result = torch.addcmul(result, gradients[:, 1], grad_output[:, 1:2])
        return None, torch.addcmul(result, gradients[:, 2], grad_output[:, 2:3])


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
        contracted = _ContractWithGradients.apply(gradients, grad_values)
        return contracted + _NoSecondDerivative.apply(edge_vectors), None


def neighbor_sums(
    radial: torch.Tensor, angular: torch.Tensor, target: torch.Tensor, n_targets: int
) -> torch.Tensor:
    """sum over pairs p with target[p] = t of radial[p, n] * angular[p, lm], [t, n, lm].

    Pairs are placed in a zero-padded [targets, most pairs per target] layout so that
    the sum is one batched matrix product: its gradients (and their gradients, for force
    training) are matrix products too, instead of a [pairs, n, lm] outer product held in
    memory and scattered.
    """
    counts = occurrences(target, n_targets)
    width = most_pairs(counts, per_element=True)
    # each pair's slot among the pairs of its target, in their order
    order = torch.argsort(target, stable=True)
    first_of_target = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(target)
    position = torch.arange(target.shape[0], device=target.device)
    slot[order] = position - first_of_target[target[order]]
    flat = target * width + slot
    # written in place into fresh zeros: out of place, index_copy copies the zeros first
    padded_radial = radial.new_zeros((n_targets * width, radial.shape[1]))
    padded_radial.index_copy_(0, flat, radial)
    padded_angular = angular.new_zeros((n_targets * width, angular.shape[1]))
    padded_angular.index_copy_(0, flat, angular)
    return torch.bmm(
        padded_radial.reshape(n_targets, width, radial.shape[1]).transpose(1, 2),
        padded_angular.reshape(n_targets, width, angular.shape[1]),
    )


class SoapPowerSpectrum(torch.nn.Module):
    """Rotation-invariant SOAP power spectrum with element channels."""

    def __init__(
        self,
        n_elements: int,
        cutoff: float,
        cutoff_width: float,
        max_radial: int,
        max_angular: int,
    ):
        super().__init__()
        self.n_elements = n_elements
        self.cutoff = cutoff
        self.cutoff_width = cutoff_width
        self.n_radial = max_radial + 1
        self.max_angular = max_angular
        wavenumbers = torch.arange(1, self.n_radial + 1, dtype=torch.float64) * (math.pi / cutoff)
        self.register_buffer("wavenumbers", wavenumbers)
        self.spherical_harmonics = sphericart_torch.SphericalHarmonics(max_angular)
        # Each l block of the density (2l + 1 values of m) is spread over 2 max_angular + 1
        # columns, zeros after its own, so that all l are one batched matrix product; the
        # spreading is a product with a 0/1 matrix (cheaper to differentiate twice than a
        # gather).
        n_lm = (max_angular + 1) ** 2
        width = 2 * max_angular + 1
        spread = torch.zeros((n_lm, (max_angular + 1) * width), dtype=torch.float64)
        for angular_l in range(max_angular + 1):
            for m in range(2 * angular_l + 1):
                spread[angular_l * angular_l + m, angular_l * width + m] = 1.0
        self.register_buffer("spread", spread)
        # (-1)^l for each lm, the parity of the harmonics (not saved: derived)
        parity = torch.tensor(
            [
                (-1.0) ** angular_l
                for angular_l in range(max_angular + 1)
                for _ in range(2 * angular_l + 1)
            ],
            dtype=torch.float64,
        )
        self.register_buffer("parity", parity, persistent=False)
        # Features: for each l, the pairs of channels (element, n) with c <= c' and both n
        # below the l's count. They are sums over m, without the 1/sqrt(2l + 1) of an
        # average, as in metatrain's power spectrum: high l keeps the weight the density
        # overlap gives it (measured better on silicon forces; docs/performance-notes.md).
        n_channels = n_elements * self.n_radial
        selected: list[int] = []
        for angular_l, count in enumerate(radial_functions_per_l(max_radial, max_angular)):
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
        mirrored: bool = False,
    ) -> torch.Tensor:
        """Features [atoms, features]. ``mirrored``: ``edge_vectors`` are those of the
        first half of the pairs only, the second half being the same pairs reversed, whose
        vectors are the negated ones: same radial functions, Y_lm(-r) = (-1)^l Y_lm(r).
        Half the harmonics and their gradients, the largest tensors of a step."""
        distances = torch.linalg.vector_norm(edge_vectors, dim=1)
        radial = spherical_bessel_radial_basis(distances, self.wavenumbers, self.cutoff)
        radial = radial * cosine_cutoff(distances, self.cutoff, self.cutoff_width).unsqueeze(1)
        angular = self.angular(edge_vectors)
        if mirrored:
            radial = torch.cat([radial, radial])
            angular = torch.cat([angular, angular * self.parity])
        target = pair_first * self.n_elements + neighbor_element
        n_lm = (self.max_angular + 1) * (self.max_angular + 1)
        density = neighbor_sums(radial, angular, target, n_atoms * self.n_elements)
        density = density.reshape(n_atoms, self.n_elements * self.n_radial, n_lm)
        return self.power_spectrum(density)

    def angular(self, edge_vectors: torch.Tensor) -> torch.Tensor:
        """Spherical harmonics of the pair vectors. In Python, where training runs, the
        fast first-derivative path of _HarmonicsWithCachedGradients; in TorchScript (the
        exported model) see angular_with_tangent."""
        if torch.jit.is_scripting():
            return self.angular_with_tangent(edge_vectors)
        return self.angular_for_training(edge_vectors)

    def angular_with_tangent(self, edge_vectors: torch.Tensor) -> torch.Tensor:
        """Harmonics whose first derivatives hold in any process. sphericart registers
        the autograd formula of its operator from Python, so in a process that loads an
        exported model without importing sphericart.torch (an MD engine), autograd
        through the operator silently drops the harmonics' part of the forces. Here the
        values and gradients come from one call, detached, and the derivative is carried
        by the tangent term gradients . (r - r.detach()), zero in value: forces, stress
        and virials are exact; second derivatives miss the harmonics' curvature."""
        vectors = edge_vectors.detach()  # no autograd record of the operator's call
        values, gradients = self.spherical_harmonics.compute_with_gradients(vectors)
        if not edge_vectors.requires_grad:
            return values
        displacement = edge_vectors - vectors
        # a broadcast product summed over xyz: as a batched product of 1 x 3 by 3 x lm
        # matrices (one per pair) forward and backward took 2.3x as long
        tangent = (displacement.unsqueeze(2) * gradients).sum(1)
        return values + tangent

    @torch.jit.unused
    def angular_for_training(self, edge_vectors: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and edge_vectors.requires_grad):
            return self.spherical_harmonics(edge_vectors)
        return _HarmonicsWithCachedGradients.apply(edge_vectors, self.spherical_harmonics)

    def power_spectrum(self, density: torch.Tensor) -> torch.Tensor:
        """[atoms, channels, lm] -> [atoms, features]: for each l, the products of
        channels (element, n) summed over m."""
        n_atoms, n_channels, _ = density.shape
        n_l, width = self.max_angular + 1, 2 * self.max_angular + 1
        blocks = (density @ self.spread).reshape(n_atoms, n_channels, n_l, width)
        blocks = blocks.transpose(1, 2).reshape(n_atoms * n_l, n_channels, width)
        products = torch.bmm(blocks, blocks.transpose(1, 2))
        # a gather along the last axis of a 2-d tensor: along the last of three it
        # costs several times more per atom once batches grow past ~100 atoms
        row = n_l * n_channels * n_channels
        if torch.jit.is_scripting() or not traced():
            return products.reshape(n_atoms, row).index_select(1, self.selected)
        # Traced for compilation: a gather along one flat axis. Along the rows' second
        # axis inductor's gather divides each index by the row, modulo the number of
        # atoms (a symbol), in both passes; this one made the compiled step 13 % shorter
        # on ethanol, 4 % on silicon (measured), but eagerly 2-4 % longer.
        flat = torch.arange(n_atoms, device=density.device).unsqueeze(1) * row + self.selected
        return products.reshape(-1).index_select(0, flat.reshape(-1)).reshape(n_atoms, -1)
