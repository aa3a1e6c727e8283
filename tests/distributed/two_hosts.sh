#!/usr/bin/env bash
# tests/distributed/two_hosts.sh: two "hosts" on one machine, for trying (and testing)
# a multi-node launch without a cluster: two Linux network namespaces joined
# by a veth pair, 10.77.0.1 and 10.77.0.2, and an rsh agent that OpenMPI uses
# instead of ssh to start its daemon on the other "host" (it enters that
# host's namespace). Ranks on different hosts talk over TCP on the veth, as
# they would over a network. Needs root (or CAP_SYS_ADMIN) and iproute2.
#
#   sudo tests/distributed/two_hosts.sh up [PREFIX]        make the namespaces (PREFIX: llmc)
#   tests/distributed/two_hosts.sh mpirun [PREFIX] ARGS... mpirun from host 1 with the hostfile
#                                                 and OpenMPI's TCP transport
#   sudo tests/distributed/two_hosts.sh down [PREFIX]      remove them
#   (rsh HOST CMD... is the agent OpenMPI calls; not for users)
#
# Example (2 ranks per host, tp inside a host, dp across):
#   sudo tests/distributed/two_hosts.sh up
#   tests/distributed/two_hosts.sh mpirun llmc -np 4 ./train_gpt --tp 2 -z 1
#   sudo tests/distributed/two_hosts.sh down
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}
shift || true

ns_of() {  # host address -> namespace
    case "$2" in
        10.77.0.1) echo "${1}_h1" ;;
        10.77.0.2) echo "${1}_h2" ;;
        *) echo "two_hosts.sh: unknown host $2" >&2; exit 1 ;;
    esac
}

case "$cmd" in
    up)
        p=${1:-llmc}
        ip netns add "${p}_h1"
        ip netns add "${p}_h2"
        ip link add "${p}_v1" type veth peer name "${p}_v2"
        ip link set "${p}_v1" netns "${p}_h1"
        ip link set "${p}_v2" netns "${p}_h2"
        ip netns exec "${p}_h1" ip addr add 10.77.0.1/24 dev "${p}_v1"
        ip netns exec "${p}_h2" ip addr add 10.77.0.2/24 dev "${p}_v2"
        for i in 1 2; do
            ip netns exec "${p}_h$i" ip link set "${p}_v$i" up
            ip netns exec "${p}_h$i" ip link set lo up
        done
        ;;
    down)
        p=${1:-llmc}
        ip netns del "${p}_h1" 2>/dev/null || true
        ip netns del "${p}_h2" 2>/dev/null || true
        ;;
    rsh)
        # OpenMPI calls: AGENT HOST COMMAND...; the prefix comes from the environment.
        host=$1
        shift
        exec ip netns exec "$(ns_of "${LLMC_HOSTS_PREFIX:-llmc}" "$host")" sh -c "$*"
        ;;
    mpirun)
        p=${1:-llmc}
        shift || true
        hostfile=$(mktemp)
        printf '10.77.0.1 slots=64\n10.77.0.2 slots=64\n' > "$hostfile"
        # Ranks are dealt to the hosts in blocks (by slot), so with -np 4 and
        # --map-by ppr:2:node ranks 0, 1 sit on host 1 and 2, 3 on host 2.
        rc=0
        LLMC_HOSTS_PREFIX=$p ip netns exec "${p}_h1" mpirun --hostfile "$hostfile" --map-by ppr:$((${MPI_PER_HOST:-2})):node \
            --mca plm_rsh_agent "$here/two_hosts.sh rsh" -x LLMC_HOSTS_PREFIX \
            --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "$@" || rc=$?
        rm -f "$hostfile"
        exit $rc
        ;;
    *)
        sed -n '2,20p' "$0"
        exit 2
        ;;
esac
