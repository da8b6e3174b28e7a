"""Plot the total (conserved) energy and the temperature of an i-PI run: plot.py md.out out.png"""

import sys

import ase.io
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# columns of input-*.xml's properties: step, time (ps), conserved (eV), temperature (K), ...
table = np.loadtxt(sys.argv[1])
time_fs, conserved, temperature = 1000 * table[:, 1], table[:, 2], table[:, 3]
figure, (energy_axis, temperature_axis) = plt.subplots(2, 1, sharex=True, figsize=(6, 5))
energy_axis.plot(time_fs, conserved)
energy_axis.set_ylabel("total (conserved) energy (eV)")
temperature_axis.plot(time_fs, temperature)
temperature_axis.set_ylabel("temperature (K)")
temperature_axis.set_xlabel("time (fs)")
figure.suptitle("molecular dynamics (i-PI, metatomic driver)")
figure.tight_layout()
figure.savefig(sys.argv[2], dpi=120)
n_atoms = len(ase.io.read("start.xyz"))
drift = 1000 * np.abs(conserved - conserved[0]).max() / n_atoms
print(f"{len(table)} steps; largest change of the conserved energy {drift:.4f} meV/atom")
