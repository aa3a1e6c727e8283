// llmc/parallel/tensor_parallel.cpp: the f and g operators over the tp group
// (llmc/parallel/tensor_parallel.h).
#include "llmc/parallel/tensor_parallel.h"

// Sequence-parallel rows: rank r holds rows [r·N/t, (r+1)·N/t), so the
// gathers and scatters are over contiguous equal blocks.
const void* TensorParallel::f_forward(const void* local, void* full, size_t row_elems, int N, DType t) {
    if (!sp_) return local;  // identity: the input is already whole on every rank
    comm_.all_gather(local, full, row_elems * (size_t)(N / size()), t);
    return full;
}

void* TensorParallel::f_backward(void* dfull, void* dlocal, size_t row_elems, int N, DType t) {
    if (!sp_) {
        comm_.all_reduce(dfull, row_elems * (size_t)N, t, ReduceOp::Sum);
        return dfull;
    }
    comm_.reduce_scatter(dfull, dlocal, row_elems * (size_t)(N / size()), t);
    return dlocal;
}

void* TensorParallel::g_forward(void* partial, void* local, size_t row_elems, int N, DType t) {
    if (!sp_) {
        comm_.all_reduce(partial, row_elems * (size_t)N, t, ReduceOp::Sum);
        return partial;
    }
    comm_.reduce_scatter(partial, local, row_elems * (size_t)(N / size()), t);
    return local;
}

const void* TensorParallel::g_backward(const void* dlocal, void* dfull, size_t row_elems, int N, DType t) {
    if (!sp_) return dlocal;  // identity: the output gradient is whole on every rank
    comm_.all_gather(dlocal, dfull, row_elems * (size_t)(N / size()), t);
    return dfull;
}
