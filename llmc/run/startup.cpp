// llmc/run/startup.cpp: what every mode of train_gpt does first
// (llmc/run/startup.h).
#include "llmc/run/startup.h"

#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include "llmc/base/fileio.h"
#include "llmc/comm/dist.h"

void setup_check(bool ok, const std::string& msg) {
    std::string err;
    if (dist_all_ok(ok, msg, &err)) return;
    if (dist_world_rank() == 0) std::fprintf(stderr, "train_gpt: error: %s\n", err.c_str());
    dist_finalize();
    std::exit(kExitSetup);
}

[[noreturn]] void end_job(const std::string& msg) { dist_abort(msg); }

std::string output_path_problem(const std::string& path, bool directory) {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
        if (directory != S_ISDIR(st.st_mode)) return directory ? "exists and is not a directory" : "is a directory";
        if (::access(path.c_str(), W_OK | (directory ? X_OK : 0)) != 0) return "is not writable";
        if (directory) return "";
    }
    // The file (written beside its final name, then renamed) or the folder to
    // be created: the nearest existing folder above it must take new entries.
    std::string parent = path;
    while (!parent.empty() && parent.back() == '/') parent.pop_back();
    const size_t slash = parent.rfind('/');
    parent = slash == std::string::npos ? "." : slash == 0 ? "/" : parent.substr(0, slash);
    if (!directory) {
        if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "its folder " + parent + " does not exist";
    } else {
        while (::stat(parent.c_str(), &st) != 0 && parent != "." && parent != "/") {
            const size_t up = parent.rfind('/');
            parent = up == std::string::npos ? "." : up == 0 ? "/" : parent.substr(0, up);
        }
        if (!S_ISDIR(st.st_mode)) return parent + " is not a directory";
    }
    if (::access(parent.c_str(), W_OK | X_OK) != 0) return "its folder " + parent + " is not writable";
    return "";
}

std::string check_same_data(DataLoader& data, const char* flag, const std::string& pattern) {
    std::string mine, err;
    const bool ok = data.fingerprint(&mine, &err);
    setup_check(ok, err);
    std::string first = mine;
    dist_broadcast(&first);
    setup_check(first == mine, std::string("flag ") + flag + " '" + pattern + "': rank " +
                                   std::to_string(dist_world_rank()) + " reads other data than rank 0 (" + mine +
                                   " against " + first + "); give every rank the same files");
    // Every token id below the vocabulary, each rank reading its share of
    // the shards; a bad id ends the run on every rank, naming it.
    const bool ids_ok = data.check_ids((size_t)dist_world_rank(), (size_t)dist_world_size(), &err);
    setup_check(ids_ok, std::string("flag ") + flag + " '" + pattern + "': " + err);
    return mine;
}

void check_same_flags(const ArgParser& parser, bool help) {
    std::string mine = std::string("help=") + (help ? "1" : "0") + "\n";
    for (const Option& o : parser.options()) mine += std::string(o.name) + "=" + option_value_string(o) + "\n";
    std::string first = mine;
    dist_broadcast(&first);
    std::string msg;
    if (first != mine) {
        size_t a = 0, b = 0;
        while (a < mine.size() && b < first.size()) {
            size_t ea = mine.find('\n', a), eb = first.find('\n', b);
            std::string la = mine.substr(a, ea - a), lb = first.substr(b, eb - b);
            if (la != lb) {
                size_t eq = la.find('=');
                msg = "ranks were given different flags: --" + la.substr(0, eq) + " is '" + la.substr(eq + 1) +
                      "' on rank " + std::to_string(dist_world_rank()) + " but '" + lb.substr(lb.find('=') + 1) +
                      "' on rank 0";
                break;
            }
            a = ea + 1;
            b = eb + 1;
        }
        if (msg.empty()) msg = "ranks were given different flags";
    }
    setup_check(msg.empty(), msg);
}

static const char* const kSpinCount = "1000";

void openmp_wait_policy(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;  // the user's, or already done
    if (setenv("GOMP_SPINCOUNT", kSpinCount, 1) != 0) return;
    if (setenv("LLMC_SPINCOUNT_SET", "1", 1) != 0) return;  // (for the settings: set here, not by the user)
    // The program's own path, not /proc/self/exe itself: the kernel names a
    // process after the file it was started from, so ps, top and pkill
    // would show every rank as "exe".
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = 0;
        execv(self, argv);
    }
    unsetenv("GOMP_SPINCOUNT");  // no exec: the runtime keeps its own
    unsetenv("LLMC_SPINCOUNT_SET");
}

std::string openmp_wait_text() {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const char* spin = std::getenv("GOMP_SPINCOUNT");
    if (policy) return std::string("OMP_WAIT_POLICY=") + policy;
    if (spin && std::getenv("LLMC_SPINCOUNT_SET")) return std::string("spin ") + spin + ", then sleep (train_gpt's default)";
    if (spin) return std::string("GOMP_SPINCOUNT=") + spin;
    return "the OpenMP runtime's default";
}

std::string choose_threads() {
    const char* env = std::getenv("OMP_NUM_THREADS");
    if (env && *env) return std::to_string(omp_get_max_threads()) + " (OMP_NUM_THREADS)";
    const int cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)), bound = omp_get_num_procs();
    const int local = std::max(1, dist_local_size());
    const int n = std::max(1, std::min(bound, cores / local));
    omp_set_num_threads(n);
    return std::to_string(n) + " (" + std::to_string(cores) + " cores / " + std::to_string(local) +
           " rank(s) on this node" + (bound < cores ? ", " + std::to_string(bound) + " bound to this rank" : "") + ")";
}
