// llmc/plan/modes.h: the two modes of train_gpt that plan instead of
// training: --plan (search or evaluate layouts of the model on a planned
// world, llmc/plan/planner.h) and --calibrate (measure this machine and
// write a hardware profile, llmc/plan/calibrate.h). Each returns main()'s
// exit status; errors end every rank with one line.
#pragma once
#include "llmc/base/args.h"
#include "llmc/run/train_config.h"

int plan_main(const ArgParser& parser, const TrainConfig& cfg);
int calibrate_main(const TrainConfig& cfg);
