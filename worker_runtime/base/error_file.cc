#include "ctrun/worker/error_file.h"

#include <cxxabi.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <typeinfo>

namespace ctrun::worker {
namespace {

std::string demangled(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                             std::free);
  return status == 0 && out ? out.get() : name;
}

}  // namespace

rendezvous::Status write_error_file(const std::string& path, const std::string& message,
                                    const std::string& details) {
  const nlohmann::json doc = {
      {"message",
       {{"message", message},
        {"extraInfo",
         {{"py_callstack", details}, {"timestamp", std::to_string(std::time(nullptr))}}}}}};
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out << doc.dump(2) << "\n";
    if (!out) {
      std::remove(tmp.c_str());
      return rendezvous::Error{rendezvous::ErrorCode::kInternal,
                               "cannot write error file '" + path + "': " + std::strerror(errno)};
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return rendezvous::Error{rendezvous::ErrorCode::kInternal,
                             "cannot write error file '" + path + "': " + why};
  }
  return rendezvous::ok_status();
}

int run_recorded(const std::string& error_file, const std::function<int()>& body) {
  std::string message;
  try {
    return body();
  } catch (const std::exception& e) {
    message = demangled(typeid(e).name()) + ": " + e.what();
  } catch (...) {
    message = "unknown exception (not derived from std::exception)";
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  if (!error_file.empty()) {
    if (auto s = write_error_file(error_file, message); !s) {
      std::fprintf(stderr, "%s\n", s.error().message.c_str());
    }
  }
  return 1;
}

}  // namespace ctrun::worker
