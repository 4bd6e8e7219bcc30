// ctrun --fault_report=FILE.html on real workers: the page renders in headless Chromium, is not
// blank (each lane state's colour is on the screenshot), and holds a marker per fault.
#include <filesystem>
#include <vector>

#include "catch.h"
#include "ctrun/rendezvous/json.h"
#include "process.h"
#include "skip.h"

#ifdef CTRUN_TEST_HAVE_PNG
#include <png.h>
#endif

using namespace ctrun::testing;
using namespace std::chrono_literals;
using Json = ctrun::rendezvous::Json;

namespace {

constexpr const char* kChromium = "/usr/bin/chromium";

// Unused where the test is built without libpng.
[[maybe_unused]] std::vector<std::string> chromium(const ScratchDir& s,
                                                   std::vector<std::string> args) {
  std::vector<std::string> argv = {kChromium,
                                   "--headless",
                                   "--no-sandbox",
                                   "--disable-gpu",
                                   "--no-first-run",
                                   "--hide-scrollbars",
                                   "--user-data-dir=" + s.path("chromium")};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

}  // namespace

TEST_CASE("faults: the report page renders in headless Chromium with a marker per fault") {
  if (!std::filesystem::exists(kChromium)) {
    CTRUN_SKIP("no /usr/bin/chromium (scripts/setup.sh --tests installs it)");
  }
#ifndef CTRUN_TEST_HAVE_PNG
  CTRUN_SKIP("built without libpng (scripts/setup.sh --tests installs libpng-dev)");
#else
  ScratchDir s("faults_page");
  // Three workers of 40 steps of 50 ms: a kill at step 10, a hang from 0.8 s for 0.6 s, an
  // exception at step 30.
  ChildProcess agent(
      {CTRUN_PATH, "--standalone", "--nproc_per_node=3", "--max_restarts=2", "--faults",
       "kill:rank=1,at_step=10;hang:rank=0,after=0.8,duration=0.6;"
       "exception:rank=2,at_step=30",
       "--fault_report", s.path("report.html"), TEST_WORKER_PATH, "steps", "40", s.path("step")},
      s.path("agent.log"));
  const auto rc = agent.wait(60s);
  INFO(read_file(s.path("agent.log")));
  REQUIRE(rc == std::optional<int>(0));
  const std::string page = read_file(s.path("report.html"));
  CHECK(count_of(page, "class=\"fault-marker\"") == 3);

  // Chromium reads the same page: its DOM holds a marker per fault.
  const std::string url = "file://" + s.path("report.html");
  ChildProcess dom(chromium(s, {"--dump-dom", url}), s.path("dom.html"));
  REQUIRE(dom.wait(60s) == std::optional<int>(0));
  const std::string parsed = read_file(s.path("dom.html"));
  for (int fault = 1; fault <= 3; ++fault) {
    CHECK(parsed.find("class=\"fault-marker\" data-fault=\"" + std::to_string(fault) + "\"") !=
          std::string::npos);
  }

  // And draws it: the screenshot is not blank, and holds the lanes' colours.
  const std::string shot = s.path("report.png");
  ChildProcess screenshot(chromium(s, {"--window-size=1100,900", "--screenshot=" + shot, url}),
                          s.path("screenshot.log"));
  REQUIRE(screenshot.wait(60s) == std::optional<int>(0));
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&image, shot.c_str()) != 0);
  image.format = PNG_FORMAT_RGB;
  std::vector<unsigned char> pixels(PNG_IMAGE_SIZE(image));
  REQUIRE(png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr) != 0);
  CHECK(image.width == 1100);
  std::size_t ink = 0, running = 0, down = 0, hung = 0;
  for (std::size_t i = 0; i + 2 < pixels.size(); i += 3) {
    const int r = pixels[i], g = pixels[i + 1], b = pixels[i + 2];
    if (r < 240 || g < 240 || b < 240) ++ink;
    running += (r == 0x43 && g == 0xa0 && b == 0x47);
    down += (r == 0xe5 && g == 0x39 && b == 0x35);
    hung += (r == 0xfb && g == 0x8c && b == 0x00);
  }
  const std::size_t total = pixels.size() / 3;
  INFO("ink " << ink << " of " << total << ", running " << running << ", down " << down << ", hung "
              << hung);
  CHECK(ink > total / 50);
  CHECK(running > 1000);
  CHECK(down > 10);
  CHECK(hung > 10);
#endif
}
