#include "text_corpus.h"

#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace ctrun::trainers {
namespace {

const std::vector<std::string> kSubjects = {
    "the agent",   "a worker",  "the daemon",    "every node", "the scheduler", "a trainer",
    "the cluster", "our model", "the optimizer", "a gradient", "the launcher",  "each rank"};
const std::vector<std::string> kVerbs = {
    "starts", "restarts", "watches",    "joins",     "leaves",   "reduces",   "averages",
    "saves",  "loads",    "broadcasts", "schedules", "measures", "waits for", "reports"};
const std::vector<std::string> kAdjectives = {"small", "large",       "stale", "healthy", "failed",
                                              "new",   "slow",        "fast",  "whole",   "next",
                                              "last",  "distributed", "local", "global"};
const std::vector<std::string> kObjects = {
    "checkpoint", "bucket",        "round",      "epoch",         "batch",
    "store",      "process group", "signal",     "learning rate", "parameter",
    "rendezvous", "log file",      "error file", "machine"};
const std::vector<std::string> kTails = {
    "before the step",   "after backward",    "on every node",     "when a peer dies",
    "without a restart", "in the next round", "as fast as it can", "once per epoch"};

}  // namespace

std::string generate_corpus(std::size_t bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&rng](const std::vector<std::string>& words) -> const std::string& {
    return words[rng() % words.size()];
  };
  std::string text;
  text.reserve(bytes + 128);
  while (text.size() < bytes) {
    std::string sentence =
        pick(kSubjects) + " " + pick(kVerbs) + " the " + pick(kAdjectives) + " " + pick(kObjects);
    if (rng() % 2 == 0) sentence += " " + pick(kTails);
    sentence[0] = static_cast<char>(sentence[0] - 'a' + 'A');
    text += sentence;
    text += rng() % 5 == 0 ? ".\n" : ". ";
  }
  text.resize(bytes);
  return text;
}

std::string read_corpus(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("--text " + path + ": cannot open it");
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) throw std::runtime_error("--text " + path + ": read error");
  return out.str();
}

}  // namespace ctrun::trainers
