"""Models: one package per architecture (found by name in ``registry``), the energy
model they all are (``energy_model``), the composition baseline, and export through
metatomic. Architecture packages are imported when asked for."""
