// A node's own faults on a fake nft: each cut undone once, a restore that comes before its cut
// carried out when the cut is made, failures said with what to do by hand. (Filling a real disk
// is disk_fill_test's and the fault agent tests'.)
#include "launcher/faults/node_faults.h"

#include <string>
#include <vector>

#include "catch.h"

using ctrun::launcher::NodeFaults;

namespace {

struct FakeNft {
  std::vector<std::vector<std::string>> runs;
  int exit_code = 0;
  std::vector<std::string> logs;

  NodeFaults::Hooks hooks() {
    return {[this](const std::vector<std::string>& argv) {
              runs.push_back(argv);
              return std::pair<int, std::string>(exit_code,
                                                 exit_code ? "Operation not permitted" : "");
            },
            [this](const std::string& line) { logs.push_back(line); }};
  }
  bool ran(const std::string& word) const {
    for (const auto& argv : runs) {
      for (const auto& a : argv) {
        if (a.find(word) != std::string::npos) return true;
      }
    }
    return false;
  }
};

bool logged(const std::vector<std::string>& logs, const std::string& text) {
  for (const auto& line : logs) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("node faults: a link cut and restored once, a restore before its cut waits for it") {
  FakeNft nft;
  NodeFaults faults(nft.hooks());
  faults.cut_link(3, 1, "10.0.0.7", false);
  REQUIRE(nft.runs.size() == 1);
  CHECK(nft.ran("10.0.0.7"));
  CHECK(faults.link_cut(3));
  CHECK(logged(nft.logs, "fault 3: the link to node 1 (10.0.0.7) is cut (nft table inet "));
  faults.restore_link(3);
  CHECK(nft.runs.size() == 2);
  CHECK_FALSE(faults.link_cut(3));
  CHECK(logged(nft.logs, "fault 3: the link is back"));
  faults.restore_link(3);  // undone already: nothing runs now...
  CHECK(nft.runs.size() == 2);

  // ...but it is remembered as a restore ahead of its cut: fault 4's ends before it is made.
  faults.restore_link(4);
  CHECK(nft.runs.size() == 2);
  faults.cut_link(4, 2, "fd00::2", true);
  CHECK(nft.runs.size() == 4);  // cut, then restored at once
  CHECK_FALSE(faults.link_cut(4));
}

TEST_CASE("node faults: nft failing is said, with the table to remove by hand") {
  FakeNft nft;
  NodeFaults faults(nft.hooks());
  nft.exit_code = 1;
  faults.cut_link(5, 1, "10.0.0.8", false);
  CHECK_FALSE(faults.link_cut(5));
  CHECK(logged(nft.logs, "error: fault 5: nft could not cut the link: Operation not permitted"));
  nft.exit_code = 0;
  faults.cut_link(6, 1, "10.0.0.8", false);
  nft.exit_code = 1;
  faults.restore_link(6);
  CHECK(logged(nft.logs, "(remove it by hand: nft delete table inet "));
  CHECK_FALSE(faults.link_cut(6));
}

TEST_CASE("node faults: a disk that cannot be filled is said, a free of nothing does nothing") {
  FakeNft nft;
  NodeFaults faults(nft.hooks());
  faults.fill_disk(7, "/nonexistent/ctrun-node-faults-test");
  CHECK(logged(nft.logs, "error: fault 7: cannot fill the disk: "));
  const auto before = nft.logs.size();
  faults.free_disk(7);
  CHECK(nft.logs.size() == before);
}
