#!/usr/bin/env bash
# Molecular dynamics of ethanol in i-PI with an exported atomtrain model:
#   bash run.sh ../../ethanol/model.pt nve     (or nvt)
#   bash run.sh model.pt nve --non-conservative   (a model trained with direct forces)
# i-PI integrates; its metatomic driver evaluates the model (forces and virial by
# autograd) and talks to i-PI over a UNIX socket. Writes md.out, md.pos_0.extxyz and
# md_ipi_<ensemble>.png (total energy and temperature over time).
set -euo pipefail
model=$(realpath -m "${1:-../../ethanol/model.pt}")
ensemble=${2:-nve}
# the model's direct forces (and stress, if it has them) instead of the energy's gradient
direct=""
case "${3:-}" in
  "") ;;
  --non-conservative) direct=",non_conservative=True" ;;
  *) echo "${3}: unknown option; the third argument may be --non-conservative" >&2; exit 2 ;;
esac
# a missing input is one line and exit code 2, before i-PI starts
if [ ! -f "$model" ]; then
  echo "$model: model file not found (the README's quick start writes examples/ethanol/model.pt)" >&2
  exit 2
fi
if [ ! -d "$(dirname "$model")/extensions" ]; then
  echo "$(dirname "$model")/extensions: the model's extensions directory is not beside it (export writes model.pt and extensions/ together)" >&2
  exit 2
fi
if [ ! -f "$(dirname "$0")/input-$ensemble.xml" ]; then
  echo "$ensemble: no such ensemble here; use nve or nvt" >&2
  exit 2
fi
cd "$(dirname "$0")"
address="atomtrain-$$"
sed "s|<address>atomtrain</address>|<address>$address</address>|" "input-$ensemble.xml" > input.xml
rm -f md.out md.pos_0.extxyz md.for_0.extxyz RESTART
i-pi input.xml > ipi.log 2>&1 &
server=$!
# one torch thread unless told otherwise: the fastest for small systems, and several
# threads beside another job were 4x slower (docs/performance-notes.md); i-PI's metatomic
# driver without TorchScript's shape specializations on a CPU (metatomic_driver.py)
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} i-pi-py_driver -m custom -P "$(pwd)/metatomic_driver.py" \
  -u -a "$address" -o "template=start.xyz,model=$model,extensions=$(dirname "$model")/extensions$direct" \
  > driver.log 2>&1 &
driver=$!
# the driver retries until i-PI has opened the socket, and spins if i-PI dies: i-PI's
# exit decides, and the driver is stopped with it; a driver that fails (a model without
# the outputs asked) would leave i-PI waiting for it forever, so its failure ends the run
trap 'kill $server $driver 2>/dev/null || true' EXIT
while kill -0 $server 2>/dev/null && kill -0 $driver 2>/dev/null; do sleep 0.2; done
if kill -0 $server 2>/dev/null && ! wait $driver; then
  echo "the model's driver stopped: $(grep -v '^[[:space:]]*$' driver.log | tail -n 1) (see $(pwd)/driver.log)" >&2
  exit 2
fi
if ! wait $server; then
  echo "i-PI stopped with an error; see $(pwd)/ipi.log" >&2
  exit 1
fi
wait $driver || true
python plot.py md.out "md_ipi_$ensemble.png"
