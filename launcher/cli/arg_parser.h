// A command-line reader with Python argparse's rules, as torchrun's parser applies them
// (torch/distributed/run.py with argparse_util's `env` and `check_env` actions):
//   - long options as `--opt value` or `--opt=value`; a prefix that starts exactly one option
//     string stands for it, a prefix that starts several is an error even when they are two
//     spellings of one option ("ambiguous option: --nproc could match --nproc-per-node,
//     --nproc_per_node");
//   - short options as `-r 3`, `-r3`, `-r=3`, and flags combined with the next one (`-mr3`);
//   - the last occurrence wins; a flag given a value (`--standalone=1`) is an error;
//   - a value may begin with '-' only when it is a negative number or holds a space;
//   - `--` ends the options; the first non-option is the script and everything after it is the
//     script's, unread (CPython >= 3.12.7: options after the script are never checked);
//   - defaults from PET_<DEST>: a value option takes the variable's text, even when empty; a
//     flag reads it as Python's int() does, non-zero meaning on.
// Pure: the environment comes in through a lookup function.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ctrun/rendezvous/error.h"

namespace ctrun::launcher {

enum class ArgKind {
  kValue,  // takes one value
  kFlag,   // takes none: given means on
  kExit,   // like a flag, but parsing stops where it is met (--help, --version)
};

// Where an option's default comes from when the command line does not give it.
enum class EnvDefault {
  kNone,         // the built-in default only (argparse's plain store)
  kPetVariable,  // PET_<DEST>: argparse_util.env for values, check_env for flags
};

struct ArgSpec {
  std::vector<std::string> names;  // option strings in torchrun's order: "--nproc-per-node" first
  std::string dest;                // "nproc_per_node"; the variable is PET_ + dest in upper case
  ArgKind kind = ArgKind::kValue;
  EnvDefault env = EnvDefault::kPetVariable;
  std::string help;  // one line for --help
  // Whether a prefix may stand for it. ctrun's later options take exact names only, so that
  // every abbreviation torchrun accepts means here what it means there ("--h" is --help).
  bool abbreviable = true;
};

// A value option's text and where it came from, so that a later check can name its source.
struct ArgValue {
  std::string text;
  std::string source;  // the option string as matched ("--nproc-per-node"), or "PET_NNODES"
  bool from_env = false;
};

struct ParsedArgs {
  std::map<std::string, ArgValue> values;  // by dest: the last value given, else the variable's
  std::set<std::string> flags;             // dests of the flags that are on
  std::string exit_dest;                   // the kExit option met ("help"), if any
  std::optional<std::string> script;       // the first positional argument
  std::vector<std::string> script_args;    // everything after it, verbatim
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The PET_ variable an option reads: "PET_" + dest in upper case (-m/--module: PET_MODULE).
std::string pet_variable(const ArgSpec& spec);

// Errors are argparse's messages ("unrecognized arguments: --foo", "argument --nnodes: expected
// one argument") or, for a flag's variable, "PET_STANDALONE: expected 0 or 1, got 'yes'".
rendezvous::Result<ParsedArgs> parse_args(const std::vector<ArgSpec>& table,
                                          const std::vector<std::string>& argv,
                                          const EnvLookup& env);

// Python's int(text) for base 10: surrounding whitespace, a sign, leading zeros and single '_'
// between digits are allowed. Nothing when the text is not an integer or does not fit.
std::optional<long long> python_int(const std::string& text);
// Whether `text` is an integer to Python's int() at all (of any size), and if so whether it is
// non-zero: how check_env turns a PET_ variable into a boolean.
std::optional<bool> python_int_is_nonzero(const std::string& text);

}  // namespace ctrun::launcher
