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

std::string TrainData::document_tokens(int* eot, int* bos) const {
    const bool given = *eot >= 0 || *bos >= 0;
    if (train.doc_end() >= 0 || train.doc_start() >= 0) {  // each one not given from the shards' record
        if (*eot < 0) *eot = train.doc_end();
        if (*bos < 0) *bos = train.doc_start();
        return given ? "as given, the rest from the shards' header" : "the shards' header";
    }
    if (given) return "as given";
    const int e = tok.eot();
    const std::string text = e >= 0 ? tok.decode(e) : "";
    if (text == "<s>" || text == "<|begin_of_text|>") {
        *bos = e;
        return "the tokenizer's start token";
    }
    *eot = e >= 0 ? e : 50256;
    return "the tokenizer's end of text";
}

// Every pipeline stage reads the rows, so every stage has them.
void TrainData::read_micro_batch(DataLoader& dl, uint64_t first_row, int rows, int T, int eot,
                                 const ContextParallel& cp, int bos) {
    std::string err;
    if (!dl.read_rows(first_row, rows, full_in.data(), full_tg.data(), &err)) end_job(err);
    cp.shard_rows(full_in.data(), rows, T, inputs.data());
    cp.shard_rows(full_tg.data(), rows, T, targets.data());
    if (!docs.empty()) {
        GPT::document_starts(full_in.data(), rows, T, eot, full_docs.data(), bos);
        cp.shard_rows(full_docs.data(), rows, T, docs.data());
    }
}
