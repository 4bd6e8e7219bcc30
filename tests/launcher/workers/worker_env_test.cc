#include "ctrun/launcher/worker_env.h"

#include <algorithm>
#include <map>

#include "catch.h"
#include "ctrun/launcher/failure_report.h"

using namespace ctrun::launcher;

namespace {

std::map<std::string, std::string> as_map(const std::vector<std::string>& env) {
  std::map<std::string, std::string> out;
  for (const auto& e : env) {
    const auto eq = e.find('=');
    REQUIRE(eq != std::string::npos);
    REQUIRE(out.count(e.substr(0, eq)) == 0);  // no duplicates
    out[e.substr(0, eq)] = e.substr(eq + 1);
  }
  return out;
}

}  // namespace

TEST_CASE("worker env: torchrun's variables for a rank on the second node") {
  LaunchOptions o;
  o.role = "trainer";
  o.max_restarts = 3;
  WorkerEnvInputs in;
  in.options = &o;
  in.run_id = "job1";
  in.local_world_size = 4;
  in.local_rank = 2;
  in.placement = RoundPlacement{1, 2, 4, 8, "10.0.0.1", 29511, 2};
  in.store.host = "10.0.0.9";
  in.store.port = 29400;
  in.store.prefix = "rdzv/0/3/";
  in.store.token = "tok";
  in.error_file = "/tmp/x/error.json";
  in.heartbeat_file = "/tmp/x/heartbeat";
  in.set_omp_num_threads = true;
  auto env = as_map(
      worker_environment({"PATH=/bin", "RANK=99", "HOME=/root", "CTRUN_STORE_BACKEND=etcd"}, in));
  CHECK(env["PATH"] == "/bin");
  CHECK(env["HOME"] == "/root");
  CHECK(env["RANK"] == "6");  // the agent's own RANK is replaced
  CHECK(env["LOCAL_RANK"] == "2");
  CHECK(env["GROUP_RANK"] == "1");
  CHECK(env["ROLE_RANK"] == "6");
  CHECK(env["ROLE_NAME"] == "trainer");
  CHECK(env["LOCAL_WORLD_SIZE"] == "4");
  CHECK(env["WORLD_SIZE"] == "8");
  CHECK(env["GROUP_WORLD_SIZE"] == "2");
  CHECK(env["ROLE_WORLD_SIZE"] == "8");
  CHECK(env["MASTER_ADDR"] == "10.0.0.1");
  CHECK(env["MASTER_PORT"] == "29511");
  CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "2");
  CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "3");
  CHECK(env["TORCHELASTIC_RUN_ID"] == "job1");
  CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "False");
  CHECK(env["TORCHELASTIC_ERROR_FILE"] == "/tmp/x/error.json");
  CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
  CHECK(env["OMP_NUM_THREADS"] == "1");
  CHECK(env["CTRUN_STORE_BACKEND"] == "ctrund");  // whatever the agent's own environment said
  CHECK(env["CTRUN_STORE_ADDR"] == "10.0.0.9");
  CHECK(env["CTRUN_STORE_PORT"] == "29400");
  CHECK(env["CTRUN_STORE_PREFIX"] == "rdzv/0/3/");
  CHECK(env["CTRUN_RDZV_TOKEN"] == "tok");
  CHECK(env["CTRUN_HEARTBEAT_FILE"] == "/tmp/x/heartbeat");
}

TEST_CASE("worker env: OMP_NUM_THREADS, the token and the heartbeat file only when due") {
  LaunchOptions o;
  WorkerEnvInputs in;
  in.options = &o;
  auto env = as_map(worker_environment({"OMP_NUM_THREADS=8"}, in));
  CHECK(env["OMP_NUM_THREADS"] == "8");
  CHECK(env.count("CTRUN_RDZV_TOKEN") == 0);
  CHECK(env.count("CTRUN_HEARTBEAT_FILE") == 0);
}

TEST_CASE("worker env: each torch's NCCL and signal variables, and the user's values kept") {
  LaunchOptions o;
  o.signals_text = "SIGTERM,SIGUSR1";
  WorkerEnvInputs in;
  in.options = &o;
  SECTION("torch 1.13: its agent's one name, and nothing of 2.x") {
    in.torch = TorchVersion{1, 13};
    auto env = as_map(worker_environment({}, in));
    CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 0);
    CHECK(env.count("TORCHELASTIC_SIGNALS_TO_HANDLE") == 0);
    env = as_map(worker_environment({"NCCL_ASYNC_ERROR_HANDLING=0"}, in));
    CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "0");
  }
  SECTION("torch 2.1 still reads the old name; 2.2 on the new one, which does not warn") {
    in.torch = TorchVersion{2, 1};
    auto env = as_map(worker_environment({}, in));
    CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING") == 0);
    in.torch = TorchVersion{2, 11};
    env = as_map(worker_environment({"TORCH_NCCL_ASYNC_ERROR_HANDLING=3"}, in));
    CHECK(env.count("NCCL_ASYNC_ERROR_HANDLING") == 0);
    CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3");
    CHECK(env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR1");
  }
  SECTION("a torch not known (a C++ trainer): both names, the user's values kept") {
    auto env = as_map(worker_environment({"NCCL_ASYNC_ERROR_HANDLING=2"}, in));
    CHECK(env["NCCL_ASYNC_ERROR_HANDLING"] == "2");
    CHECK(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1");
    CHECK(env["TORCHELASTIC_SIGNALS_TO_HANDLE"] == "SIGTERM,SIGUSR1");
  }
}

TEST_CASE("worker env: torch's version read from its version.py's text") {
  CHECK(parse_torch_version("2.11.0+cu130\n") == TorchVersion{2, 11});
  CHECK(parse_torch_version("1.13.0a0") == TorchVersion{1, 13});
  CHECK(parse_torch_version("2.6.0") == TorchVersion{2, 6});
  CHECK_FALSE(parse_torch_version(""));
  CHECK_FALSE(parse_torch_version("\n"));
  CHECK_FALSE(parse_torch_version("torch"));
  CHECK_FALSE(parse_torch_version("2"));
  CHECK_FALSE(parse_torch_version("2.x"));
}

TEST_CASE("worker command: python scripts, modules and executables") {
  LaunchOptions o;
  o.entrypoint = "train.py";
  o.script_args = {"--epochs", "3"};
  auto py = worker_command(o, "/usr/bin/python3");
  CHECK(py.executable == "/usr/bin/python3");
  CHECK(py.args == std::vector<std::string>{"-u", "train.py", "--epochs", "3"});
  o.module = true;
  o.entrypoint = "pkg.train";
  CHECK(worker_command(o, "python3").args ==
        std::vector<std::string>{"-u", "-m", "pkg.train", "--epochs", "3"});
  o.module = false;
  o.entrypoint = "./trainer";
  auto exe = worker_command(o, "python3");
  CHECK(exe.executable == "./trainer");
  CHECK(exe.args == std::vector<std::string>{"--epochs", "3"});
  o.entrypoint = "script.py";
  o.no_python = true;
  CHECK(worker_command(o, "python3").executable == "script.py");
}

TEST_CASE("failure report: torchrun's layout with the error file's traceback") {
  const std::string path = "ctrun_failure_report_test.json";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(R"({"message": {"message": "RuntimeError: boom", "extraInfo": )"
               R"({"py_callstack": "Traceback (most recent call last):\nRuntimeError: boom\n", )"
               R"("timestamp": "1"}}})",
               f);
    std::fclose(f);
  }
  FailureInfo info;
  info.entrypoint = "train.py";
  info.host = "node3";
  info.rank = 5;
  info.local_rank = 1;
  info.pid = 4242;
  info.exit_code = 1;
  info.error_file = path;
  const std::string report = format_failure_report(info);
  CHECK(report.find("train.py FAILED") != std::string::npos);
  CHECK(report.find("Root Cause (first observed failure):") != std::string::npos);
  CHECK(report.find("host      : node3") != std::string::npos);
  CHECK(report.find("rank      : 5 (local_rank: 1)") != std::string::npos);
  CHECK(report.find("exitcode  : 1 (pid: 4242)") != std::string::npos);
  CHECK(report.find("error_file: " + path) != std::string::npos);
  CHECK(report.find("RuntimeError: boom") != std::string::npos);
  info.signal = 9;
  info.error_file = "/nonexistent";
  const std::string killed = format_failure_report(info);
  CHECK(killed.find("exitcode  : -9") != std::string::npos);
  CHECK(killed.find("SIGKILL") != std::string::npos);
  CHECK(killed.find("error_file: <N/A>") != std::string::npos);
  CHECK(read_error_file(path).value().find("Traceback") == 0);
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(R"({"message": "plain C++ message"})", f);
    std::fclose(f);
  }
  CHECK(read_error_file(path).value() == "plain C++ message");
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("not json", f);
    std::fclose(f);
  }
  CHECK_FALSE(read_error_file(path));
  std::remove(path.c_str());
}

TEST_CASE("worker env: with etcd, the store is the etcd members, no port and no token") {
  LaunchOptions o;
  WorkerEnvInputs in;
  in.options = &o;
  in.store =
      ctrun::rendezvous::etcd_store_address({{"10.0.0.9", 2379}, {"fd00::1", 2380}}, "rdzv/0/3/");
  auto env = as_map(worker_environment({}, in));
  CHECK(env["CTRUN_STORE_BACKEND"] == "etcd");
  CHECK(env["CTRUN_STORE_ADDR"] == "10.0.0.9:2379,[fd00::1]:2380");
  CHECK(env["CTRUN_STORE_PREFIX"] == "rdzv/0/3/");
  CHECK(env.count("CTRUN_STORE_PORT") == 0);
  CHECK(env.count("CTRUN_RDZV_TOKEN") == 0);
  CHECK(env.count("CTRUN_STORE_PROTOCOL") == 0);
  CHECK(env.count("CTRUN_STORE_USER") == 0);

  // Over TLS and as a user: the files' paths, never a password.
  ctrun::rendezvous::StoreAccess access;
  access.tls = ctrun::rendezvous::TlsClientFiles{"/ca.pem", "", ""};
  access.user = "alice";
  access.password_file = "/run/pw";
  in.store = ctrun::rendezvous::etcd_store_address({{"10.0.0.9", 2379}}, "rdzv/0/3/", access);
  env = as_map(worker_environment({}, in));
  CHECK(env["CTRUN_STORE_PROTOCOL"] == "https");
  CHECK(env["CTRUN_STORE_CACERT"] == "/ca.pem");
  CHECK(env.count("CTRUN_STORE_CERT") == 0);
  CHECK(env["CTRUN_STORE_USER"] == "alice");
  CHECK(env["CTRUN_STORE_PASSWORD_FILE"] == "/run/pw");

  // A ctrund over TLS: protocol tls and the same files.
  ctrun::rendezvous::StoreAddress ctrund;
  ctrund.host = "10.0.0.1";
  ctrund.port = 29400;
  ctrund.prefix = "rdzv/0/1/";
  ctrund.access.tls = ctrun::rendezvous::TlsClientFiles{"/ca.pem", "/c.pem", "/c.key"};
  in.store = ctrund;
  env = as_map(worker_environment({}, in));
  CHECK(env["CTRUN_STORE_BACKEND"] == "ctrund");
  CHECK(env["CTRUN_STORE_PROTOCOL"] == "tls");
  CHECK(env["CTRUN_STORE_CACERT"] == "/ca.pem");
  CHECK(env["CTRUN_STORE_CERT"] == "/c.pem");
  CHECK(env["CTRUN_STORE_KEY"] == "/c.key");
  CHECK(env.count("CTRUN_STORE_USER") == 0);
}

TEST_CASE("worker env: --virtual_local_rank gives LOCAL_RANK=0 and the worker's own device") {
  LaunchOptions o;
  o.virtual_local_rank = true;
  WorkerEnvInputs in;
  in.options = &o;
  in.local_world_size = 3;
  in.local_rank = 2;
  in.placement = RoundPlacement{0, 1, 0, 3, "127.0.0.1", 29511, 0};
  // The agent's CUDA_VISIBLE_DEVICES is split on ',' and the entry stripped, as torchrun does.
  auto narrowed = as_map(worker_environment({"CUDA_VISIBLE_DEVICES=4,5, 7 "}, in));
  CHECK(narrowed["LOCAL_RANK"] == "0");
  CHECK(narrowed["RANK"] == "2");  // the real ranks are unchanged
  CHECK(narrowed["CUDA_VISIBLE_DEVICES"] == "7");
  // Without one, the device is the local rank.
  auto plain = as_map(worker_environment({"PATH=/bin"}, in));
  CHECK(plain["LOCAL_RANK"] == "0");
  CHECK(plain["CUDA_VISIBLE_DEVICES"] == "2");
  // Off: the local rank, and the agent's CUDA_VISIBLE_DEVICES passed through untouched.
  o.virtual_local_rank = false;
  auto off = as_map(worker_environment({"CUDA_VISIBLE_DEVICES=4,5,7"}, in));
  CHECK(off["LOCAL_RANK"] == "2");
  CHECK(off["CUDA_VISIBLE_DEVICES"] == "4,5,7");
}

TEST_CASE("worker env: --virtual_local_rank needs a device for every local rank") {
  LaunchOptions o;
  auto env = [](std::optional<std::string> visible) {
    return [visible](const std::string& name) -> std::optional<std::string> {
      return name == "CUDA_VISIBLE_DEVICES" ? visible : std::nullopt;
    };
  };
  CHECK(check_virtual_local_rank(o, 4, env("0")).ok());  // off: not checked
  o.virtual_local_rank = true;
  CHECK(check_virtual_local_rank(o, 4, env(std::nullopt)).ok());
  CHECK(check_virtual_local_rank(o, 2, env("0,1")).ok());
  auto short_list = check_virtual_local_rank(o, 3, env("0,1"));
  REQUIRE_FALSE(short_list.ok());
  CHECK(short_list.error().message ==
        "--virtual_local_rank: local rank 2 exceeds available GPUs in CUDA_VISIBLE_DEVICES=0,1 "
        "(3 workers per node)");
}

TEST_CASE("worker env: PYTHONFAULTHANDLER for hung-worker stacks, unless the user chose") {
  LaunchOptions o;
  WorkerEnvInputs in;
  in.options = &o;
  in.run_id = "job1";
  CHECK(as_map(worker_environment({"PATH=/bin"}, in)).count("PYTHONFAULTHANDLER") == 0);
  in.python_fault_handler = true;
  CHECK(as_map(worker_environment({"PATH=/bin"}, in))["PYTHONFAULTHANDLER"] == "1");
  CHECK(as_map(worker_environment({"PYTHONFAULTHANDLER="}, in))["PYTHONFAULTHANDLER"].empty());
}

TEST_CASE("worker env: ctrun's Python helper first on PYTHONPATH, and the fault file") {
  LaunchOptions o;
  WorkerEnvInputs in;
  in.options = &o;
  in.run_id = "job1";
  auto plain = as_map(worker_environment({"PYTHONPATH=/mine"}, in));
  CHECK(plain["PYTHONPATH"] == "/mine");
  CHECK(plain.count("CTRUN_FAULT_FILE") == 0);
  in.python_helper_dir = "/tmp/r/job1/python";
  in.fault_file = "/tmp/r/job1/attempt_0/0/fault";
  auto env = as_map(worker_environment({"PYTHONPATH=/mine:/theirs"}, in));
  CHECK(env["PYTHONPATH"] == "/tmp/r/job1/python:/mine:/theirs");
  CHECK(env["CTRUN_FAULT_FILE"] == "/tmp/r/job1/attempt_0/0/fault");
  CHECK(as_map(worker_environment({"PATH=/bin"}, in))["PYTHONPATH"] == "/tmp/r/job1/python");
  CHECK(as_map(worker_environment({"PYTHONPATH="}, in))["PYTHONPATH"] == "/tmp/r/job1/python");
}

TEST_CASE(
    "worker env: the stacks file and signal of hang reports, and the Flight Recorder's "
    "variables unless the user set them") {
  LaunchOptions o;
  WorkerEnvInputs in;
  in.options = &o;
  in.run_id = "job1";
  auto plain = as_map(worker_environment({"PATH=/bin"}, in));
  CHECK(plain.count("CTRUN_STACKS_FILE") == 0);
  CHECK(plain.count("TORCH_NCCL_TRACE_BUFFER_SIZE") == 0);
  in.stacks_file = "/tmp/r/job1/attempt_0/0/python_stacks";
  in.stacks_signal = 40;
  in.flight_recorder_prefix = "/tmp/r/job1/attempt_0/0/nccl_trace_";
  auto env = as_map(worker_environment({"PATH=/bin"}, in));
  CHECK(env["CTRUN_STACKS_FILE"] == "/tmp/r/job1/attempt_0/0/python_stacks");
  CHECK(env["CTRUN_STACKS_SIGNAL"] == "40");
  CHECK(env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000");
  CHECK(env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1");
  CHECK(env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/tmp/r/job1/attempt_0/0/nccl_trace_");
  CHECK(env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/tmp/r/job1/attempt_0/0/nccl_trace_");
  auto users = as_map(worker_environment({"TORCH_FR_BUFFER_SIZE=50", "TORCH_NCCL_DUMP_ON_TIMEOUT=0",
                                          "TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/x/"},
                                         in));
  CHECK(users.count("TORCH_NCCL_TRACE_BUFFER_SIZE") == 0);
  CHECK(users["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0");
  CHECK(users["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/x/");
  // A user's TORCH_FR_ names count as set.
  auto fr_users =
      as_map(worker_environment({"TORCH_FR_BUFFER_SIZE=9", "TORCH_FR_DUMP_TEMP_FILE=/y/"}, in));
  CHECK(fr_users.count("TORCH_NCCL_TRACE_BUFFER_SIZE") == 0);
  CHECK(fr_users.count("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == 0);
  CHECK(fr_users["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/tmp/r/job1/attempt_0/0/nccl_trace_");
}
