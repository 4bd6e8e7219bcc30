#include "launcher/faults/link_cut.h"

#include "catch.h"

using namespace ctrun::launcher;

TEST_CASE("link cut: one nft transaction drops both directions, and one command removes it") {
  const std::string table = link_cut_table(4242, 3);
  CHECK(table == "ctrun_fault_4242_3");
  const auto cut = link_cut_command(table, "198.18.0.11", /*ipv6=*/false);
  REQUIRE(cut.size() == 2);
  CHECK(cut[0] == "nft");
  CHECK(cut[1] ==
        "add table inet ctrun_fault_4242_3; "
        "add chain inet ctrun_fault_4242_3 in { type filter hook input priority -200 ; }; "
        "add chain inet ctrun_fault_4242_3 out { type filter hook output priority -200 ; }; "
        "add rule inet ctrun_fault_4242_3 in ip saddr 198.18.0.11 drop; "
        "add rule inet ctrun_fault_4242_3 out ip daddr 198.18.0.11 drop");
  const auto cut6 = link_cut_command(table, "fd00::2", /*ipv6=*/true);
  CHECK(cut6[1].find("in ip6 saddr fd00::2 drop; ") != std::string::npos);
  CHECK(cut6[1].find("out ip6 daddr fd00::2 drop") != std::string::npos);
  CHECK(link_restore_command(table) ==
        std::vector<std::string>{"nft", "delete table inet ctrun_fault_4242_3"});
}
