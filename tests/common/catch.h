// The one include of Catch2 for every test: the suite builds with Catch2 2.13 (Debian 12) and
// Catch2 3 (Ubuntu 24.04, Debian 13), which moved its headers and renamed a few names. Tests
// write Catch2 3's names; under Catch2 2 they are defined here over the old ones.
// CTRUN_CATCH2_MAJOR comes from tests/CMakeLists.txt (the version find_package found).
#pragma once

#if CTRUN_CATCH2_MAJOR >= 3

#include <catch2/catch_all.hpp>

using Catch::Approx;

#else

#include <catch2/catch.hpp>

#include <string>

namespace Catch {
#ifdef CATCH_CONFIG_EXTERNAL_INTERFACES  // what a listener needs (skip.cc)
using EventListenerBase = TestEventListenerBase;
#endif
namespace Matchers {
inline StdString::ContainsMatcher ContainsSubstring(const std::string& text,
                                                    CaseSensitive::Choice cs = CaseSensitive::Yes) {
  return Contains(text, cs);
}
}  // namespace Matchers
}  // namespace Catch

#endif
