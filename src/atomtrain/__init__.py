"""atomtrain: train machine-learning interatomic potentials at any scale."""

__version__ = "0.1.0"
