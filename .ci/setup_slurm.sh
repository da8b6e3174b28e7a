#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (Debian's slurmctld, slurmd, munge), for the
# srun tests. Idempotent: does nothing if srun already answers.
set -euo pipefail
if command -v srun >/dev/null 2>&1 && timeout 20 srun -N1 -n1 true 2>/dev/null; then
  echo "SLURM already running"; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! command -v slurmctld >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi
mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /var/log/munge /var/lib/munge /run/munge 2>/dev/null || true
chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c /usr/sbin/munged 2>/dev/null \
  || /usr/sbin/munged --force

host=$(hostname -s)
cpus=$(nproc)
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=atomtrain-ci
SlurmctldHost=${host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=${host} CPUs=${cpus} RealMemory=${memory} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
pkill -x slurmctld 2>/dev/null || true
pkill -x slurmd 2>/dev/null || true
sleep 1
slurmctld
slurmd
for _ in $(seq 1 30); do
  if timeout 20 srun -N1 -n1 true 2>/dev/null; then
    echo "SLURM is up on ${host} (${cpus} CPUs)"; exit 0
  fi
  sleep 1
done
echo "SLURM did not come up; see /var/log/slurm" >&2
exit 1
