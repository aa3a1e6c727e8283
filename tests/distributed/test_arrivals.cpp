// tests/distributed/test_arrivals.cpp: which ranks reached a call
// (llmc/comm/arrivals.h), under mpirun -np 3, against counts set by hand:
// rank 1 issues one collective fewer than the others, and rank 0 sends to
// rank 2, which never posts the receive. After every rank has told its
// counts (from a second thread where MPI allows it, as the NCCL watchdog's
// thread does; from the main thread otherwise), each rank's line for its
// own third collective names rank 1 alone, rank 0's line for its send names
// rank 2, and a wait begun after the notes came names every other rank as
// waiting in no collective. With fewer than 3 ranks it says so and counts
// nothing. Last line: "N passed, N failed".
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "llmc/comm/dist.h"
#ifdef LLMC_MPI
#include "llmc/comm/arrivals.h"
#endif

int main(int argc, char** argv) {
    dist_init(&argc, &argv, MpiStart::always);
    int pass = 0, fail = 0;
    const int rank = dist_world_rank(), world = dist_world_size();
    auto ck = [&](bool ok, const std::string& what) {
        if (ok) {
            pass++;
        } else {
            fail++;
            std::printf("FAIL rank %d: %s\n", rank, what.c_str());
        }
    };
#ifdef LLMC_MPI
    if (world == 3) {
        {
            Arrivals a(MPI_COMM_WORLD, "world");
            Arrivals::Expect third{};
            for (int i = 0; i < (rank == 1 ? 2 : 3); i++) third = a.collective();
            Arrivals::Expect send{};
            if (rank == 0) send = a.send_to(2);
            const double before = arrivals_now();
            // Tell, where the NCCL watchdog does: on another thread.
            if (dist_mpi_threads()) {
                std::thread t([] { Arrivals::tell_all(true); });
                t.join();
            } else {
                Arrivals::tell_all(true);
            }
            MPI_Barrier(MPI_COMM_WORLD);  // every note is sent (eagerly) before anyone reads
            std::string line;
            for (int tries = 0; tries < 200; tries++) {
                a.drain();
                line = a.late({third}, before);
                if (line.find("waiting in no collective") == std::string::npos) break;
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
            if (rank != 1) {
                ck(a.what({third}) == " (its collective 3)", "what: '" + a.what({third}) + "'");
                ck(line == "ranks that did not arrive: 1 (world rank 1)", "its third collective: '" + line + "'");
            } else {
                ck(line == "every rank of the group reached it, as far as known",
                   "rank 1's own second collective: '" + line + "'");
            }
            if (rank == 0) {
                const std::string l = a.late({send}, before);
                ck(a.what({send}) == " to world rank 2", "what of a send: '" + a.what({send}) + "'");
                ck(l == "ranks that did not arrive: 2 (world rank 2)", "a send rank 2 never received: '" + l + "'");
            }
            // Heard from everyone before; a wait that began later heard nobody.
            const std::string later = a.late({third}, arrivals_now() + 1000);
            const std::string others = rank == 0 ? "1, 2" : rank == 1 ? "0, 2" : "0, 1";
            ck(later.find("; ranks waiting in no collective (stalled or computing): " + others) != std::string::npos,
               "a later wait: '" + later + "'");
            MPI_Barrier(MPI_COMM_WORLD);
        }
        if (rank == 0)
            std::printf("  3 ranks: rank 1 named for the third collective, rank 2 for the unreceived send (%s)\n",
                        dist_mpi_threads() ? "told from a second thread" : "told from the main thread");
    } else if (rank == 0) {
        std::printf("needs mpirun -np 3 (world %d): nothing checked\n", world);
    }
#else
    std::printf("a build without MPI: nothing checked\n");
#endif
    std::fflush(stdout);
    int all[2] = {pass, fail};
#ifdef LLMC_MPI
    if (world > 1) MPI_Allreduce(MPI_IN_PLACE, all, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
#endif
    if (rank == 0) std::printf("%d passed, %d failed\n", all[0], all[1]);
    dist_finalize();
    return all[1] ? 1 : 0;
}
