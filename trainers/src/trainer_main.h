// What a trainer's main() does around its task: parse the shared flags, read the worker
// environment, join the process group, and run the loop under run_recorded, so an exception
// becomes the error file (TORCHELASTIC_ERROR_FILE) and exit code 1.
#pragma once

#include <functional>

#include "train_loop.h"

namespace ctrun::trainers {

using TaskFactory = std::function<TrainTask(const TrainOptions&, const Run&)>;

// `app` already holds the trainer's own options; this adds the shared ones (starting from
// `defaults`) and parses.
int trainer_main(CLI::App& app, int argc, char** argv, TrainOptions defaults,
                 const TaskFactory& make_task);

}  // namespace ctrun::trainers
