#!/usr/bin/python3
# tests/distributed/test_multinode.py: one job over two hosts, for real, on one machine:
# tests/distributed/two_hosts.sh makes two network namespaces joined by a veth pair
# (10.77.0.1, 10.77.0.2) and mpirun starts the second host's ranks through an
# rsh agent that enters its namespace; ranks on different hosts talk over
# OpenMPI's TCP transport. Checks, against independent truths:
#   - the ranks run where the hostfile puts them (two per host), each host
#     seeing only its own address;
#   - dp=2 x tp=2 ZeRO-1 over the two hosts (tp inside a host, dp across)
#     gives the losses and final weights of the same job on one host and of
#     one process (fp64 <= 1e-10), with sharded checkpoints written from both
#     hosts and read back whole;
#   - each host counts its own ranks (2 per node: the threads line).
# Needs root (network namespaces); without it the test says so and counts
# nothing. Last line: "N passed, N failed".
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import ENV, ROOT, TRAIN, Checks, metrics, read_checkpoint, rel, run_suite, train, write_shard

check = Checks()
HOSTS = os.path.join(ROOT, "tests", "distributed", "two_hosts.sh")
PREFIX = f"llmc{os.getpid() % 100000}"


def two_hosts(args, timeout=300, env=ENV):
    p = subprocess.run([HOSTS, "mpirun", PREFIX] + args, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=env)
    return p.returncode, p.stdout, p.stderr


def suite(tmp):
    data = os.path.join(tmp, "data.bin")
    write_shard(data, np.random.default_rng(17).integers(0, 97, 40000))
    probe = ["sh", "-c", 'echo "rank $OMPI_COMM_WORLD_RANK at $(ip -o -4 addr show | grep -o "10.77.0.[0-9]")"']
    rc, out, err = two_hosts(["-np", "4"] + probe, timeout=60)
    where = sorted(l for l in out.splitlines() if l.startswith("rank"))
    check(rc == 0 and where == ["rank 0 at 10.77.0.1", "rank 1 at 10.77.0.1", "rank 2 at 10.77.0.2",
                                "rank 3 at 10.77.0.2"], f"ranks placed {where}: {err[-300:]!r}")
    print("  " + "; ".join(where))
    args = ["-e", "L=2,C=32,NH=4,V=97,Vp=97,T=64", "-i", data, "-j", "", "-t", "16", "-b", "8", "-d", "256", "-x", "6",
            "-s", "0", "--dtype", "fp64", "-n", "6", "-c", "0.1", "-l", "3e-3"]
    one_proc, one_host, two = (os.path.join(tmp, d) for d in ("one_process", "one_host", "two_hosts"))
    r0 = train(0, args + ["-b", "16", "-o", one_proc])
    r1 = train(4, args + ["--tp", "2", "-z", "1", "-o", one_host])
    r2 = two_hosts(["-np", "4", TRAIN] + args + ["--tp", "2", "-z", "1", "-o", two])
    if not check(r0[0] == 0 and r1[0] == 0 and r2[0] == 0, f"runs: {r1[2][-200:]!r} {r2[2][-300:]!r}"):
        return
    l0, l1, l2 = ([m["loss"] for m in metrics(d)] for d in (one_proc, one_host, two))
    w0, w1, w2 = (read_checkpoint(d, 6)[0] for d in (one_proc, one_host, two))
    print(f"  dp=2 x tp=2 ZeRO-1 over two hosts: losses rel {rel(l2, l1):.2e} to one host, {rel(l2, l0):.2e} to one "
          f"process; final weights {rel(w2, w1):.2e}, {rel(w2, w0):.2e}")
    check(len(l2) == 6 and rel(l2, l1) <= 1e-10 and rel(l2, l0) <= 1e-10, "losses over two hosts differ")
    check(rel(w2, w1) <= 1e-10 and rel(w2, w0) <= 1e-10, "final weights over two hosts differ")
    # Without OMP_NUM_THREADS each rank takes its share of its own host's cores.
    env = {k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}
    rc, out, err = two_hosts(["-np", "4", TRAIN] + args[:-2] + ["-x", "1", "--tp", "2"], env=env)
    check(rc == 0 and "2 rank(s) on this node" in out, f"host 1 does not count 2 ranks on its node: {err[-200:]!r}")


def main():
    if os.geteuid() != 0 or subprocess.run([HOSTS, "up", PREFIX], capture_output=True).returncode != 0:
        subprocess.run([HOSTS, "down", PREFIX], capture_output=True)
        print("SKIPPED: network namespaces need root (CAP_SYS_ADMIN) and iproute2")
        print("0 passed, 0 failed")
        sys.exit(0)
    try:
        run_suite(check, "llmc_multinode_", suite)
    finally:
        subprocess.run([HOSTS, "down", PREFIX], capture_output=True)


if __name__ == "__main__":
    main()
