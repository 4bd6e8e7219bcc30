#include "rendezvous/base/log.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include <unistd.h>
#include <string>

namespace ctrun::rendezvous {

void log_line(std::string_view component, std::string_view text) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string line = std::string(stamp) + "." + std::to_string(1000 + ms.count()).substr(1) + "Z " +
                     std::string(component) + ": " + std::string(text) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines from threads do not mix
}

std::string local_host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace ctrun::rendezvous
