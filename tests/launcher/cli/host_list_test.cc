#include "launcher/cli/host_list.h"

#include "catch.h"

using namespace ctrun::launcher;

namespace {
std::vector<int> slots(const Host& h) { return h.slots; }
}  // namespace

TEST_CASE("host_list: DeepSpeed's, Open MPI's and MPICH's hostfile lines, with comments") {
  auto hosts = parse_hostfile(
      "# the cluster\n"
      "worker-0 slots=4\n"
      "\n"
      "worker-1 slots=2 max_slots=8   # Open MPI's\n"
      "worker-2:3\n"
      "  10.0.0.7\r\n",
      "hosts.txt");
  REQUIRE(hosts);
  REQUIRE(hosts.value().size() == 4);
  CHECK(hosts.value()[0].name == "worker-0");
  CHECK(slots(hosts.value()[0]) == std::vector<int>{0, 1, 2, 3});
  CHECK(hosts.value()[1].listed_slots == 2);
  CHECK(hosts.value()[2].listed_slots == 3);
  CHECK(hosts.value()[3].name == "10.0.0.7");
  CHECK(hosts.value()[3].slots.empty());  // runs --nproc_per_node workers
  CHECK_FALSE(hosts.value()[0].narrowed());
}

TEST_CASE("host_list: a bad hostfile line is an error naming the file and line") {
  auto error = [](const std::string& text) {
    auto hosts = parse_hostfile(text, "h");
    REQUIRE_FALSE(hosts);
    return hosts.error().message;
  };
  CHECK(error("a slots=4\nb slots=x\n") == "h:2: 'slots=x': expected a slot count in 1..4096");
  CHECK(error("a gpus=4\n") == "h:1: expected 'HOST slots=N', got 'a gpus=4'");
  CHECK(error("a\na slots=2\n") == "h:2: host 'a' is listed twice");
  CHECK(error("-oProxyCommand=x\n").find("is not a host name") != std::string::npos);
  CHECK(error("a slots=1 slots=2\n") == "h:1: two slot counts in 'a slots=1 slots=2'");
  CHECK(error("# nothing\n") == "h: lists no host");
}

TEST_CASE("host_list: --hosts NAME[:SLOTS],...") {
  auto hosts = parse_hosts_option("h1:4,h2:4, h3");
  REQUIRE(hosts);
  REQUIRE(hosts.value().size() == 3);
  CHECK(hosts.value()[1].listed_slots == 4);
  CHECK(hosts.value()[2].name == "h3");
  CHECK_FALSE(parse_hosts_option("h1,,h2"));
  CHECK_FALSE(parse_hosts_option("h1:0"));
  CHECK(parse_hosts_option("h1:x").error().message ==
        "--hosts: 'h1:x': expected NAME:SLOTS with SLOTS in 1..4096");
}

TEST_CASE("host_list: --include and --exclude pick hosts and slots as DeepSpeed does") {
  auto all = parse_hostfile("a slots=4\nb slots=4\nc slots=2\nd\n", "h").value();
  auto pick = [&](const std::string& include, const std::string& exclude) {
    auto picked = select_hosts(all, include, exclude);
    REQUIRE(picked);
    return picked.value();
  };
  auto only_b = pick("b:1,3", "");
  REQUIRE(only_b.size() == 1);
  CHECK(only_b[0].slots == std::vector<int>{1, 3});
  CHECK(only_b[0].narrowed());
  auto a_and_d = pick("a@d", "");
  REQUIRE(a_and_d.size() == 2);
  CHECK(a_and_d[0].slots == std::vector<int>{0, 1, 2, 3});
  CHECK_FALSE(a_and_d[0].narrowed());

  auto rest = pick("", "a@c:0");
  REQUIRE(rest.size() == 3);  // b, c (slot 1), d
  CHECK(rest[0].name == "b");
  CHECK(rest[1].slots == std::vector<int>{1});
  CHECK(rest[2].name == "d");
  CHECK(pick("", "c:0,1").size() == 3);  // every slot of c out: c is out

  auto error = [&](const std::string& include, const std::string& exclude) {
    auto picked = select_hosts(all, include, exclude);
    REQUIRE_FALSE(picked);
    return picked.error().message;
  };
  CHECK(error("a", "b") == "--include and --exclude cannot be used together");
  CHECK(error("x", "") == "--include: host 'x' is not in the host list");
  CHECK(error("c:2", "") == "--include: host 'c' has slots 0..1, not 2");
  CHECK(error("d:0", "") ==
        "--include: host 'd' has no slot count in the host list, so no slots to pick");
  CHECK(error("", "a@b@c@d") == "--exclude 'a@b@c@d' leaves no host");
  CHECK(error("a@a", "") == "--include: host 'a' is named twice");
  CHECK(error("a:x", "") == "--include: 'x' in 'a:x' is not a slot number");
}
