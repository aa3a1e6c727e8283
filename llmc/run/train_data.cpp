// llmc/run/train_data.cpp: a run's data on one rank (llmc/run/train_data.h).
#include "llmc/run/train_data.h"

#include "llmc/model/gpt.h"
#include "llmc/run/startup.h"

void TrainData::size_rows(size_t BT, bool document_mask) {
    full_in.resize(BT);
    full_tg.resize(BT);
    inputs.resize(BT);
    targets.resize(BT);
    if (document_mask) full_docs.resize(BT), docs.resize(BT);
}

// Every pipeline stage reads the rows, so every stage has them.
void TrainData::read_micro_batch(DataLoader& dl, uint64_t first_row, int rows, int T, int eot,
                                 const ContextParallel& cp) {
    std::string err;
    if (!dl.read_rows(first_row, rows, full_in.data(), full_tg.data(), &err)) end_job(err);
    cp.shard_rows(full_in.data(), rows, T, inputs.data());
    cp.shard_rows(full_tg.data(), rows, T, targets.data());
    if (!docs.empty()) {
        GPT::document_starts(full_in.data(), rows, T, eot, full_docs.data());
        cp.shard_rows(full_docs.data(), rows, T, docs.data());
    }
}
