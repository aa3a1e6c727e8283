// llmc/comm/mpi.h: MPI itself, included one way everywhere: MPI's C++
// bindings (deprecated, unused here) warn under -Wextra, so they are
// skipped before <mpi.h>. Every file that calls MPI includes it through
// this header, so the choice holds in all of them. Only in builds with MPI
// (LLMC_MPI).
#pragma once
#ifdef LLMC_MPI
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#endif  // LLMC_MPI
