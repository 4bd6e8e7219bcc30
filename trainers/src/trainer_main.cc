#include "trainer_main.h"

#include <iostream>

#include "ctrun/worker/error_file.h"

namespace ctrun::trainers {

int trainer_main(CLI::App& app, int argc, char** argv, TrainOptions defaults,
                 const TaskFactory& make_task) {
  TrainOptions options = std::move(defaults);
  add_train_options(app, options);
  CLI11_PARSE(app, argc, argv);
  auto env = worker::read_worker_env(worker::process_environment());
  if (!env) {
    std::cerr << app.get_name() << ": " << env.error().message << std::endl;
    return 2;
  }
  return worker::run_recorded(env.value().error_file, [&] {
    Run run = start_run(options, env.value());
    TrainTask task = make_task(options, run);
    return train(options, run, task);
  });
}

}  // namespace ctrun::trainers
