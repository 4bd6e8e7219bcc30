// The trainers as users run them: under ctrun (and the reference torchrun), several processes,
// a worker SIGKILLed mid-epoch and resumed from its checkpoint, a failing trainer's error file.
#include <boost/asio.hpp>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>

#include "catch.h"
#include "etcd_server.h"
#include "process.h"
#include "rendezvous/etcd/etcd.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_jobs.h"
#include "run_task.h"
#include "skip.h"

using namespace ctrun::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> ctrun_mlp(std::vector<std::string> ctrun_flags,
                                   std::vector<std::string> mlp_flags) {
  std::vector<std::string> argv{CTRUN_PATH};
  argv.insert(argv.end(), ctrun_flags.begin(), ctrun_flags.end());
  argv.push_back(MLP_PATH);
  argv.insert(argv.end(), mlp_flags.begin(), mlp_flags.end());
  return argv;
}

// The value after `prefix` on the last line that has it, e.g. "final loss " -> "0.123456".
std::string last_value(const std::string& log, const std::string& prefix) {
  std::string found;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const auto at = line.find(prefix);
    if (at == std::string::npos) continue;
    std::istringstream rest(line.substr(at + prefix.size()));
    rest >> found;
  }
  return found;
}

// The time of day, in ms, of the first agent log line ("2026-...T16:31:37.535Z ctrun: ...")
// that contains `text`, or -1.
long long log_time_ms(const std::string& log, const std::string& text) {
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    const auto t = line.find('T');
    if (line.find(text) == std::string::npos || t == std::string::npos || line.size() < t + 13) {
      continue;
    }
    const int h = std::atoi(line.c_str() + t + 1);
    const int m = std::atoi(line.c_str() + t + 4);
    const double sec = std::atof(line.c_str() + t + 7);
    return (h * 3600LL + m * 60LL) * 1000 + static_cast<long long>(sec * 1000);
  }
  return -1;
}

int run(const std::vector<std::string>& argv, const std::string& log,
        std::chrono::milliseconds timeout = 120s) {
  ChildProcess p(argv, log);
  auto rc = p.wait(timeout);
  REQUIRE(rc);
  return *rc;
}

const std::vector<std::string> kSmall = {"--epochs", "2", "--samples", "1536", "--seed", "7"};

}  // namespace

TEST_CASE("trainers: mlp on 2 and 3 ranks ends with bit-identical replicas") {
  ScratchDir s("mlp_ranks");
  for (int n : {2, 3}) {
    const std::string log = s.path("ranks" + std::to_string(n) + ".log");
    REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=" + std::to_string(n)}, kSmall),
                log) == 0);
    const std::string out = read_file(log);
    INFO(out);
    CHECK(out.find("parameters identical on all " + std::to_string(n) + " rank(s)") !=
          std::string::npos);
    CHECK(out.find("epoch 2/2 loss") != std::string::npos);
    CHECK(std::stod(last_value(out, "final loss ")) < 2.0);  // it learned (chance is ln 10 = 2.3)
  }
}

TEST_CASE("trainers: gpt with many buckets, accumulation, and without overlap gives the same") {
  ScratchDir s("gpt");
  const std::vector<std::string> flags = {
      "--width",      "64",   "--layers",       "2",     "--heads",           "2",
      "--context",    "16",   "--corpus_bytes", "20000", "--batch_size",      "4",
      "--grad_accum", "2",    "--max_steps",    "6",     "--first_bucket_mb", "0.01",
      "--bucket_mb",  "0.03", "--warmup_steps", "2",     "--cosine",          "--clip_grad_norm",
      "1.0"};
  std::string digests[2];
  for (int overlap = 0; overlap < 2; ++overlap) {
    std::vector<std::string> argv{CTRUN_PATH, "--standalone", "--nproc_per_node=2", GPT_PATH};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (overlap == 0) argv.push_back("--no_overlap");
    const std::string log = s.path("gpt" + std::to_string(overlap) + ".log");
    REQUIRE(run(argv, log) == 0);
    const std::string out = read_file(log);
    INFO(out);
    CHECK(out.find("parameters identical on all 2 rank(s)") != std::string::npos);
    CHECK(out.find(overlap ? "gradient bucket(s)" : " 1 gradient bucket(s)") != std::string::npos);
    digests[overlap] = last_value(out, "digest ");
  }
  // Two ranks add two numbers per element whatever the buckets: the very same parameters.
  CHECK(digests[0] == digests[1]);
  CHECK_FALSE(digests[0].empty());
}

TEST_CASE("trainers: gpt with --zero 1, 2 and 3 on 3 ranks learns what DDP learns") {
  ScratchDir s("gpt_zero");
  const std::vector<std::string> flags = {
      "--width",        "64",    "--layers",         "2",  "--heads",      "2", "--context",   "16",
      "--corpus_bytes", "20000", "--batch_size",     "4",  "--grad_accum", "2", "--max_steps", "5",
      "--bucket_mb",    "0.03",  "--clip_grad_norm", "0.5"};
  double losses[4] = {};
  for (int zero = 0; zero <= 3; ++zero) {
    std::vector<std::string> argv{CTRUN_PATH, "--standalone", "--nproc_per_node=3",
                                  GPT_PATH,   "--zero",       std::to_string(zero)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const std::string log = s.path("zero" + std::to_string(zero) + ".log");
    REQUIRE(run(argv, log) == 0);
    const std::string out = read_file(log);
    INFO(out);
    CHECK(out.find("parameters identical on all 3 rank(s)") != std::string::npos);
    if (zero == 3)
      CHECK(out.find("ZeRO stage 3, 3 unit(s)") != std::string::npos);  // 2 blocks, root
    losses[zero] = std::stod(last_value(out, "final loss "));
  }
  // The same training up to the order of float sums (reduce-scatter against all-reduce).
  for (int zero = 1; zero <= 3; ++zero) CHECK(std::abs(losses[zero] - losses[0]) < 1e-4);
  CHECK(losses[0] > 0);
  // A combination not built is a one-line error before any training.
  ChildProcess bad(
      {CTRUN_PATH, "--standalone", "--nproc_per_node=1", MLP_PATH, "--zero", "2", "--no_ddp"},
      s.path("bad.log"));
  CHECK(bad.wait(60s) != 0);
  CHECK(read_file(s.path("bad.log")).find("--zero and --no_ddp: choose one") != std::string::npos);
}

TEST_CASE("trainers: Adam's foreach kernels train to the loop's very parameters") {
  ScratchDir s("mlp_kernels");
  std::string digests[2];
  const char* kernels[2] = {"loop", "foreach"};
  for (int k = 0; k < 2; ++k) {
    auto flags = kSmall;
    flags.insert(flags.end(), {"--optimizer_kernel", kernels[k], "--max_steps", "8"});
    const std::string log = s.path(std::string(kernels[k]) + ".log");
    REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=2"}, flags), log) == 0);
    digests[k] = last_value(read_file(log), "digest ");
  }
  CHECK_FALSE(digests[0].empty());
  CHECK(digests[0] == digests[1]);
  ChildProcess bad({MLP_PATH, "--optimizer_kernel", "fast"}, s.path("bad.log"));
  CHECK(bad.wait(30s) != 0);
  CHECK(read_file(s.path("bad.log")).find("--optimizer_kernel") != std::string::npos);
}

TEST_CASE("trainers: gpt --size takes GPT-2's shapes, and no width, layers or heads beside it") {
  ScratchDir s("gpt_size");
  // GPT-2 small with a byte vocabulary: 85.5 M parameters (its first line counts them; the
  // run is stopped there, a CPU step of it takes a minute).
  ChildProcess small({GPT_PATH, "--size", "small", "--no_ddp", "--corpus_bytes", "20000"},
                     s.path("small.log"));
  CHECK(wait_for_text(s.path("small.log"), "training 85498624 parameters", 120s));
  small.signal(SIGKILL);
  (void)small.wait(30s);
  for (const char* other : {"--width", "--layers", "--heads"}) {
    ChildProcess bad({GPT_PATH, "--size", "small", other, "8"}, s.path("bad.log"));
    CHECK(bad.wait(30s) != 0);
    CHECK(read_file(s.path("bad.log")).find(std::string(other) + " excludes --size") !=
          std::string::npos);
  }
  ChildProcess unknown({GPT_PATH, "--size", "huge"}, s.path("unknown.log"));
  CHECK(unknown.wait(30s) != 0);
  CHECK(read_file(s.path("unknown.log")).find("--size: huge not in {small,medium,large,xl}") !=
        std::string::npos);
}

TEST_CASE("trainers: gpt's sharded checkpoints resume at another world and stage, and as DDP") {
  ScratchDir s("gpt_zero_resume");
  const std::vector<std::string> flags = {"--width",
                                          "64",
                                          "--layers",
                                          "2",
                                          "--heads",
                                          "2",
                                          "--context",
                                          "16",
                                          "--corpus_bytes",
                                          "20000",
                                          "--batch_size",
                                          "4",
                                          "--epochs",
                                          "1",
                                          "--checkpoint_dir",
                                          s.path("ckpt"),
                                          "--checkpoint_every",
                                          "2"};
  struct Phase {
    int ranks, zero, max_steps;
    std::string resumed;
  };
  const std::vector<Phase> phases = {
      {3, 3, 4, ""},
      {2, 2, 6, "resumed at step 4 (epoch 1, written by a world of 3, now 2)"},
      {2, 0, 8, "resumed at step 6 (epoch 1, written by a world of 2, now 2)"},
      {3, 1, 10, "resumed at step 8 (epoch 1, written by a world of 2, now 3)"}};
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const Phase& phase = phases[i];
    std::vector<std::string> argv{CTRUN_PATH,
                                  "--standalone",
                                  "--nproc_per_node=" + std::to_string(phase.ranks),
                                  GPT_PATH,
                                  "--zero",
                                  std::to_string(phase.zero),
                                  "--max_steps",
                                  std::to_string(phase.max_steps)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const std::string log = s.path("phase" + std::to_string(i) + ".log");
    REQUIRE(run(argv, log) == 0);
    const std::string out = read_file(log);
    INFO(out);
    if (!phase.resumed.empty()) CHECK(out.find(phase.resumed) != std::string::npos);
    CHECK(out.find("parameters identical on all " + std::to_string(phase.ranks) + " rank(s)") !=
          std::string::npos);
  }
  // Sharded ones are directories with a file per rank; the DDP phase wrote a whole file.
  CHECK(fs::exists(s.path("ckpt") + "/checkpoint-10/shard-2.bin"));
  CHECK(fs::exists(s.path("ckpt") + "/checkpoint-8.pt"));
}

TEST_CASE(
    "trainers: a worker SIGKILLed or hung mid-epoch resumes from its checkpoint to the same loss") {
  ScratchDir s("mlp_resume");
  std::vector<std::string> flags = kSmall;
  flags.insert(flags.end(), {"--checkpoint_every", "4"});

  auto uninterrupted = flags;
  uninterrupted.insert(uninterrupted.end(), {"--checkpoint_dir", s.path("a")});
  const auto clean_start = std::chrono::steady_clock::now();
  REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=2"}, uninterrupted), s.path("a.log")) ==
          0);
  const std::chrono::duration<double> clean_took = std::chrono::steady_clock::now() - clean_start;
  const std::string a = read_file(s.path("a.log"));
  const std::string loss = last_value(a, "final loss ");
  REQUIRE_FALSE(loss.empty());

  // 12 steps per epoch: step 18 is mid-way through the second; the last save was at step 16.
  struct Fault {
    const char* name;
    const char* flag;
    const char* ctrun_flag;
    const char* seen;
  };
  for (const Fault& f :
       {Fault{"killed", "--inject_kill_at_step", "--worker_timeout=0", "SIGKILL"},
        Fault{"hung", "--inject_hang_at_step", "--worker_timeout=2", "no heartbeat for "}}) {
    auto faulty = flags;
    faulty.insert(faulty.end(), {"--checkpoint_dir", s.path(f.name), f.flag, "18"});
    const std::string log = s.path(std::string(f.name) + ".log");
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=2", "--max_restarts=1",
                           "--shutdown_timeout=2", f.ctrun_flag},
                          faulty),
                log) == 0);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    const std::string b = read_file(log);
    INFO(b);
    // Detection: at once for an exit (pidfd), after --worker_timeout for a hang.
    const long long seen = log_time_ms(b, f.seen);
    const long long restarted = log_time_ms(b, "round 1: group rank");
    std::cout << "worker " << f.name << " at step 18: restarted " << restarted - seen
              << " ms after the agent saw it; resumed at step 16 (2 steps lost, checkpoint every "
                 "4); the run took "
              << took.count() - clean_took.count() << " s longer than uninterrupted ("
              << clean_took.count() << " s)" << std::endl;
    CHECK(seen >= 0);
    CHECK(restarted >= seen);
    CHECK(b.find(f.seen) != std::string::npos);
    CHECK(b.find("resumed at step 16 (epoch 2") != std::string::npos);
    CHECK(last_value(b, "final loss ") == loss);
    CHECK(last_value(b, "digest ") == last_value(a, "digest "));  // the very same parameters
  }
}

TEST_CASE("trainers: mlp on two nodes with --rdzv_backend=etcd meets in the job's etcd keys") {
  CTRUN_SKIP_WITHOUT_ETCD();
  ScratchDir s("mlp_etcd");
  EtcdCluster etcd(s, 1);
  const std::string job = "mlp-etcd";
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(std::make_unique<ChildProcess>(
        ctrun_mlp({"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=etcd",
                   "--rdzv_endpoint=" + etcd.endpoints(), "--rdzv_id=" + job},
                  kSmall),
        s.path("node" + std::to_string(n) + ".log")));
  }
  std::string logs;
  for (int n = 0; n < 2; ++n) {
    auto rc = nodes[n]->wait(180s);
    logs += read_file(s.path("node" + std::to_string(n) + ".log"));
    INFO(logs);
    REQUIRE(rc);
    CHECK(*rc == 0);
  }
  INFO(logs);
  CHECK(logs.find("parameters identical on all 2 rank(s)") != std::string::npos);

  // The workers' process group met through etcd, under the round's prefix in the job's store
  // (with TCPStore at MASTER_ADDR nothing would be there).
  boost::asio::io_context io;
  ctrun::rendezvous::etcd::ClientOptions options;
  options.endpoints = ctrun::rendezvous::parse_endpoint_list(etcd.endpoints()).value();
  ctrun::rendezvous::etcd::Client client(io, options);
  const std::string prefix = ctrun::rendezvous::etcd_job_prefix(job) + "store/rdzv/";
  auto found = run_task(io, client.range(prefix, ctrun::rendezvous::etcd::prefix_end(prefix)));
  REQUIRE(found);
  int process_group_keys = 0;
  for (const auto& kv : found.value().kvs) {
    if (kv.key.find("/ctrun/pg/0/") != std::string::npos) ++process_group_keys;
  }
  CHECK(process_group_keys > 0);
}

TEST_CASE("trainers: a resumed run may have another world size") {
  ScratchDir s("mlp_rescale");
  auto flags = kSmall;
  flags.insert(flags.end(), {"--checkpoint_dir", s.path("ckpt"), "--max_steps", "10"});
  REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=2"}, flags), s.path("two.log")) == 0);
  flags = kSmall;
  flags.insert(flags.end(), {"--checkpoint_dir", s.path("ckpt")});
  REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=3"}, flags), s.path("three.log")) == 0);
  const std::string out = read_file(s.path("three.log"));
  INFO(out);
  // 1536 samples / (2 ranks x 64) = 12 steps per epoch: step 10 is in the first epoch.
  CHECK(out.find("resumed at step 10 (epoch 1, written by a world of 2, now 3)") !=
        std::string::npos);
  CHECK(out.find("parameters identical on all 3 rank(s)") != std::string::npos);
}

TEST_CASE("trainers: a trainer's exception is its error file and ctrun's root cause") {
  ScratchDir s("mlp_error");
  // No GPU here (or, on a GPU machine, an impossible backend): the trainer throws.
  REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=1"},
                        {"--device", "cpu", "--backend", "nccl", "--epochs", "1"}),
              s.path("err.log")) == 1);
  const std::string out = read_file(s.path("err.log"));
  INFO(out);
  CHECK(out.find("Root Cause (first observed failure)") != std::string::npos);
  CHECK(out.find("error_file: <N/A>") == std::string::npos);
  CHECK(std::regex_search(out, std::regex("nccl: (no CUDA device|this build|tensors must be)")));
}

// On a GPU machine (scripts/gpu-build.sh): both trainers on cuda:0 over NCCL under ctrun, gpt
// also in bf16. Elsewhere the trainer's one-line refusal is checked, and the case warns.
TEST_CASE("trainers: mlp and gpt train on cuda under ctrun (GPU machines)") {
  ScratchDir s("cuda");
  if (run({MLP_PATH, "--device", "cuda", "--epochs", "1", "--max_steps", "1"},
          s.path("probe.log")) != 0) {
    const std::string out = read_file(s.path("probe.log"));
    INFO(out);
    CHECK(out.find("--device cuda: no CUDA device") != std::string::npos);
    CTRUN_SKIP("no CUDA device here");
  }
  REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=1"},
                        {"--device", "cuda", "--epochs", "2", "--seed", "7"}),
              s.path("mlp.log")) == 0);
  std::string out = read_file(s.path("mlp.log"));
  INFO(out);
  CHECK(out.find("parameters identical on all 1 rank(s)") != std::string::npos);
  CHECK(std::stod(last_value(out, "epoch 2/2 loss ")) <
        std::stod(last_value(out, "epoch 1/2 loss ")));

  REQUIRE(run({CTRUN_PATH, "--standalone", "--nproc_per_node=1", GPT_PATH, "--device", "cuda",
               "--bf16", "--epochs", "1", "--max_steps", "60", "--log_every", "20"},
              s.path("gpt.log")) == 0);
  out = read_file(s.path("gpt.log"));
  INFO(out);
  CHECK(out.find("parameters identical on all 1 rank(s)") != std::string::npos);
  // A byte model starts near ln(256) = 5.55; 60 steps on generated prose get well below.
  CHECK(std::stod(last_value(out, "final loss ")) < 4.0);
}

// On a GPU machine: a planned CUDA error (ctrun --faults) breaks mlp's CUDA context through
// libctrun_worker's NCCL group at its first step reported once the agent saw step 10 (steps
// are fast on a GPU: some steps later); the job restarts from its last checkpoint (every 8
// steps) and ends with the parameters of a clean run.
TEST_CASE("trainers: a CUDA error planned in mlp on cuda, and the job recovers (GPU machines)") {
  ScratchDir s("cuda_error");
  if (run({MLP_PATH, "--device", "cuda", "--epochs", "1", "--max_steps", "1"},
          s.path("probe.log")) != 0) {
    CTRUN_SKIP("no CUDA device here");
  }
  // cuBLAS with a fixed workspace picks the same kernels each run: a resumed run can repeat a
  // clean one bit for bit.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  auto job = [&](const std::string& name, std::vector<std::string> faults) {
    std::vector<std::string> flags = {"--standalone", "--nproc_per_node=1", "--max_restarts=1"};
    flags.insert(flags.end(), faults.begin(), faults.end());
    return ctrun_mlp(flags,
                     {"--device", "cuda", "--epochs", "2", "--seed", "7", "--checkpoint_every", "8",
                      "--checkpoint_dir", s.path(name + ".ckpt")});
  };
  REQUIRE(run(job("clean", {}), s.path("clean.log")) == 0);
  const std::string clean = last_value(read_file(s.path("clean.log")), "digest ");
  REQUIRE_FALSE(clean.empty());
  REQUIRE(run(job("faulted", {"--faults", "cuda_error:rank=0,at_step=10"}),
              s.path("faulted.log")) == 0);
  const std::string out = read_file(s.path("faulted.log"));
  INFO(out);
  CHECK(out.find("launching a kernel that fails on cuda:0") != std::string::npos);
  CHECK(out.find("device-side assert triggered") != std::string::npos);
  CHECK(out.find("restarting the job (1 of 1 restarts)") != std::string::npos);
  CHECK(last_value(out, "digest ") == clean);
}

TEST_CASE("trainers: bad trainer flags are one-line errors") {
  ScratchDir s("mlp_flags");
  ChildProcess p({MLP_PATH, "--epochs", "zero"}, s.path("flags.log"));
  CHECK(p.wait(30s) != 0);
  CHECK(read_file(s.path("flags.log")).find("--epochs") != std::string::npos);
}

TEST_CASE("trainers: mlp under the reference torchrun learns the same as under ctrun") {
  if (!can_unshare_network()) {
    CTRUN_SKIP("needs root for a loopback-only network namespace (unshare -n)");
  }
  ScratchDir s("mlp_torchrun");
  REQUIRE(run(ctrun_mlp({"--standalone", "--nproc_per_node=2"}, kSmall), s.path("ctrun.log")) == 0);
  std::string mlp_args;
  for (const auto& a : kSmall) mlp_args += " " + a;
  // Static rendezvous: torchrun's agent serves the TCPStore (TORCHELASTIC_USE_AGENT_STORE=True).
  // Standalone (c10d): rank 0's worker starts one.
  for (const std::string mode : {"--nnodes=1 --master_port=29511", "--standalone"}) {
    const std::string log = s.path("torchrun.log");
    const std::string cmd = "ip link set lo up && /usr/bin/python3 " TORCHRUN_REF_PATH " " + mode +
                            " --nproc_per_node=2 --no_python " MLP_PATH + mlp_args;
    REQUIRE(run({"/usr/bin/unshare", "-n", "sh", "-c", cmd}, log, 180s) == 0);
    const std::string out = read_file(log);
    INFO(mode << "\n" << out);
    CHECK(out.find("parameters identical on all 2 rank(s)") != std::string::npos);
    CHECK(last_value(out, "final loss ") ==
          last_value(read_file(s.path("ctrun.log")), "final loss "));
    std::remove(log.c_str());
  }
}
