#!/usr/bin/env bash
# devcluster.sh: a real multi-node Slurm 22.05 cluster on this one machine.
#
#   sudo slurm/devcluster.sh up        # bring it up (a no-op when it is already up and healthy)
#   sudo slurm/devcluster.sh status    # sinfo; exit 0 when up, 3 when down or broken
#   sudo slurm/devcluster.sh down      # stop everything it started and delete its state
#   sudo slurm/devcluster.sh restart   # down + up (a fresh cluster, new job ids)
#   sudo slurm/devcluster.sh fault ctld-stop|ctld-start|ctld-freeze|ctld-thaw|node-kill NODE|node-start NODE
#                                      # faults for tests: controller down or hung, a node that dies
#
# Layout (defaults; see docs/devcluster.md):
#   root netns ("login")  cfbr0 10.213.0.1      sbatch/srun/squeue/sacct run here
#     ├─ veth ─ netns cfdc-ctl    eth0 10.213.0.2   hostname ctl    slurmctld, slurmdbd, mariadbd (127.0.0.1:3306)
#     ├─ veth ─ netns cfdc-node1  eth0 10.213.0.11  hostname node1  slurmd -N node1
#     └─ veth ─ netns cfdc-node2  eth0 10.213.0.12  hostname node2  slurmd -N node2
#   one munged in the root netns, on its own socket and key under the state folder.
#
# Environment:
#   NODES=2                         compute nodes (1..50)
#   CFDC_PREFIX=                    empty: the default cluster (the names above). A short name
#                                   P (1-4 of a-z0-9) makes a second, independent cluster beside it:
#                                   namespaces cfdcP-*, veths cfvP-*, bridge cfbrP, state
#                                   /tmp/clusterfsdp-devcluster-P, subnet 10.214.N (N from P),
#                                   lock /run/clusterfsdp-devcluster-P.lock, no /etc/slurm/slurm.conf
#   CFDC_STATE=/tmp/clusterfsdp-devcluster   state folder (conf, logs, spool, database)
#   CFDC_NET=10.213.0               first three octets of the private /24
#   CFDC_BRIDGE=cfbr0               bridge name
#   CFDC_CPUS=2 CFDC_MEM=4000 CFDC_GPUS=2   per node (CPUs, RealMemory MB, fake GPUs)
#   CFDC_INSTALL_ETC=1              also install the conf as /etc/slurm/slurm.conf (only when
#                                   that file is missing or was written by this script; default 0
#                                   with a CFDC_PREFIX)
#   CFDC_FIRST_JOB_ID=              force FirstJobId (default: derived from the clock)
#   CFDC_CRED_EXPIRE=10             AuthInfo cred_expire: a requeued job may start again after
#                                   this + 1 s (Slurm's default 120 gives 121 s)
#   CFDC_GRACE_TIME=30              GraceTime of the preemptable partition `low`: seconds a
#                                   preempted job has between SIGTERM and being requeued
#
# Exit codes: 0 ok, 1 failure, 2 not root / bad usage / unsafe state folder, 3 status: down,
# 4 missing packages.
set -euo pipefail
# Modes below are the ones this script sets, not whatever the calling shell had; secrets
# (the munge key, slurmdbd.conf) are written under umask 077, so they are never readable by others.
umask 022

# Daemons and ip(8) live in sbin, which a non-login root shell may lack.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin ;; esac
export PATH
SCRIPT_DIR=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
# CFDC_PREFIX names a second cluster; every name, folder, subnet and lock below derives from it,
# so two clusters never touch each other's namespaces, veths, bridge, state or lock (the default
# cluster, no prefix, keeps the names it always had). Checked first: it goes into names.
PREFIX=${CFDC_PREFIX:-}
if [[ -n $PREFIX && ! $PREFIX =~ ^[a-z0-9]{1,4}$ ]]; then
    echo "devcluster: error: CFDC_PREFIX must be 1-4 of a-z0-9 (it goes into interface names), not '$PREFIX'" >&2
    exit 2
fi
if [[ -z $PREFIX ]]; then
    DEFAULT_STATE=/tmp/clusterfsdp-devcluster DEFAULT_NET=10.213.0 DEFAULT_BRIDGE=cfbr0 DEFAULT_INSTALL_ETC=1
    NAME=clusterfsdp-devcluster
else
    # A subnet of its own per prefix (10.214.1-254), so two prefixes rarely need CFDC_NET.
    DEFAULT_STATE=/tmp/clusterfsdp-devcluster-$PREFIX DEFAULT_BRIDGE=cfbr$PREFIX DEFAULT_INSTALL_ETC=0
    DEFAULT_NET=10.214.$((1 + $(cksum <<<"$PREFIX" | cut -d' ' -f1) % 254))
    NAME=clusterfsdp-devcluster-$PREFIX
fi
STATE=${CFDC_STATE:-$DEFAULT_STATE}
NODES_GIVEN=0
[[ -n ${NODES:-} ]] && NODES_GIVEN=1
NODES=${NODES:-2}
NET=${CFDC_NET:-$DEFAULT_NET}
BRIDGE=${CFDC_BRIDGE:-$DEFAULT_BRIDGE}
CPUS=${CFDC_CPUS:-2}
MEM=${CFDC_MEM:-4000}
GPUS=${CFDC_GPUS:-2}
INSTALL_ETC=${CFDC_INSTALL_ETC:-$DEFAULT_INSTALL_ETC}
CRED_EXPIRE=${CFDC_CRED_EXPIRE:-10}
GRACE_TIME=${CFDC_GRACE_TIME:-30}
# The dash ends each prefix: the default's "cfdc-" never matches a second cluster's "cfdcP-".
NS_PREFIX=cfdc$PREFIX-
VETH_PREFIX=cfv$PREFIX-
ETC_CONF=/etc/slurm/slurm.conf
MARKER="clusterfsdp-devcluster: generated file; devcluster.sh may overwrite or delete it"
STATE_MARKER=.clusterfsdp-devcluster
BRIDGE_ALIAS=$NAME
LOCK_FILE=/run/$NAME.lock
DEB_PACKAGES="slurmctld slurmd slurm-client slurmdbd munge mariadb-server slurm-wlm-mysql-plugin iproute2 util-linux runc"
LOGIN_IP=$NET.1
CTL_IP=$NET.2

say() { echo "devcluster: $*"; }
die() { echo "devcluster: error: $1" >&2; exit "${2:-1}"; }
us() { local t=${EPOCHREALTIME/[.,]/}; echo "$((10#$t))"; }  # microseconds since the epoch
secs() { # secs START_US -> "1.23"
    local d=$(( $(us) - $1 ))
    printf '%d.%02d' $((d / 1000000)) $(((d % 1000000) / 10000))
}

usage() {
    echo "usage: devcluster.sh up|down|status|restart|fault WHAT [NODE]   (env: NODES=2 CFDC_PREFIX=$PREFIX CFDC_STATE=$STATE; see docs/devcluster.md)"
}

need_root() {
    [[ $EUID -eq 0 ]] || die "must run as root (namespaces, bridge, bind mounts); try: sudo $0 $1" 2
}

need_deps() {
    local missing=() b
    for b in slurmctld slurmd slurmdbd sbatch srun sacct sacctmgr sinfo scontrol munged mariadbd \
             mariadb-install-db ip nsenter unshare setsid mknod flock runc; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    compgen -G '/usr/lib/*/slurm-wlm/accounting_storage_mysql.so' >/dev/null || missing+=(accounting_storage_mysql.so)
    ((${#missing[@]} == 0)) ||
        die "missing ${missing[*]}; install the Debian packages: apt-get install -y --no-install-recommends $DEB_PACKAGES (or run slurm/install-deps.sh)" 4
}

check_settings() {
    [[ $NODES =~ ^[0-9]+$ ]] && ((NODES >= 1 && NODES <= 50)) || die "NODES must be 1..50, not '$NODES'" 2
    [[ $NET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "CFDC_NET must be three octets like 10.213.0, not '$NET'" 2
    [[ $CPUS =~ ^[0-9]+$ && $MEM =~ ^[0-9]+$ && $GPUS =~ ^[0-9]+$ ]] || die "CFDC_CPUS/CFDC_MEM/CFDC_GPUS must be integers" 2
    ((CPUS >= 1 && GPUS >= 1)) || die "CFDC_CPUS and CFDC_GPUS must be >= 1" 2
    [[ $CRED_EXPIRE =~ ^[0-9]+$ ]] && ((CRED_EXPIRE >= 5)) || die "CFDC_CRED_EXPIRE must be an integer >= 5" 2
    [[ $GRACE_TIME =~ ^[0-9]+$ ]] || die "CFDC_GRACE_TIME must be an integer >= 0" 2
    [[ $STATE == /* && $STATE != / && $STATE != *..* ]] || die "CFDC_STATE must be an absolute path, not '$STATE'" 2
    check_state_path
    if [[ -d $STATE && ! -e $STATE/$STATE_MARKER ]] && [[ -n $(ls -A "$STATE") ]]; then
        die "$STATE exists, is not empty and was not made by devcluster.sh; refusing to use or delete it" 2
    fi
}

# The state folder sits in /tmp by default, a folder every user can write to: another user
# could make it first (or a symlink there) and then read the munge key, or swap a file that
# root writes and runs. So (exit 2, one line):
#   - the state folder, when it exists, is a real folder (no symlink) owned by root and
#     writable by nobody else;
#   - every folder and symlink above it, as given and as resolved, is owned by root (or by the
#     user who ran sudo: a home folder), and a folder writable by others has the sticky bit
#     (like /tmp: others then cannot rename or delete what root made there).
check_state_path() {
    local uid mode type
    if [[ -L $STATE ]]; then
        die "CFDC_STATE $STATE is a symlink; refusing it (give a real folder)" 2
    fi
    if [[ -e $STATE ]]; then
        read -r uid mode type < <(stat -c '%u %a %F' -- "$STATE")
        [[ $type == directory ]] || die "CFDC_STATE $STATE is not a folder" 2
        ((uid == 0)) || die "CFDC_STATE $STATE is owned by uid $uid, not root; refusing to use or delete it" 2
        if ((8#$mode & 8#022)); then
            die "CFDC_STATE $STATE is writable by group or others (mode $mode); refusing it" 2
        fi
    fi
    check_above "$STATE"
    check_above "$(readlink -m -- "$STATE")"
}

# check_above PATH: the folders and symlinks above PATH (the existing ones) pass check_state_path's rule.
check_above() {
    local p=$1 uid mode type
    while [[ $p == /?* ]]; do
        p=${p%/*}
        [[ -n $p ]] || p=/
        [[ -e $p || -L $p ]] || continue
        read -r uid mode type < <(stat -c '%u %a %F' -- "$p")
        if ((uid != 0)) && [[ $uid != "${SUDO_UID:-0}" ]]; then
            die "$p (above CFDC_STATE) is owned by uid $uid, not root (or the user who ran sudo); refusing a state folder there" 2
        fi
        if [[ $type == directory ]] && ((8#$mode & 8#022 && !(8#$mode & 8#1000))); then
            die "$p (above CFDC_STATE) is writable by others without the sticky bit (mode $mode); refusing a state folder there" 2
        fi
    done
}

take_lock() {
    exec 9>"$LOCK_FILE"
    flock -w 300 9 || die "another devcluster.sh is still running (lock $LOCK_FILE)"
}

# ---------------------------------------------------------------- processes

# comm_of PID: set COMM to the command name, or to "" when the process is gone or a zombie.
# Builtins only (no forks): cleanup calls it for every process on the machine.
comm_of() {
    local stat rest
    COMM=""
    { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 0
    rest=${stat##*) }
    [[ ${rest%% *} == Z || ${rest%% *} == X ]] && return 0
    { read -r COMM <"/proc/$1/comm"; } 2>/dev/null || COMM=""
    return 0
}

# alive NAME: the daemon that we started under NAME (pid file $STATE/pids/NAME.pid) is running.
alive() {
    local f=$STATE/pids/$1.pid pid
    [[ -r $f ]] || return 1
    read -r pid <"$f" || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    comm_of "$pid"
    [[ -n $COMM && $COMM == "$(expected_comm "$1")"* ]]
}

expected_comm() {
    case $1 in
        slurmd-*) echo slurmd ;;
        *) echo "$1" ;;
    esac
}

daemon_names() {
    local n names=(munged mariadbd slurmdbd slurmctld)
    for ((n = 1; n <= NODES; n++)); do names+=("slurmd-node$n"); done
    echo "${names[@]}"
}

# Start a command in a namespace, with its own UTS (hostname) and mount namespace, where
# /etc/hosts and /etc/resolv.conf are bind mounts of the namespace's own files. Not
# `ip netns exec`: it remounts /sys, which hides /sys/fs/cgroup and makes slurmd abort.
# The chain setsid -> nsenter -> unshare -> sh -> exec keeps one pid, so $! is the daemon.
start_in_ns() { # start_in_ns NAME NETNS HOSTNAME CMD...
    local name=$1 ns=$2 host=$3
    shift 3
    setsid nsenter --net="/run/netns/$ns" -- unshare --uts --mount --propagation private -- \
        /bin/sh -c 'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && hostname "$3" && shift 3 && exec "$@"' \
        sh "$STATE/etc/hosts" "$STATE/etc/resolv.conf" "$host" "$@" \
        </dev/null >>"$STATE/log/$name.out" 2>&1 9>&- &
    echo $! >"$STATE/pids/$name.pid"
    disown $!
}

# wait_for DESCRIPTION TIMEOUT_S LOGFILE COMMAND...: poll (sleep 0.05 s) until COMMAND succeeds.
wait_for() {
    local what=$1 timeout=$2 logf=$3 t0
    shift 3
    t0=$(us)
    until "$@" >/dev/null 2>&1; do
        if (($(us) - t0 > timeout * 1000000)); then
            echo "devcluster: error: timed out after ${timeout}s waiting for $what" >&2
            [[ -n $logf && -r $logf ]] && { echo "--- last lines of $logf:" >&2; tail -n 20 "$logf" >&2; }
            return 1
        fi
        sleep 0.05
    done
}

# kill_and_wait SIGNAL TIMEOUT_S PID...: send SIGNAL, wait up to TIMEOUT_S for all to go,
# then SIGKILL what is left. Zombies count as gone (PID 1 may reap them lazily).
kill_and_wait() {
    local sig=$1 timeout=$2 t0 pid left
    shift 2
    (($# > 0)) || return 0
    kill "-$sig" "$@" 2>/dev/null || true
    t0=$(us)
    while :; do
        left=()
        for pid in "$@"; do
            comm_of "$pid"
            if [[ -n $COMM ]]; then left+=("$pid"); fi
        done
        ((${#left[@]} == 0)) && return 0
        if (($(us) - t0 > timeout * 1000000)); then
            kill -KILL "${left[@]}" 2>/dev/null || true
            return 0
        fi
        sleep 0.05
    done
}

# ---------------------------------------------------------------- teardown

our_namespaces() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep "^${NS_PREFIX}" || true
}

# our_bridge: $BRIDGE exists and is ours (its alias, or our address on it).
our_bridge() {
    local info
    info=$(ip -d addr show dev "$BRIDGE" 2>/dev/null) || return 1
    has_our_alias <<<"$info" || grep -qF "inet $LOGIN_IP/24 " <<<"$info"
}

# has_our_alias: a line of stdin ends in exactly our bridge alias (the default cluster's alias is a
# prefix of a second cluster's: a plain substring match would take the other cluster's bridge).
has_our_alias() { grep -qE "alias ${BRIDGE_ALIAS}\$"; }

# Stop what a previous bring-up left (pid files, namespaces, bridge, state). Used by
# `down` and, to recover from a crash, at the start of `up`.
cleanup() {
    local f name pid pids=() dbpids=() munge_pids=() ns nspids t0

    # 1. daemons we started, by pid file (checking the command name, so a reused pid is spared).
    if [[ -d $STATE/pids ]]; then
        for f in "$STATE"/pids/*.pid; do
            [[ -e $f ]] || continue
            name=$(basename "$f" .pid)
            read -r pid <"$f" || continue
            [[ $pid =~ ^[0-9]+$ ]] || continue
            comm_of "$pid"
            [[ -n $COMM && $COMM == "$(expected_comm "$name")"* ]] || continue
            case $name in
                munged) munge_pids+=("$pid") ;;
                mariadbd | slurmdbd) dbpids+=("$pid") ;;
                *) pids+=("$pid") ;;
            esac
        done
    fi
    # slurmctld and slurmd first (slurmctld stops its slurmscriptd itself), then the database.
    kill_and_wait TERM 5 "${pids[@]}"
    kill_and_wait TERM 3 "${dbpids[@]}"

    # 2. whatever still runs in our namespaces: job steps, tasks, strays of a crashed run.
    for ns in $(our_namespaces); do
        nspids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
        # shellcheck disable=SC2086
        if [[ -n ${nspids// /} ]]; then kill_and_wait KILL 3 $nspids; fi
    done

    # 3. munged: by pid file, or (state folder lost) by its exact socket path on the command line.
    if ((${#munge_pids[@]} == 0)); then
        for f in /proc/[0-9]*/cmdline; do
            pid=${f#/proc/}
            pid=${pid%/cmdline}
            comm_of "$pid"
            [[ $COMM == munged ]] || continue
            if tr '\0' ' ' <"$f" 2>/dev/null | grep -qF -- "--socket=$STATE/munge/munge.socket.2"; then
                munge_pids+=("$pid")
            fi
        done
    fi
    kill_and_wait TERM 3 "${munge_pids[@]}"

    # 4. namespaces (their /run/netns mounts), veths, bridge. `ip netns del` is asynchronous.
    for ns in $(our_namespaces); do ip netns del "$ns" 2>/dev/null || true; done
    if our_bridge; then ip link del "$BRIDGE" 2>/dev/null || true; fi
    # ...and a bridge of ours under another name (CFDC_BRIDGE changed since the last `up`).
    for f in $(ip -o link show 2>/dev/null | grep -E "alias ${BRIDGE_ALIAS}\$" | awk -F': ' '{print $2}' | sed 's/@.*//'); do
        ip link del "$f" 2>/dev/null || true
    done
    t0=$(us)
    while ip -o link show 2>/dev/null | grep -q ": ${VETH_PREFIX}"; do
        for f in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^${VETH_PREFIX}" || true); do
            ip link del "$f" 2>/dev/null || true
        done
        (($(us) - t0 > 5000000)) && { say "warning: veths still present after 5 s"; break; }
        sleep 0.05
    done

    # 5. state folder (only ours) and the /etc/slurm/slurm.conf we installed (this cluster's: its
    #    state folder in it; another cluster's copy stays).
    if [[ -e $STATE/$STATE_MARKER ]]; then rm -rf --one-file-system "$STATE"; fi
    if etc_conf_is_ours && grep -qxF "StateSaveLocation=$STATE/ctld" "$ETC_CONF"; then rm -f "$ETC_CONF"; fi
}

# ---------------------------------------------------------------- bring-up

render() { # render TEMPLATE OUT: replace @KEY@ with the values below
    local text
    text=$(<"$SCRIPT_DIR/$1")
    text=${text//@MARKER@/$MARKER}
    text=${text//@GENERATED_AT@/$(date -Is)}
    text=${text//@STATE@/$STATE}
    text=${text//@CTL_IP@/$CTL_IP}
    text=${text//@CRED_EXPIRE@/$CRED_EXPIRE}
    text=${text//@GRACE_TIME@/$GRACE_TIME}
    text=${text//@FIRST_JOB_ID@/$FIRST_JOB_ID}
    text=${text//@DEF_MEM_PER_CPU@/$((MEM / CPUS))}
    text=${text//@NODE_LINES@/$NODE_LINES}
    text=${text//@NODE_RANGE@/$NODE_RANGE}
    text=${text//@GPU_MAX_INDEX@/$((GPUS - 1))}
    printf '%s\n' "$text" >"$2"
}

check_subnet_free() {
    local used
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        die "a network interface named $BRIDGE exists and is not ours; set CFDC_BRIDGE to another name"
    fi
    used=$(ip -4 -o addr show 2>/dev/null | awk -v net="$NET." 'index($4, net) == 1 {print $2}' | sort -u | tr '\n' ' ')
    [[ -z $used ]] || die "the subnet $NET.0/24 is already used on: $used; set CFDC_NET=10.x.y to another /24"
    used=$(ip -4 route show 2>/dev/null | awk -v net="$NET." 'index($1, net) == 1' | head -n 1)
    [[ -z $used ]] || die "a route already covers $NET.0/24 ($used); set CFDC_NET=10.x.y to another /24"
}

# The state folder and its subfolders, with their modes. Checked again after the mkdir: cleanup
# deleted it, and another user may have made it in between (mkdir then fails; the check refuses).
#   755: the state folder, munge/ (munged refuses to start unless its socket folder and every
#        folder above it are executable by all), spool/ (slurmd makes each job's folder there,
#        owned by the job's user), etc/, dev/, log/, pids/, run/ (nothing secret; clients and
#        jobs of other users read slurm.conf, env.sh and the hosts file).
#   700: mysql/ (its root user has no password and mariadbd runs as root: anyone who reaches
#        mysqld.sock is MariaDB's root, whose FILE privilege (LOAD_FILE, SELECT ... INTO OUTFILE;
#        secure_file_priv is unset) reads and writes files as root), ctld/ (slurmctld's state,
#        every job's script and environment; slurmctld makes its own files 600 too).
make_state_folders() {
    local n
    mkdir -p -- "$(dirname -- "$STATE")"
    mkdir -m 755 -- "$STATE" 2>/dev/null || true
    check_state_path
    chmod 755 "$STATE"
    touch "$STATE/$STATE_MARKER"
    mkdir -m 755 -- "$STATE"/{etc,log,pids,run,spool,dev,munge}
    mkdir -m 700 -- "$STATE"/{ctld,mysql}
    for ((n = 1; n <= NODES; n++)); do mkdir -m 755 -- "$STATE/spool/node$n"; done
}

# A fresh munge key per bring-up, used only by our own munged: created unreadable by others.
write_munge_key() {
    (umask 077 && head -c 1024 /dev/urandom >"$STATE/munge/munge.key")
    chmod 400 "$STATE/munge/munge.key"
}

write_files() {
    local n hostname_real
    make_state_folders

    # Per-namespace /etc/hosts: every name resolves to its bridge IP (also as ::ffff:, which
    # torch's dual-stack TCPStore sees); the login host as `login` and its real hostname.
    hostname_real=$(hostname 2>/dev/null || echo "")
    case $hostname_real in localhost | login | ctl | node[0-9]* | "") hostname_real="" ;; esac
    {
        echo "# $MARKER (bind-mounted over /etc/hosts inside the devcluster namespaces only)"
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        echo "$LOGIN_IP login $hostname_real"
        echo "$CTL_IP ctl"
        for ((n = 1; n <= NODES; n++)); do echo "$NET.$((10 + n)) node$n"; done
        echo "::ffff:$LOGIN_IP login $hostname_real"
        echo "::ffff:$CTL_IP ctl"
        for ((n = 1; n <= NODES; n++)); do echo "::ffff:$NET.$((10 + n)) node$n"; done
    } >"$STATE/etc/hosts"
    # No DNS inside: a lookup that misses the hosts file fails at once, locally.
    printf '# %s\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n' "$MARKER" >"$STATE/etc/resolv.conf"

    NODE_LINES=""
    for ((n = 1; n <= NODES; n++)); do
        NODE_LINES+="NodeName=node$n NodeHostname=node$n NodeAddr=$NET.$((10 + n)) CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM Gres=gpu:$GPUS State=UNKNOWN"$'\n'
    done
    NODE_LINES=${NODE_LINES%$'\n'}
    if ((NODES == 1)); then NODE_RANGE=node1; else NODE_RANGE="node[1-$NODES]"; fi
    # Job ids never repeat across bring-ups: FirstJobId counts tenths of a second (mod ~69 days)
    # from 1,000,000, so a stale submitit folder from an earlier cluster never matches a new job.
    if [[ -n ${CFDC_FIRST_JOB_ID:-} ]]; then
        FIRST_JOB_ID=$CFDC_FIRST_JOB_ID
    else
        FIRST_JOB_ID=$((1000000 + ($(us) / 100000) % 60000000))
    fi

    render slurm.conf.in "$STATE/slurm.conf"
    (umask 077 && render slurmdbd.conf.in "$STATE/slurmdbd.conf")  # slurmdbd wants it 600
    render gres.conf.in "$STATE/gres.conf"
    render oci.conf.in "$STATE/oci.conf"  # srun --container=BUNDLE through runc (tests/test_slurm_oci.py)

    # Fake GPUs: character devices with /dev/null's major/minor.
    for ((n = 0; n < GPUS; n++)); do mknod -m 666 "$STATE/dev/fakegpu$n" c 1 3; done

    write_munge_key

    local names="" ips=""
    for ((n = 1; n <= NODES; n++)); do names+="node$n "; ips+="$NET.$((10 + n)) "; done
    local nslist="${NS_PREFIX}ctl"
    for ((n = 1; n <= NODES; n++)); do nslist+=" ${NS_PREFIX}node$n"; done
    cat >"$STATE/env.sh" <<EOF
# Source this to use the devcluster from the root ("login") namespace:  . $STATE/env.sh
# (Not needed when $ETC_CONF was installed by devcluster.sh: plain sbatch finds it.)
export SLURM_CONF=$STATE/slurm.conf
export CFDC_STATE=$STATE
export CFDC_PREFIX=$PREFIX
export CFDC_NODES=$NODES
export CFDC_NODE_NAMES="${names% }"
export CFDC_NODE_IPS="${ips% }"
export CFDC_CTL_IP=$CTL_IP
export CFDC_LOGIN_IP=$LOGIN_IP
export CFDC_BRIDGE=$BRIDGE
export CFDC_NETNS="$nslist"
export CFDC_PARTITION=debug
export CFDC_CPUS_PER_NODE=$CPUS
export CFDC_MEM_PER_NODE=$MEM
export CFDC_GPUS_PER_NODE=$GPUS
export CFDC_FIRST_JOB_ID=$FIRST_JOB_ID
EOF
}

setup_network() {
    local ns n
    ip link add "$BRIDGE" type bridge
    ip link set "$BRIDGE" alias "$BRIDGE_ALIAS"
    ip addr add "$LOGIN_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    add_ns() { # add_ns SHORTNAME IP
        local ns=$NS_PREFIX$1 veth=$VETH_PREFIX$1
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$BRIDGE" up
        ip -n "$ns" -batch - <<EOF
link set lo up
addr add $2/24 dev eth0
link set eth0 up
EOF
    }
    add_ns ctl "$CTL_IP"
    for ((n = 1; n <= NODES; n++)); do add_ns "node$n" "$NET.$((10 + n))"; done
}

# etc_conf_is_ours: /etc/slurm/slurm.conf was written by devcluster.sh (some cluster's, maybe not this one's).
etc_conf_is_ours() { [[ -f $ETC_CONF ]] && head -n 1 "$ETC_CONF" | grep -qF "$MARKER"; }

install_etc_conf() {
    [[ $INSTALL_ETC == 1 ]] || { ETC_NOTE="not installed (CFDC_INSTALL_ETC=$INSTALL_ETC)"; return 0; }
    if [[ -e $ETC_CONF ]] && ! etc_conf_is_ours; then
        ETC_NOTE="left alone: $ETC_CONF exists and is not ours; use: . $STATE/env.sh"
        return 0
    fi
    mkdir -p "$(dirname "$ETC_CONF")"
    cp "$STATE/slurm.conf" "$ETC_CONF.cfdc-tmp"
    mv -f "$ETC_CONF.cfdc-tmp" "$ETC_CONF"
    ETC_NOTE="installed as $ETC_CONF (plain sbatch/srun work without SLURM_CONF)"
}

ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }

start_ctld() { start_in_ns slurmctld "${NS_PREFIX}ctl" ctl env SLURM_CONF="$STATE/slurm.conf" slurmctld -D -i; }

start_slurmd() { # start_slurmd NODE
    start_in_ns "slurmd-$1" "${NS_PREFIX}$1" "$1" env SLURM_CONF="$STATE/slurm.conf" slurmd -D -N "$1"
}

nodes_idle() { # all nodes idle (or mixed/alloc: already running something)
    local out
    out=$(sinfo -h -N -o '%N %T' 2>/dev/null) || return 1  # one line per node and partition
    [[ $(grep -E ' (idle|mixed|allocated)$' <<<"$out" | sort -u | wc -l) -eq $NODES ]]
}

cluster_registered() {
    sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx devcluster &&
        sacct -n -X -S now -o jobid >/dev/null 2>&1
}

healthy() {
    [[ -e $STATE/$STATE_MARKER && -r $STATE/env.sh ]] || return 1
    local saved_nodes name
    saved_nodes=$(sed -n 's/^export CFDC_NODES=//p' "$STATE/env.sh")
    [[ $saved_nodes =~ ^[0-9]+$ ]] || return 1
    NODES=$saved_nodes
    for name in $(daemon_names); do alive "$name" || return 1; done
    SLURM_CONF=$STATE/slurm.conf sinfo -h >/dev/null 2>&1
}

# fail_up MESSAGE: keep the logs (the state folder is deleted), clean up, exit 1.
fail_up() {
    UP_RUNNING=0
    keep_logs
    cleanup
    die "$1 (logs kept in ${STATE}-failed-logs)"
}

# keep_logs: copy the logs next to the state folder (in /tmp by default, where other users
# write too): into a folder made here, never into one (or a symlink) that someone put there.
keep_logs() {
    local keep=${STATE}-failed-logs
    rm -rf --one-file-system -- "$keep"
    mkdir -m 755 -- "$keep" 2>/dev/null || { say "warning: $keep reappeared; logs not kept"; return 0; }
    if [[ -d $STATE/log ]]; then cp -r -- "$STATE/log/." "$keep/" 2>/dev/null || true; fi
}

# Bring-up stopped by anything else (a failing command under set -e, Ctrl-C): same clean-up.
up_exit_trap() {
    local rc=$?
    if [[ ${UP_RUNNING:-0} == 1 ]]; then
        UP_RUNNING=0
        echo "devcluster: error: bring-up interrupted (exit $rc); cleaning up (logs kept in ${STATE}-failed-logs)" >&2
        keep_logs
        cleanup
    fi
}

cmd_up() {
    need_root up
    need_deps
    check_settings
    take_lock
    local want_nodes=$NODES nodes_given=${NODES_GIVEN:-0}
    if healthy && [[ $nodes_given == 0 || $NODES == "$want_nodes" ]]; then
        say "already up ($NODES nodes); state $STATE. Use 'restart' for a fresh cluster."
        SLURM_CONF=$STATE/slurm.conf sinfo
        return 0
    fi
    if [[ -e $STATE/$STATE_MARKER ]]; then
        if [[ $NODES != "$want_nodes" ]]; then
            say "rebuilding: the cluster in $STATE has $NODES nodes, not $want_nodes"
        else
            say "rebuilding: the cluster in $STATE is not healthy (a daemon stopped, or the machine rebooted)"
        fi
    fi
    NODES=$want_nodes
    local t0 t1 n
    t0=$(us)
    t1=$t0
    UP_RUNNING=1
    trap up_exit_trap EXIT
    trap 'exit 130' INT TERM
    cleanup
    local t_clean
    t_clean=$(secs "$t1")
    t1=$(us)
    check_subnet_free
    write_files
    export SLURM_CONF=$STATE/slurm.conf

    # The database's data folder takes the longest to make: do it while the rest starts.
    mariadb-install-db --no-defaults --user=root --datadir="$STATE/mysql/data" \
        --auth-root-authentication-method=normal --skip-test-db --skip-name-resolve \
        </dev/null >"$STATE/log/mariadb-install-db.log" 2>&1 9>&- &
    local install_pid=$!

    setup_network
    local t_net
    t_net=$(secs "$t1")
    t1=$(us)

    setsid munged -F --socket="$STATE/munge/munge.socket.2" --key-file="$STATE/munge/munge.key" \
        --pid-file="$STATE/munge/munged.pid" --seed-file="$STATE/munge/munged.seed" \
        --log-file="$STATE/log/munged.log" --num-threads=4 \
        </dev/null >>"$STATE/log/munged.out" 2>&1 9>&- &
    echo $! >"$STATE/pids/munged.pid"
    disown $!
    wait_for "munged" 20 "$STATE/log/munged.log" test -S "$STATE/munge/munge.socket.2" ||
        { fail_up "munged did not start"; }

    wait "$install_pid" || { tail -n 20 "$STATE/log/mariadb-install-db.log" >&2; fail_up "mariadb-install-db failed"; }
    start_in_ns mariadbd "${NS_PREFIX}ctl" ctl mariadbd --no-defaults --user=root \
        --datadir="$STATE/mysql/data" --socket="$STATE/mysql/mysqld.sock" \
        --pid-file="$STATE/mysql/mariadbd.pid" --log-error="$STATE/log/mariadb.log" \
        --bind-address=127.0.0.1 --port=3306 --skip-name-resolve --skip-log-bin \
        --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
        --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-flush-method=nosync --max-connections=100
    wait_for "mariadbd" 60 "$STATE/log/mariadb.log" test -S "$STATE/mysql/mysqld.sock" ||
        { fail_up "mariadbd did not start"; }
    local t_db
    t_db=$(secs "$t1")
    t1=$(us)

    start_in_ns slurmdbd "${NS_PREFIX}ctl" ctl env SLURM_CONF="$STATE/slurm.conf" slurmdbd -D
    wait_for "slurmdbd" 60 "$STATE/log/slurmdbd.log" grep -q "slurmdbd version .* started" "$STATE/log/slurmdbd.log" ||
        { fail_up "slurmdbd did not start"; }
    local t_dbd
    t_dbd=$(secs "$t1")
    t1=$(us)

    start_ctld
    # slurmd registers at once with a controller that answers; otherwise it waits to be pinged.
    wait_for "slurmctld" 60 "$STATE/log/slurmctld.log" ctld_up || fail_up "slurmctld did not start"
    for ((n = 1; n <= NODES; n++)); do start_slurmd "node$n"; done
    wait_for "all $NODES nodes idle (sinfo)" 60 "$STATE/log/slurmctld.log" nodes_idle ||
        { fail_up "nodes did not come up (see slurmd-node*.log, slurmctld.log)"; }
    local t_nodes
    t_nodes=$(secs "$t1")
    t1=$(us)
    wait_for "the cluster in the accounting database (sacctmgr)" 60 "$STATE/log/slurmdbd.log" cluster_registered ||
        { fail_up "accounting did not come up"; }
    local t_acct
    t_acct=$(secs "$t1")

    ETC_NOTE=""
    install_etc_conf
    local name
    for name in $(daemon_names); do alive "$name" || { fail_up "$name died during bring-up"; }; done

    UP_RUNNING=0
    sinfo
    say "up in $(secs "$t0") s (cleanup $t_clean, files+network $t_net, munge+mariadb $t_db, slurmdbd $t_dbd, slurmctld+slurmd $t_nodes, accounting $t_acct)"
    say "controller ctl $CTL_IP, nodes node1..node$NODES at $NET.11.., login (this namespace) $LOGIN_IP on $BRIDGE"
    say "partition debug, $CPUS CPUs / ${MEM} MB / $GPUS fake GPUs per node, FirstJobId $FIRST_JOB_ID"
    say "slurm.conf $STATE/slurm.conf: $ETC_NOTE"
    say "to use it: . $STATE/env.sh   (exports SLURM_CONF), then sbatch/srun/squeue/sacct as usual"
}

cmd_down() {
    need_root down
    check_settings
    take_lock
    local t0
    t0=$(us)
    if [[ -r $STATE/env.sh ]]; then
        local saved
        saved=$(sed -n 's/^export CFDC_NODES=//p' "$STATE/env.sh")
        [[ $saved =~ ^[0-9]+$ ]] && NODES=$saved
    fi
    cleanup
    say "down in $(secs "$t0") s"
}

cmd_status() {
    need_root status
    check_settings
    if healthy; then
        SLURM_CONF=$STATE/slurm.conf sinfo
        say "up: $NODES nodes, state $STATE, SLURM_CONF=$STATE/slurm.conf"
        return 0
    fi
    if [[ -e $STATE/$STATE_MARKER ]]; then
        local name bad=()
        if [[ -r $STATE/env.sh ]]; then
            local saved
            saved=$(sed -n 's/^export CFDC_NODES=//p' "$STATE/env.sh")
            [[ $saved =~ ^[0-9]+$ ]] && NODES=$saved
        fi
        for name in $(daemon_names); do alive "$name" || bad+=("$name"); done
        say "down (broken): not running: ${bad[*]:-none, but sinfo fails}; run 'devcluster.sh up' to recover"
    else
        local stale
        stale=$(our_namespaces | tr '\n' ' ')
        if [[ -n $stale ]]; then
            say "down (no state at $STATE, but stale namespaces: $stale; 'devcluster.sh down' or 'up' cleans them)"
        else
            say "down (no state at $STATE)"
        fi
    fi
    return 3
}

# Faults for tests (docs/devcluster.md, "Faults"): a controller that is down or hangs, a node that dies.
cmd_fault() {
    need_root fault
    check_settings
    healthy_enough || die "the cluster in $STATE is not up" 3
    export SLURM_CONF=$STATE/slurm.conf
    local what=${1:-} node=${2:-} pid
    case $what in
        ctld-stop | ctld-freeze | ctld-thaw)
            read -r pid <"$STATE/pids/slurmctld.pid"
            comm_of "$pid"
            [[ $COMM == slurmctld ]] || die "slurmctld is not running" 3
            case $what in
                ctld-stop) kill_and_wait TERM 15 "$pid" ;;  # it saves its state (jobs, queue) first
                ctld-freeze) kill -STOP "$pid" ;;
                ctld-thaw) kill -CONT "$pid" ;;
            esac
            ;;
        ctld-start)
            alive slurmctld && die "slurmctld is already running" 2
            start_ctld
            wait_for "slurmctld" 60 "$STATE/log/slurmctld.log" ctld_up || die "slurmctld did not start"
            ;;
        node-kill | node-start)
            [[ $node =~ ^node[0-9]+$ && -e /run/netns/$NS_PREFIX$node ]] || die "no node '$node'" 2
            if [[ $what == node-kill ]]; then
                # shellcheck disable=SC2046
                kill_and_wait KILL 5 $(ip netns pids "$NS_PREFIX$node")
            else
                alive "slurmd-$node" && die "slurmd on $node is already running" 2
                start_slurmd "$node"
                # ReturnToService=2: the node leaves DOWN once its slurmd registers.
                wait_for "$node idle" 90 "$STATE/log/slurmd-$node.log" node_idle "$node" ||
                    die "$node did not come back (see slurmd-$node.log)"
            fi
            ;;
        *) die "usage: devcluster.sh fault ctld-stop|ctld-start|ctld-freeze|ctld-thaw|node-kill NODE|node-start NODE" 2 ;;
    esac
    say "fault $what${node:+ $node}: done"
}

# healthy_enough: our state folder and env.sh exist (a fault may have stopped daemons).
healthy_enough() { [[ -e $STATE/$STATE_MARKER && -r $STATE/env.sh ]]; }

node_idle() { sinfo -h -N -n "$1" -o '%T' 2>/dev/null | grep -qxE 'idle|mixed|allocated'; }

main() {
    local cmd=${1:-}
    case $cmd in
        up) cmd_up ;;
        down) cmd_down ;;
        status) cmd_status ;;
        restart) cmd_down && cmd_up ;;
        fault) shift; cmd_fault "$@" ;;
        -h | --help | help) usage ;;
        *) usage >&2; exit 2 ;;
    esac
}

# Sourced (the tests call single functions such as write_files): define, run nothing.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then main "$@"; fi
