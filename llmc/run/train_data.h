// llmc/run/train_data.h: a run's data on one rank: the training and
// validation shards, the rows of one micro-batch (whole rows as read, and
// this rank's tokens of them under context parallelism, with their
// document starts under --document-mask), the tokenizer of samples and
// exports, and the training data's fingerprint (checkpoints keep it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "llmc/io/dataloader.h"
#include "llmc/io/tokenizer.h"
#include "llmc/parallel/context_parallel.h"

struct TrainData {
    DataLoader train, val;
    bool use_val = false;
    long long val_rows = 0;    // rows of T per validation (-m or --val-tokens)
    Tokenizer tok;
    std::string fingerprint;   // of the training data (checkpoints keep it)
    // Host rows of one micro-batch of up to B rows of T: whole, and this
    // rank's tokens; their document starts (--document-mask) alike.
    std::vector<int> full_in, full_tg, inputs, targets;
    std::vector<int> full_docs, docs;

    // Room for micro-batches of BT = B·T tokens (and their document starts).
    void size_rows(size_t BT, bool document_mask);
    const int* docs_or_null() const { return docs.empty() ? nullptr : docs.data(); }
    // `rows` rows from first_row on, this rank's tokens of them (cp's
    // chunks). The document starts are found on the whole rows (a cp rank's
    // later chunk needs the EOTs of the earlier ones, `eot` ending a
    // document, `bos` opening one; -1: none) and sharded alike. Ends the job
    // on a read error.
    void read_micro_batch(DataLoader& dl, uint64_t first_row, int rows, int T, int eot, const ContextParallel& cp,
                          int bos = -1);
    // The tokens that end and open a document (*eot, *bos; -1: none), those
    // not given (-1) taken from the training shards' header
    // (scripts/prepare_data.py records them), else, when neither was given,
    // from the tokenizer: a
    // start token (<s>, <|begin_of_text|>) opens documents, any other
    // end-of-text token ends them (GPT-2's, llm.c's shards), 50256 without a
    // tokenizer. Returns where they came from, for the settings.
    std::string document_tokens(int* eot, int* bos) const;
};
