#!/usr/bin/env bash
# install-deps.sh: install the Debian 12 packages that slurm/devcluster.sh needs.
# Idempotent: does nothing when every binary (and the MySQL accounting plugin) is there.
#   sudo slurm/install-deps.sh
# Installs with --no-install-recommends, and stops the packages' postinst scripts from
# starting system-wide munge/mariadb/slurm services (devcluster.sh runs its own).
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server slurm-wlm-mysql-plugin iproute2 util-linux runc)
BINARIES=(slurmctld slurmd slurmdbd sbatch srun sacct sacctmgr sinfo scontrol munged mariadbd mariadb-install-db ip nsenter unshare setsid mknod flock runc)

have_all() {
    local b
    for b in "${BINARIES[@]}"; do command -v "$b" >/dev/null 2>&1 || return 1; done
    compgen -G '/usr/lib/*/slurm-wlm/accounting_storage_mysql.so' >/dev/null
}

if have_all; then
    echo "install-deps: all Slurm/munge/MariaDB binaries present; nothing to do"
    exit 0
fi
[[ $EUID -eq 0 ]] || { echo "install-deps: must run as root (apt-get); try: sudo $0" >&2; exit 2; }

export DEBIAN_FRONTEND=noninteractive
# Keep invoke-rc.d from starting the packages' services during the install (as in Docker images).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
fi
cleanup() { if ((made_policy)); then rm -f "$policy"; fi; }
trap cleanup EXIT

t0=$(date +%s)
if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
    apt-get update -q
fi
if ! apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"; then
    # Stale package lists (404s): refresh once and retry.
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
fi
have_all || { echo "install-deps: packages installed but some binaries are still missing" >&2; exit 1; }
echo "install-deps: installed ${PACKAGES[*]} in $(($(date +%s) - t0)) s"
