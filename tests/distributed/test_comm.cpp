// tests/distributed/test_comm.cpp: the communication layer (llmc/comm/comm.h,
// llmc/parallel/process_grid.h) on the CPU backend, under `mpirun -np N` (N = 1, 2,
// 4, ...) or started alone. Every rank fills its buffers with known functions
// of (group rank, index), so every expected result is computed locally by
// formula: all-reduce (sum, max), reduce-scatter and all-gather (out of place
// and in place), broadcast, send/recv around a ring, the start/wait forms
// with several calls in flight, the counted calls and ring bytes, the
// all-to-all with per-peer sizes, the groups of make_process_grid (expert
// parallel's too) and their coordinates, its errors, and dist_all_ok.
// Values are small multiples of 1/2, so every sum is exact in every type
// (bf16 included) whatever order the reduction takes.
//
// Each rank prints its failures only; rank 0 prints the last line,
// "P passed, F failed", summed over the ranks. Exit status 1 on any failure.
// Builds with MPI (-DLLMC_MPI) or without (then one process, LocalComm).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "llmc/backend/backend_cpu.h"
#include "llmc/comm/comm.h"
#include "llmc/comm/comm_shape.h"
#include "llmc/parallel/process_grid.h"
#include "tests/lib/comm_checks.h"
#ifdef LLMC_MPI
#include "llmc/comm/comm_mpi.h"  // and MPI itself
#endif

namespace {
using namespace comm_checks;

// The ring-algorithm bytes of one call (comm.h), written out independently.
uint64_t ring_bytes(CommKind k, uint64_t full, uint64_t g, DType t) {
    if (g <= 1) return 0;
    const uint64_t es = dtype_size(t);
    switch (k) {
        case CommKind::AllReduce:
            return 2 * full * (g - 1) / g * es;
        case CommKind::ReduceScatter:
        case CommKind::AllGather:
            return full * (g - 1) / g * es;
        default:
            return full * es;
    }
}

// After one call of kind k: exactly that call and those bytes are counted.
void expect_counts(Checker& ck, const std::string& what, Comm& c, CommKind k, uint64_t full, DType t) {
    const CommCounts& cc = c.counts();
    bool ok = true;
    for (int j = 0; j < (int)CommKind::count; j++) {
        const uint64_t calls = (j == (int)k && c.size() > 1) ? 1 : 0;
        const uint64_t bytes = j == (int)k ? ring_bytes(k, full, (uint64_t)c.size(), t) : 0;
        if (cc.calls[j] != calls || cc.bytes[j] != bytes) ok = false;
    }
    if (cc.total_bytes() != ring_bytes(k, full, (uint64_t)c.size(), t)) ok = false;
    ck(ok, what + ": counts (" + std::to_string(cc.calls[(int)k]) + " calls, " + std::to_string(cc.bytes[(int)k]) +
               " bytes; expected " + std::to_string(ring_bytes(k, full, (uint64_t)c.size(), t)) + ")");
    c.counts().reset();
}

// Every operation of c, each type in types, each size in sizes.
void test_ops(Checker& ck, Comm& c, Backend& be, const std::string& label, const std::vector<DType>& types,
              const std::vector<size_t>& sizes) {
    const int r = c.rank(), g = c.size();
    c.counts().reset();
    for (DType t : types) {
        for (size_t n : sizes) {
            const std::string tag = label + " " + dtype_name(t) + " n=" + std::to_string(n) + " ";
            {  // all-reduce, sum and max
                Buf b(be, t, n);
                b.fill([&](size_t i) { return val(t, r, i); });
                c.all_reduce(b.p, n, t);
                expect(ck, tag + "all_reduce sum", b.p, t, 0, n, [&](size_t i) { return sum_over(t, g, i); });
                expect_counts(ck, tag + "all_reduce sum", c, CommKind::AllReduce, n, t);
                b.fill([&](size_t i) { return val(t, r, i); });
                c.all_reduce(b.p, n, t, ReduceOp::Max);
                expect(ck, tag + "all_reduce max", b.p, t, 0, n, [&](size_t i) { return max_over(t, g, i); });
                expect_counts(ck, tag + "all_reduce max", c, CommKind::AllReduce, n, t);
            }
            const size_t full = (size_t)g * n;
            {  // reduce-scatter out of place, then in place
                Buf s(be, t, full), d(be, t, n);
                s.fill([&](size_t i) { return val(t, r, i); });
                d.fill([](size_t) { return -99; });
                c.reduce_scatter(s.p, d.p, n, t);
                expect(ck, tag + "reduce_scatter", d.p, t, 0, n,
                       [&](size_t i) { return sum_over(t, g, (size_t)r * n + i); });
                expect(ck, tag + "reduce_scatter leaves send", s.p, t, 0, full, [&](size_t i) { return val(t, r, i); });
                expect_counts(ck, tag + "reduce_scatter", c, CommKind::ReduceScatter, full, t);
                c.reduce_scatter(s.p, s.at((size_t)r * n), n, t);
                expect(ck, tag + "reduce_scatter in place", s.p, t, (size_t)r * n, n,
                       [&](size_t i) { return sum_over(t, g, (size_t)r * n + i); });
                expect_counts(ck, tag + "reduce_scatter in place", c, CommKind::ReduceScatter, full, t);
            }
            {  // all-gather out of place, then in place
                Buf s(be, t, n), d(be, t, full);
                s.fill([&](size_t i) { return val(t, r, i); });
                d.fill([](size_t) { return -99; });
                c.all_gather(s.p, d.p, n, t);
                expect(ck, tag + "all_gather", d.p, t, 0, full, [&](size_t i) { return val(t, (int)(i / n), i % n); });
                expect_counts(ck, tag + "all_gather", c, CommKind::AllGather, full, t);
                d.fill([&](size_t i) { return i / n == (size_t)r ? val(t, r, i % n) : -99; });
                c.all_gather(d.at((size_t)r * n), d.p, n, t);
                expect(ck, tag + "all_gather in place", d.p, t, 0, full,
                       [&](size_t i) { return val(t, (int)(i / n), i % n); });
                expect_counts(ck, tag + "all_gather in place", c, CommKind::AllGather, full, t);
            }
            {  // broadcast from the last rank and from rank 0
                Buf b(be, t, n);
                for (int root : {g - 1, 0}) {
                    b.fill([&](size_t i) { return val(t, r, i); });
                    c.broadcast(b.p, n, t, root);
                    expect(ck, tag + "broadcast from " + std::to_string(root), b.p, t, 0, n,
                           [&](size_t i) { return val(t, root, i); });
                    expect_counts(ck, tag + "broadcast", c, CommKind::Broadcast, n, t);
                }
            }
            {  // send to the next rank, receive from the previous one
                Buf s(be, t, n), d(be, t, n);
                const int dst = (r + 1) % g, src = (r + g - 1) % g;
                s.fill([&](size_t i) { return val(t, r, i); });
                c.send_recv(s.p, dst, d.p, src, n, t);
                expect(ck, tag + "send_recv ring", d.p, t, 0, n, [&](size_t i) { return val(t, src, i); });
                expect_counts(ck, tag + "send_recv", c, CommKind::SendRecv, n, t);
            }
        }
    }
    {  // bf16 sums round to nearest even: only ranks 0 and 1 hold non-zeros,
       // so the result is one rounding of 1 + x whatever the order.
        const float xs[] = {0x1p-8f, 3 * 0x1p-8f, 0x1p-8f + 0x1p-12f, 0x1p-7f, -0x1p-9f, 0.0f};
        const size_t n = sizeof(xs) / sizeof(xs[0]);
        Buf b(be, DType::BF16, n);
        b.fill([&](size_t i) { return r == 0 ? 1.0 : r == 1 ? (double)xs[i] : 0.0; });
        c.all_reduce(b.p, n, DType::BF16);
        expect(ck, label + " bf16 all_reduce rounds to nearest even", b.p, DType::BF16, 0, n,
               [&](size_t i) { return (double)bf16_to_f32(f32_to_bf16(1.0f + (g > 1 ? xs[i] : 0.0f))); });
        c.counts().reset();
    }
    // Host helpers: exact for these values, and never counted.
    ck(c.host_all_reduce(r + 0.5, ReduceOp::Sum) == g * (g - 1) / 2.0 + 0.5 * g, label + " host_all_reduce sum");
    ck(c.host_all_reduce(-(double)r, ReduceOp::Max) == 0.0, label + " host_all_reduce max");
    ck(c.counts().total_bytes() == 0, label + " host_all_reduce uncounted");
}

// Several calls in flight on one group at once, waited for out of order.
void test_async(Checker& ck, Comm& c, Backend& be, const std::string& label, size_t n) {
    const int r = c.rank(), g = c.size();
    const size_t full = (size_t)g * n;
    const std::string tag = label + " async n=" + std::to_string(n) + " ";
    c.counts().reset();
    Buf a(be, DType::F64, n), b(be, DType::I32, n), rs(be, DType::F32, full), ag(be, DType::BF16, full);
    Buf ss(be, DType::F32, n), sr(be, DType::F32, n), a2(be, DType::BF16, n);
    a.fill([&](size_t i) { return val(DType::F64, r, i); });
    b.fill([&](size_t i) { return val(DType::I32, r, i); });
    rs.fill([&](size_t i) { return val(DType::F32, r, i); });
    ag.fill([&](size_t i) { return i / n == (size_t)r ? val(DType::BF16, r, i % n) : -99; });
    ss.fill([&](size_t i) { return val(DType::F32, r, i); });
    a2.fill([&](size_t i) { return val(DType::BF16, r, i); });
    const int dst = (r + 1) % g, src = (r + g - 1) % g;
    CommHandle h1 = c.start_all_reduce(a.p, n, DType::F64, ReduceOp::Sum);
    CommHandle h2 = c.start_all_reduce(b.p, n, DType::I32, ReduceOp::Max);
    CommHandle h3 = c.start_reduce_scatter(rs.p, rs.at((size_t)r * n), n, DType::F32);
    CommHandle h4 = c.start_all_gather(ag.at((size_t)r * n), ag.p, n, DType::BF16);
    CommHandle h5 = c.start_send_recv(ss.p, dst, sr.p, src, n, DType::F32);
    CommHandle h6 = c.start_all_reduce(a2.p, n, DType::BF16, ReduceOp::Sum);
    c.wait(h5);
    c.wait(h3);
    c.wait(h6);
    c.wait(h1);
    c.wait(h4);
    c.wait(h2);
    expect(ck, tag + "all_reduce f64", a.p, DType::F64, 0, n, [&](size_t i) { return sum_over(DType::F64, g, i); });
    expect(ck, tag + "all_reduce i32 max", b.p, DType::I32, 0, n, [&](size_t i) { return max_over(DType::I32, g, i); });
    expect(ck, tag + "reduce_scatter in place", rs.p, DType::F32, (size_t)r * n, n,
           [&](size_t i) { return sum_over(DType::F32, g, (size_t)r * n + i); });
    expect(ck, tag + "all_gather in place", ag.p, DType::BF16, 0, full,
           [&](size_t i) { return val(DType::BF16, (int)(i / n), i % n); });
    expect(ck, tag + "send_recv", sr.p, DType::F32, 0, n, [&](size_t i) { return val(DType::F32, src, i); });
    expect(ck, tag + "all_reduce bf16", a2.p, DType::BF16, 0, n, [&](size_t i) { return sum_over(DType::BF16, g, i); });
    const CommCounts& cc = c.counts();
    const uint64_t one = g > 1 ? 1 : 0;
    const uint64_t want_ar = ring_bytes(CommKind::AllReduce, n, g, DType::F64) +
                             ring_bytes(CommKind::AllReduce, n, g, DType::I32) +
                             ring_bytes(CommKind::AllReduce, n, g, DType::BF16);
    ck(cc.calls[(int)CommKind::AllReduce] == 3 * one && cc.bytes[(int)CommKind::AllReduce] == want_ar &&
           cc.calls[(int)CommKind::ReduceScatter] == one &&
           cc.bytes[(int)CommKind::ReduceScatter] == ring_bytes(CommKind::ReduceScatter, full, g, DType::F32) &&
           cc.calls[(int)CommKind::AllGather] == one &&
           cc.bytes[(int)CommKind::AllGather] == ring_bytes(CommKind::AllGather, full, g, DType::BF16) &&
           cc.calls[(int)CommKind::SendRecv] == one &&
           cc.bytes[(int)CommKind::SendRecv] == ring_bytes(CommKind::SendRecv, n, g, DType::F32) &&
           cc.calls[(int)CommKind::Broadcast] == 0,
       tag + "counts");
    c.counts().reset();
}

// Comm::count on literal numbers, through a group that pretends to have g
// ranks and moves nothing.
struct CountProbe : ShapeComm {
    explicit CountProbe(int g) : ShapeComm("probe", g, 0) {}
    void add(CommKind k, size_t full, DType t) { count(k, full, t); }
};

void test_count_formula(Checker& ck) {
    CountProbe p4(4), p3(3), p1(1);
    p4.add(CommKind::AllReduce, 7, DType::F32);  // 2·7·3/4 = 10 elements
    ck(p4.counts().bytes[(int)CommKind::AllReduce] == 40 && p4.counts().calls[(int)CommKind::AllReduce] == 1,
       "count: all-reduce 7 fp32 on 4 = 40 bytes");
    p4.add(CommKind::ReduceScatter, 28, DType::BF16);  // 28·3/4 = 21 elements
    ck(p4.counts().bytes[(int)CommKind::ReduceScatter] == 42, "count: reduce-scatter 28 bf16 on 4 = 42 bytes");
    p3.add(CommKind::AllGather, 1000003, DType::F64);  // 1000003·2/3 = 666668 (rounded down)
    ck(p3.counts().bytes[(int)CommKind::AllGather] == 666668ull * 8, "count: all-gather 1000003 fp64 on 3");
    p3.add(CommKind::Broadcast, 5, DType::I32);
    p3.add(CommKind::SendRecv, 5, DType::I32);
    ck(p3.counts().bytes[(int)CommKind::Broadcast] == 20 && p3.counts().bytes[(int)CommKind::SendRecv] == 20,
       "count: broadcast and send 5 int32 = 20 bytes");
    ck(p3.counts().total_bytes() == 666668ull * 8 + 40, "count: total_bytes");
    // 2^40 elements: the product must not overflow 64 bits.
    p4.counts().reset();
    p4.add(CommKind::AllReduce, (size_t)1 << 40, DType::F32);
    ck(p4.counts().bytes[(int)CommKind::AllReduce] == ((uint64_t)3 << 39) * 4, "count: 2^40 elements");
    p1.add(CommKind::AllReduce, 100, DType::F32);
    ck(p1.counts().total_bytes() == 0 && p1.counts().calls[(int)CommKind::AllReduce] == 0, "count: group of one");
    p4.counts().reset();
    ck(p4.counts().total_bytes() == 0, "count: reset");
    bool names = true;
    for (int k = 0; k < (int)CommKind::count; k++)
        for (int j = 0; j < k; j++)
            if (std::strcmp(comm_kind_name((CommKind)k), comm_kind_name((CommKind)j)) == 0) names = false;
    ck(names && std::strcmp(comm_kind_name(CommKind::AllReduce), "?") != 0, "comm_kind_name: distinct names");
}

// Group g's members agree on the coordinates the group shares, and its
// order is the order of the coordinate that varies.
void test_group_coords(Checker& ck, Comm& c, Backend& be, const ProcessGrid& grid, const std::string& label,
                       int expect_size, int expect_rank, const std::function<bool(const int*, const int*, int)>& ok) {
    ck(c.size() == expect_size,
       label + ": size " + std::to_string(c.size()) + ", expected " + std::to_string(expect_size));
    ck(c.rank() == expect_rank,
       label + ": rank " + std::to_string(c.rank()) + ", expected " + std::to_string(expect_rank));
    Buf mine(be, DType::I32, 5), all(be, DType::I32, 5 * (size_t)c.size());
    int* m = static_cast<int*>(mine.p);
    m[0] = grid.dp_rank;
    m[1] = grid.cp_rank;
    m[2] = grid.tp_rank;
    m[3] = grid.world_rank;
    m[4] = grid.pp_rank;
    c.all_gather(mine.p, all.p, 5, DType::I32);
    const int* a = static_cast<const int*>(all.p);
    bool good = true;
    for (int j = 0; j < c.size(); j++) {
        const int* q = a + 5 * j;
        // World rank = ((pp·dp + dp_rank)·cp + cp_rank)·tp + tp_rank for every member.
        if (q[3] != ((q[4] * grid.dp_group->size() + q[0]) * grid.cp_group->size() + q[1]) * grid.tp_group->size() + q[2]) good = false;
        if (!ok(m, q, j)) good = false;
    }
    ck(good, label + ": coordinates of the members");
    c.counts().reset();
}

// Pipeline transfers: every rank sends two messages to its successor (tags
// 0 and 1, posted in the order 1, 0) and one to its predecessor, in one
// group with the matching receives; each lands where its tag says.
void test_p2p(Checker& ck, Comm& c, Backend& be, const std::string& label, size_t n) {
    const int r = c.rank(), g = c.size(), next = (r + 1) % g, prev = (r + g - 1) % g;
    const std::string tag = label + " p2p n=" + std::to_string(n) + " ";
    c.counts().reset();
    const DType t = DType::F32;
    Buf s0(be, t, n), s1(be, t, n), sb(be, t, n), r0(be, t, n), r1(be, t, n), rb(be, t, n);
    s0.fill([&](size_t i) { return val(t, r, i); });
    s1.fill([&](size_t i) { return val(t, r + 100, i); });
    sb.fill([&](size_t i) { return val(t, r + 200, i); });
    std::vector<P2POp> ops = {{true, s1.p, next, n, 1}, {false, r0.p, prev, n, 0}, {true, s0.p, next, n, 0},
                              {false, rb.p, next, n, 2}, {true, sb.p, prev, n, 2}, {false, r1.p, prev, n, 1}};
    std::vector<CommHandle> hs;
    c.start_p2p(ops, t, &hs);
    // Each transfer's own handle, receives first and in another order.
    for (int i : {5, 1, 3, 0, 2, 4}) c.wait(hs[i]);
    expect(ck, tag + "tag 0 from the predecessor", r0.p, t, 0, n, [&](size_t i) { return val(t, prev, i); });
    expect(ck, tag + "tag 1 from the predecessor", r1.p, t, 0, n, [&](size_t i) { return val(t, prev + 100, i); });
    expect(ck, tag + "tag 2 from the successor", rb.p, t, 0, n, [&](size_t i) { return val(t, next + 200, i); });
    if (g > 1)
        ck(c.counts().calls[(int)CommKind::SendRecv] == 3 &&
               c.counts().bytes[(int)CommKind::SendRecv] == 3 * n * dtype_size(t),
           tag + "counted: 3 sends of n elements");
    c.counts().reset();
}

// all_to_all_v: r sends 1 + (r + 2p) % 3 values of (r, p) to p; not its own.
void test_all_to_all_v(Checker& ck, Comm& c, Backend& be, const std::string& label) {
    const int r = c.rank(), g = c.size();
    const DType t = DType::F64;
    std::vector<size_t> sn(g), rn(g), so(g + 1, 0), ro(g + 1, 0), peer;  // peer: of each element sent
    for (int p = 0; p < g; p++) sn[p] = 1 + (r + 2 * p) % 3, rn[p] = 1 + (p + 2 * r) % 3;  // rn: p's sn[r]
    for (int p = 0; p < g; p++) so[p + 1] = so[p] + sn[p], ro[p + 1] = ro[p] + rn[p], peer.resize(so[p + 1], p);
    Buf s(be, t, so[g]), rv(be, t, ro[g]);
    s.fill([&](size_t i) { return val(t, 100 * r + (int)peer[i], i - so[peer[i]]); });
    rv.fill([&](size_t) { return -1.0; });
    c.counts().reset();
    c.all_to_all_v(s.p, sn, rv.p, rn, t);
    for (int p = 0; p < g; p++)
        expect(ck, label + " all_to_all_v block from " + std::to_string(p), rv.p, t, ro[p], rn[p],
               [&](size_t i) { return p == r ? -1.0 : val(t, 100 * p + r, i); });
    ck(c.counts().calls[(int)CommKind::SendRecv] == (uint64_t)(g - 1), label + " all_to_all_v: a send per peer");
    c.counts().reset();
}

// Whether members m and q agree on the coordinates dims.
bool same(const int* m, const int* q, std::initializer_list<int> dims) {
    for (int d : dims)
        if (q[d] != m[d]) return false;
    return true;
}

void test_grid(Checker& ck, Backend& be, int tp, int cp, int pp, const std::string& comm) {
    const std::string label = "grid tp=" + std::to_string(tp) + " cp=" + std::to_string(cp) +
                              " pp=" + std::to_string(pp) + " comm=" + comm;
    ProcessGrid grid;
    std::string err;
    if (!ck(make_process_grid(grid_layout(tp, cp, pp), comm, be, &grid, &err), label + ": " + err)) return;
    const int world = dist_world_size();
    ck(grid.world->size() == world && grid.world_rank == dist_world_rank() && grid.tp_group->size() == tp && grid.cp_group->size() == cp &&
           grid.pp_group->size() == pp && grid.dp_group->size() * cp * tp * pp == world,
       label + ": dimensions");
    ck(grid.world_rank == ((grid.pp_rank * grid.dp_group->size() + grid.dp_rank) * cp + grid.cp_rank) * tp + grid.tp_rank,
       label + ": rank formula");
    // Coordinates: [0] dp, [1] cp, [2] tp, [3] world rank, [4] pp.
    test_group_coords(ck, *grid.world, be, grid, label + " world", world, grid.world_rank,
                      [&](const int*, const int* q, int j) { return q[3] == j; });
    test_group_coords(ck, *grid.tp_group, be, grid, label + " tp", tp, grid.tp_rank,
                      [&](const int* m, const int* q, int j) { return same(m, q, {0, 1, 4}) && q[2] == j; });
    test_group_coords(ck, *grid.cp_group, be, grid, label + " cp", cp, grid.cp_rank,
                      [&](const int* m, const int* q, int j) { return same(m, q, {0, 2, 4}) && q[1] == j; });
    test_group_coords(ck, *grid.dp_group, be, grid, label + " dp", grid.dp_group->size(), grid.dp_rank,
                      [&](const int* m, const int* q, int j) { return same(m, q, {1, 2, 4}) && q[0] == j; });
    test_group_coords(ck, *grid.dpcp_group, be, grid, label + " dpcp", grid.dp_group->size() * cp, grid.dp_rank * cp + grid.cp_rank,
                      [&](const int* m, const int* q, int j) { return same(m, q, {2, 4}) && q[0] * cp + q[1] == j; });
    test_group_coords(ck, *grid.pp_group, be, grid, label + " pp", pp, grid.pp_rank,
                      [&](const int* m, const int* q, int j) { return same(m, q, {0, 1, 2}) && q[4] == j; });
    // The embedding group: the first and the last stage (alone when pp = 1,
    // and for the middle stages).
    const bool end = grid.pp_rank == 0 || grid.pp_rank == pp - 1;
    test_group_coords(ck, *grid.embed_group, be, grid, label + " embed", pp > 1 && end ? 2 : 1,
                      pp > 1 && grid.pp_rank == pp - 1 ? 1 : 0, [&](const int* m, const int* q, int j) {
                          if (!(pp > 1 && end)) return q[4] == m[4];  // alone
                          return same(m, q, {0, 1, 2}) && q[4] == (j == 0 ? 0 : pp - 1);
                      });
    test_p2p(ck, *grid.pp_group, be, label + " pp", 1001);
    const std::vector<DType> all_types = {DType::F32, DType::F64, DType::BF16, DType::I32};
    const std::vector<size_t> small = {1, 7, 1001};
    struct G {
        const char* name;
        Comm* c;
    } groups[] = {{"world", grid.world.get()},
                  {"tp", grid.tp_group.get()},
                  {"cp", grid.cp_group.get()},
                  {"dp", grid.dp_group.get()},
                  {"dpcp", grid.dpcp_group.get()},
                  {"pp", grid.pp_group.get()}};
    for (const G& gr : groups) {
        test_ops(ck, *gr.c, be, label + " " + gr.name, all_types, small);
        test_async(ck, *gr.c, be, label + " " + gr.name, 7);
    }
}

// Hybrid context parallel's two splits of the cp group (cp ranks in groups
// of n): the all-to-all group holds consecutive cp ranks, the ring one rank
// of each group, both in cp order; the rest of the grid is as without them.
void test_hybrid_grid(Checker& ck, Backend& be, int tp, int cp, int n) {
    const std::string label = "hybrid grid tp=" + std::to_string(tp) + " cp=" + std::to_string(cp) + " a2a=" +
                              std::to_string(n);
    ProcessGrid grid;
    std::string err;
    if (!ck(make_process_grid(grid_layout(tp, cp, 1, n), "auto", be, &grid, &err), label + ": " + err)) return;
    if (!ck(grid.cp_a2a_group && grid.cp_ring_group && grid.cp_a2a_group->size() == n, label + ": groups made")) return;
    test_group_coords(ck, *grid.cp_a2a_group, be, grid, label + " a2a", n, grid.cp_rank % n,
                      [&](const int* m, const int* q, int j) {
                          return same(m, q, {0, 2, 4}) && q[1] / n == m[1] / n && q[1] % n == j;
                      });
    test_group_coords(ck, *grid.cp_ring_group, be, grid, label + " ring", cp / n, grid.cp_rank / n,
                      [&](const int* m, const int* q, int j) {
                          return same(m, q, {0, 2, 4}) && q[1] % n == m[1] % n && q[1] / n == j;
                      });
    test_group_coords(ck, *grid.cp_group, be, grid, label + " cp", cp, grid.cp_rank,
                      [&](const int* m, const int* q, int j) { return same(m, q, {0, 2, 4}) && q[1] == j; });
    test_ops(ck, *grid.cp_a2a_group, be, label + " a2a", {DType::F64}, {7});
    test_ops(ck, *grid.cp_ring_group, be, label + " ring", {DType::F64}, {7});
    ProcessGrid plain;
    ck(make_process_grid(grid_layout(tp, cp, 1), "auto", be, &plain, &err) && !plain.cp_a2a_group && !plain.cp_ring_group,
       label + ": no hybrid groups without cp_a2a");
    ProcessGrid whole;  // cp_a2a = cp: the all-to-all alone, over the cp group
    ck(make_process_grid(grid_layout(tp, cp, 1, cp), "auto", be, &whole, &err) && !whole.cp_a2a_group && !whole.cp_ring_group,
       label + ": no hybrid groups when cp_a2a = cp");
}

// Expert parallel's groups: ep consecutive dp ranks of one cp rank; the
// same dp rank % ep over every cp rank (ordered dp-major, as dpcp).
void test_ep_grid(Checker& ck, Backend& be, int ep, int cp) {
    const std::string label = "ep grid ep=" + std::to_string(ep) + " cp=" + std::to_string(cp);
    ProcessGrid g, plain;
    std::string err;
    bool made = make_process_grid(grid_layout(1, cp, 1, 1, ep), "auto", be, &g, &err) && g.ep_group && g.edp_group;
    if (!ck(made, label + ": groups made " + err)) return;
    test_group_coords(ck, *g.ep_group, be, g, label + " ep", ep, g.dp_rank % ep,
                      [&](const int* m, const int* q, int j) {
                          return same(m, q, {1, 2, 4}) && q[0] / ep == m[0] / ep && q[0] % ep == j;
                      });
    test_group_coords(ck, *g.edp_group, be, g, label + " edp", g.dp_group->size() / ep * cp, g.dp_rank / ep * cp + g.cp_rank,
                      [&](const int* m, const int* q, int j) {
                          return same(m, q, {2, 4}) && q[0] % ep == m[0] % ep && q[0] / ep * cp + q[1] == j;
                      });
    test_all_to_all_v(ck, *g.ep_group, be, label + " ep");
    test_ops(ck, *g.edp_group, be, label + " edp", {DType::F64}, {7});
    made = make_process_grid(grid_layout(1, cp, 1), "auto", be, &plain, &err) && !plain.ep_group && !plain.edp_group;
    ck(made, label + ": no ep groups with ep = 1");
}

// Asking for what cannot be: every rank gets the same refusal.
void test_grid_errors(Checker& ck, Backend& be) {
    const int world = dist_world_size();
    ProcessGrid grid;
    std::string err;
    auto refused = [&](int tp, int cp, const std::string& comm, const std::string& needle, int pp = 1, int a2a = 1,
                       int ep = 1) {
        err.clear();
        const bool made = make_process_grid(grid_layout(tp, cp, pp, a2a, ep), comm, be, &grid, &err);
        ck(!made && err.find(needle) != std::string::npos, "make_process_grid(" + std::to_string(tp) + ", " +
                                                               std::to_string(cp) + ", " + comm + ") refused naming " +
                                                               needle + " (got: " + (made ? "success" : err) + ")");
    };
    refused(world + 1, 1, "auto", "--tp");  // world % (tp·cp) != 0
    refused(1, world + 1, "auto", "--cp");
    refused(0, 1, "auto", "--tp");
    refused(1, 0, "auto", "--cp");
    refused(1, 1, "auto", "--pp", world + 1);
    refused(1, 1, "auto", "--pp", 0);
    refused(1, 1, "nccl", "--comm");  // NCCL on the CPU backend
    refused(1, 1, "carrier-pigeon", "--comm");
    if (world % 4 == 0) refused(1, 4, "auto", "--cp-a2a", 1, 3);  // hybrid groups of 3 in a cp group of 4
    refused(1, 1, "auto", "--ep", 1, 1, world + 1);               // ep must divide dp
#ifdef LLMC_MPI
    ck(make_process_grid(grid_layout(1, 1, 1), "mpi", be, &grid, &err), "make_process_grid(1, 1, 1, mpi): " + err);
#else
    refused(1, 1, "mpi", "--comm");  // the build lacks MPI
#endif
}

void test_all_ok(Checker& ck) {
    const int r = dist_world_rank(), world = dist_world_size();
    std::string err = "untouched";
    ck(dist_all_ok(true, "", &err), "dist_all_ok: all ok");
    // Every rank but 0 fails (rank 0 alone fails when it is alone): the
    // message of the lowest failing rank reaches everyone.
    const int lowest = world > 1 ? 1 : 0;
    const bool ok = world > 1 ? r == 0 : false;
    bool all = dist_all_ok(ok, "failure on rank " + std::to_string(r), &err);
    ck(!all && err == "failure on rank " + std::to_string(lowest),
       "dist_all_ok: lowest failing rank's message (got '" + err + "')");
    // Only the last rank fails, with a long message.
    const std::string longmsg(5000, 'x');
    all = dist_all_ok(r != world - 1, r == world - 1 ? longmsg : std::string("not me"), &err);
    ck(!all && err == longmsg, "dist_all_ok: last rank's long message");
    all = dist_all_ok(r != world - 1, "", nullptr);
    ck(!all, "dist_all_ok: null err");
}

}  // namespace

int main(int argc, char** argv) {
    dist_init(&argc, &argv, MpiStart::always);  // MpiComm is tested alone too
    Checker ck;
    ck.rank = dist_world_rank();
    const int world = dist_world_size();
    std::unique_ptr<Backend> be(make_cpu_backend(DType::F64));

    ProcessGrid base;  // tp = cp = 1: its world group sums the results
    std::string err;
    if (!make_process_grid(grid_layout(1, 1, 1), "auto", *be, &base, &err)) dist_abort("make_process_grid(1, 1, 1): " + err);
    ck(dist_local_rank() >= 0 && dist_local_rank() < world, "dist_local_rank in range");

    test_count_formula(ck);
    const std::vector<DType> all_types = {DType::F32, DType::F64, DType::BF16, DType::I32};
    // The odd sizes, the large one included, on the world group.
    test_ops(ck, *base.world, *be, "world", all_types, {1, 7, 1000003});
    test_async(ck, *base.world, *be, "world", 1000003);
    test_async(ck, *base.world, *be, "world", 1);
    test_all_to_all_v(ck, *base.world, *be, "world");

#ifdef LLMC_MPI
    {  // MpiComm itself (also alone, where grids use LocalComm), and with
       // calls limited to 1000 elements so every op goes in pieces.
        MpiComm plain(MPI_COMM_WORLD, "mpi");
        test_ops(ck, plain, *be, "MpiComm", all_types, {1, 7, 1001});
        MpiComm pieces(MPI_COMM_WORLD, "pieces", 1000);
        test_ops(ck, pieces, *be, "MpiComm in pieces", all_types, {1, 7, 2503});
        test_async(ck, pieces, *be, "MpiComm in pieces", 2503);
    }
#endif

    const int dims[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 2, 1}, {4, 1, 1}, {1, 4, 1},
                           {1, 1, 2}, {1, 1, 4}, {2, 1, 2}, {1, 2, 2}, {1, 1, 3}};
    for (const auto& d : dims)
        if (world % (d[0] * d[1] * d[2]) == 0) test_grid(ck, *be, d[0], d[1], d[2], "auto");
    if (world % 2 == 0) test_grid(ck, *be, 2, 1, 1, "mpi");
    if (world % 4 == 0) test_hybrid_grid(ck, *be, 1, 4, 2);
    if (world % 2 == 0) test_ep_grid(ck, *be, 2, 1);
    if (world % 4 == 0) test_ep_grid(ck, *be, 2, 2);
    test_grid_errors(ck, *be);
    test_all_ok(ck);

    const double passed = base.world->host_all_reduce((double)ck.passed, ReduceOp::Sum);
    const double failed = base.world->host_all_reduce((double)ck.failed, ReduceOp::Sum);
    if (ck.rank == 0) std::printf("%.0f passed, %.0f failed\n", passed, failed);
    std::fflush(stdout);
    base = ProcessGrid();  // communicators go before MPI does
    be.reset();
    dist_finalize();
    return failed > 0 ? 1 : 0;
}
