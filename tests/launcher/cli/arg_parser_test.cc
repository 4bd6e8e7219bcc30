// argparse's rules as torchrun applies them, on a table shaped like torchrun's (both spellings,
// short options, flags, a help action). Expected results were checked against a replica of
// torch/distributed/run.py's parser under CPython (3.12.7+ where the versions differ).
#include "launcher/cli/arg_parser.h"

#include <map>

#include "catch.h"
#include "fake_env.h"

using namespace ctrun::launcher;
using ctrun::testing::env_of;

namespace {

const std::vector<ArgSpec>& table() {
  static const std::vector<ArgSpec> t = {
      {{"-h", "--help"}, "help", ArgKind::kExit, EnvDefault::kNone, ""},
      {{"--nnodes"}, "nnodes", ArgKind::kValue, EnvDefault::kPetVariable, ""},
      {{"--nproc-per-node", "--nproc_per_node"},
       "nproc_per_node",
       ArgKind::kValue,
       EnvDefault::kPetVariable,
       ""},
      {{"--standalone"}, "standalone", ArgKind::kFlag, EnvDefault::kPetVariable, ""},
      {{"--max-restarts", "--max_restarts"},
       "max_restarts",
       ArgKind::kValue,
       EnvDefault::kPetVariable,
       ""},
      {{"--monitor-interval", "--monitor_interval"},
       "monitor_interval",
       ArgKind::kValue,
       EnvDefault::kPetVariable,
       ""},
      {{"--start-method", "--start_method"},
       "start_method",
       ArgKind::kValue,
       EnvDefault::kPetVariable,
       ""},
      {{"-m", "--module"}, "module", ArgKind::kFlag, EnvDefault::kPetVariable, ""},
      {{"--log-dir", "--log_dir"}, "log_dir", ArgKind::kValue, EnvDefault::kPetVariable, ""},
      {{"-r", "--redirects"}, "redirects", ArgKind::kValue, EnvDefault::kPetVariable, ""},
      {{"-t", "--tee"}, "tee", ArgKind::kValue, EnvDefault::kPetVariable, ""},
      {{"--logs-specs", "--logs_specs"}, "logs_specs", ArgKind::kValue, EnvDefault::kNone, ""},
  };
  return t;
}

ParsedArgs ok(std::vector<std::string> argv, std::map<std::string, std::string> env = {}) {
  auto r = parse_args(table(), argv, env_of(env));
  INFO((r ? "" : r.error().message));
  REQUIRE(r.ok());
  return r.value();
}

std::string error(std::vector<std::string> argv, std::map<std::string, std::string> env = {}) {
  auto r = parse_args(table(), argv, env_of(env));
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}

std::string value(const ParsedArgs& a, const std::string& dest) {
  auto it = a.values.find(dest);
  return it == a.values.end() ? "<unset>" : it->second.text;
}

using Args = std::vector<std::string>;

}  // namespace

TEST_CASE("arg_parser: long options in both spellings, with a space or '='") {
  CHECK(value(ok({"--nproc-per-node", "4", "x"}), "nproc_per_node") == "4");
  CHECK(value(ok({"--nproc_per_node=4", "x"}), "nproc_per_node") == "4");
  CHECK(value(ok({"--nnodes=1:2", "x"}), "nnodes") == "1:2");
  auto a = ok({"--max-restarts", "3", "x"});
  CHECK(a.values.at("max_restarts").source == "--max-restarts");
  CHECK_FALSE(a.values.at("max_restarts").from_env);
  CHECK(value(ok({"--tee=", "x"}), "tee").empty());              // an empty value is a value
  CHECK(value(ok({"--log-dir=a=b", "x"}), "log_dir") == "a=b");  // split at the first '='
}

TEST_CASE("arg_parser: unambiguous prefixes stand for the option") {
  CHECK(value(ok({"--nn", "2", "x"}), "nnodes") == "2");
  CHECK(value(ok({"--nn=2", "x"}), "nnodes") == "2");
  CHECK(value(ok({"--nproc-", "2", "x"}), "nproc_per_node") == "2");
  CHECK(value(ok({"--nproc_p=2", "x"}), "nproc_per_node") == "2");
  CHECK(ok({"--stan", "x"}).flags.count("standalone") == 1);
  CHECK(value(ok({"--max_", "1", "x"}), "max_restarts") == "1");
  CHECK(ok({"--mod", "x"}).flags.count("module") == 1);
  CHECK(ok({"--he"}).exit_dest == "help");
  // The matched option string is the source, as written in the table.
  CHECK(ok({"--nn=2", "x"}).values.at("nnodes").source == "--nnodes");
}

TEST_CASE("arg_parser: prefixes of several option strings are ambiguous, even of one option") {
  CHECK(error({"--nproc", "2", "x"}) ==
        "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node");
  CHECK(error({"--nproc=2", "x"}) ==
        "ambiguous option: --nproc=2 could match --nproc-per-node, --nproc_per_node");
  CHECK(error({"--st", "spawn", "x"}) ==
        "ambiguous option: --st could match --standalone, --start-method, --start_method");
  CHECK(error({"--mo", "x"}) ==
        "ambiguous option: --mo could match --monitor-interval, --monitor_interval, --module");
  CHECK(error({"--max", "1", "x"}) ==
        "ambiguous option: --max could match --max-restarts, --max_restarts");
}

TEST_CASE("arg_parser: short options, attached values and combined flags") {
  CHECK(value(ok({"-r", "3", "x"}), "redirects") == "3");
  CHECK(value(ok({"-r3", "x"}), "redirects") == "3");
  CHECK(value(ok({"-r=3", "x"}), "redirects") == "3");
  CHECK(value(ok({"-rm", "x"}), "redirects") == "m");
  CHECK(value(ok({"-t=", "x"}), "tee").empty());
  auto mr = ok({"-mr3", "x"});
  CHECK(mr.flags.count("module") == 1);
  CHECK(value(mr, "redirects") == "3");
  auto mt = ok({"-mt", "0:1", "x"});
  CHECK(mt.flags.count("module") == 1);
  CHECK(value(mt, "tee") == "0:1");
  CHECK(value(ok({"-mr=3", "x"}), "redirects") == "3");  // CPython >= 3.12 ("=3" before)
  CHECK(ok({"-mh"}).exit_dest == "help");
  CHECK(error({"-mx", "x"}) == "unrecognized arguments: -x");
  CHECK(error({"-nnodes", "2", "x"}) == "unrecognized arguments: -nnodes");
}

TEST_CASE("arg_parser: a flag given a value is refused as argparse does") {
  CHECK(error({"--standalone=1", "x"}) == "argument --standalone: ignored explicit argument '1'");
  CHECK(error({"--standalone=", "x"}) == "argument --standalone: ignored explicit argument ''");
  CHECK(error({"--module=1", "x"}) == "argument -m/--module: ignored explicit argument '1'");
  CHECK(error({"-m=1", "x"}) == "argument -m/--module: ignored explicit argument '1'");
  CHECK(error({"--stan=yes", "x"}) == "argument --standalone: ignored explicit argument 'yes'");
}

TEST_CASE("arg_parser: the last occurrence wins") {
  CHECK(value(ok({"--nnodes", "1", "--nnodes", "2", "x"}), "nnodes") == "2");
  CHECK(value(ok({"--nproc_per_node=1", "--nproc-per-node", "3", "x"}), "nproc_per_node") == "3");
  CHECK(value(ok({"-r", "1", "--redirects=2", "-r3", "x"}), "redirects") == "3");
  CHECK(ok({"--module", "-m", "x"}).flags.count("module") == 1);
}

TEST_CASE("arg_parser: values that begin with '-'") {
  CHECK(value(ok({"--max-restarts", "-1", "x"}), "max_restarts") == "-1");  // a negative number
  CHECK(value(ok({"--log-dir", "-.5", "x"}), "log_dir") == "-.5");
  CHECK(value(ok({"--log-dir", "-x y", "x"}), "log_dir") == "-x y");  // it holds a space
  CHECK(value(ok({"--log-dir", "-", "x"}), "log_dir") == "-");
  CHECK(value(ok({"--log-dir=-x", "x"}), "log_dir") == "-x");
  CHECK(error({"--log-dir", "-x", "x"}) == "argument --log-dir/--log_dir: expected one argument");
  CHECK(error({"--log-dir", "--nnodes", "2", "x"}) ==
        "argument --log-dir/--log_dir: expected one argument");
  CHECK(error({"--nnodes", "--", "2", "x"}) == "argument --nnodes: expected one argument");
  CHECK(error({"-r"}) == "argument -r/--redirects: expected one argument");
}

TEST_CASE("arg_parser: the script ends the options and keeps everything after it") {
  auto a = ok({"--nnodes=2", "train.py", "--nproc", "3", "-m", "--nnodes=9"});
  CHECK(a.script == "train.py");
  CHECK(a.script_args == Args{"--nproc", "3", "-m", "--nnodes=9"});
  CHECK(value(a, "nnodes") == "2");
  CHECK(a.flags.count("module") == 0);
  auto module = ok({"-m", "torch.utils.foo", "--x"});
  CHECK(module.script == "torch.utils.foo");
  CHECK(module.script_args == Args{"--x"});
  CHECK(ok({"-1"}).script == "-1");  // a negative number is an argument
  auto none = ok({"--nnodes=2"});
  CHECK_FALSE(none.script.has_value());
  CHECK_FALSE(ok({"-r", "train.py"}).script.has_value());  // -r took it as its value
}

TEST_CASE("arg_parser: '--' ends the options") {
  auto a = ok({"--", "train.py", "--nnodes", "3"});
  CHECK(a.script == "train.py");
  CHECK(a.script_args == Args{"--nnodes", "3"});
  CHECK(ok({"--nnodes", "2", "--", "train.py", "--foo"}).script_args == Args{"--foo"});
  CHECK(ok({"train.py", "--", "--foo"}).script_args == Args{"--foo"});
  CHECK(ok({"--", "train.py", "--", "x"}).script_args == Args{"--", "x"});
  CHECK(ok({"--", "--nnodes"}).script == "--nnodes");
}

TEST_CASE("arg_parser: unknown options") {
  CHECK(error({"--foo", "train.py"}) == "unrecognized arguments: --foo");
  CHECK(error({"--foo", "-z", "train.py"}) == "unrecognized arguments: --foo -z");
  CHECK(error({"--foo=1", "train.py"}) == "unrecognized arguments: --foo=1");
  CHECK(ok({"--foo --bar"}).script == "--foo --bar");  // a space: an argument
}

TEST_CASE("arg_parser: help stops at once, even before errors further on") {
  CHECK(ok({"--help", "--foo"}).exit_dest == "help");
  CHECK(ok({"--foo", "-h"}).exit_dest == "help");
  CHECK(ok({"train.py", "--help"}).exit_dest.empty());  // the script's own --help
  CHECK(error({"--standalone=1", "--help"}).find("ignored explicit argument") != std::string::npos);
}

TEST_CASE("arg_parser: PET_ variables for values: text as it is, even empty") {
  auto a = ok({"x"}, {{"PET_NNODES", "1:4"}, {"PET_MAX_RESTARTS", ""}});
  CHECK(value(a, "nnodes") == "1:4");
  CHECK(a.values.at("nnodes").source == "PET_NNODES");
  CHECK(a.values.at("nnodes").from_env);
  CHECK(value(a, "max_restarts").empty());  // set but empty still overrides the default
  auto flag_wins = ok({"--nnodes=2", "x"}, {{"PET_NNODES", "1:4"}});
  CHECK(value(flag_wins, "nnodes") == "2");
  CHECK_FALSE(flag_wins.values.at("nnodes").from_env);
  // Options without an env action read nothing (torchrun: --logs-specs, -h).
  CHECK(value(ok({"x"}, {{"PET_LOGS_SPECS", "custom"}}), "logs_specs") == "<unset>");
  // Named by dest, not by the short option: -m reads PET_MODULE, not PET_M.
  CHECK(ok({"x"}, {{"PET_MODULE", "1"}}).flags.count("module") == 1);
  CHECK(ok({"x"}, {{"PET_M", "1"}}).flags.count("module") == 0);
  CHECK(value(ok({"x"}, {{"PET_REDIRECTS", "3"}}), "redirects") == "3");
}

TEST_CASE("arg_parser: PET_ variables for flags are read as Python's int()") {
  auto on = [](const std::string& text) {
    return ok({"x"}, {{"PET_STANDALONE", text}}).flags.count("standalone") == 1;
  };
  CHECK(on("1"));
  CHECK(on(" 1 "));
  CHECK(on("-1"));
  CHECK(on("+2"));
  CHECK(on("0_1"));
  CHECK(on("99999999999999999999999"));
  CHECK_FALSE(on("0"));
  CHECK_FALSE(on("00"));
  CHECK_FALSE(on("-0"));
  CHECK(error({"x"}, {{"PET_STANDALONE", "true"}}) ==
        "PET_STANDALONE: expected 0 or 1, got 'true'");
  CHECK(error({"x"}, {{"PET_STANDALONE", ""}}) == "PET_STANDALONE: expected 0 or 1, got ''");
  CHECK(error({"x"}, {{"PET_STANDALONE", "1.0"}}).rfind("PET_STANDALONE", 0) == 0);
  CHECK(error({"x"}, {{"PET_MODULE", "yes"}}).rfind("PET_MODULE", 0) == 0);
  // The command line cannot turn a flag off that the variable turned on.
  CHECK(on("1"));
  CHECK(ok({"--standalone", "x"}, {{"PET_STANDALONE", "0"}}).flags.count("standalone") == 1);
}

TEST_CASE("arg_parser: python_int reads what Python's int() reads") {
  CHECK(python_int("42") == 42);
  CHECK(python_int(" -7\n") == -7);
  CHECK(python_int("+3") == 3);
  CHECK(python_int("007") == 7);
  CHECK(python_int("1_000") == 1000);
  CHECK_FALSE(python_int(""));
  CHECK_FALSE(python_int(" "));
  CHECK_FALSE(python_int("-"));
  CHECK_FALSE(python_int("1.0"));
  CHECK_FALSE(python_int("1e3"));
  CHECK_FALSE(python_int("_1"));
  CHECK_FALSE(python_int("1_"));
  CHECK_FALSE(python_int("1__0"));
  CHECK_FALSE(python_int("0x10"));
  CHECK_FALSE(python_int("1 2"));
  CHECK_FALSE(python_int("99999999999999999999999"));  // an int, but not one that fits
  CHECK(python_int_is_nonzero("99999999999999999999999") == true);
  CHECK(python_int_is_nonzero("0_0") == false);
  CHECK_FALSE(python_int_is_nonzero("abc"));
}

TEST_CASE("arg_parser: the PET_ variable of an option") {
  CHECK(pet_variable(table()[2]) == "PET_NPROC_PER_NODE");
  CHECK(pet_variable(table()[7]) == "PET_MODULE");
}
