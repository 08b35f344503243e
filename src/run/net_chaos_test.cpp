#include "run/net_chaos.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "deloco/error.h"

namespace deloco::run {
namespace net_chaos_cases {

// The error message of parsing `text` ("" when it parses).
std::string parse_error(const std::string& text) {
  try {
    parse_net_faults(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string place_error(const std::string& text, int64_t hosts, int64_t learners, int64_t ranks = 1) {
  try {
    auto f = parse_net_faults(text);
    place_net_faults(f, hosts, learners, ranks);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Every action of a schedule as "at op host [rate] phase".
std::vector<std::string> show(const std::vector<NetAction>& actions) {
  std::vector<std::string> out;
  for (const NetAction& a : actions) {
    std::ostringstream o;
    o << a.at << " " << (a.op == NetAction::kLinkDown ? "down" : a.op == NetAction::kLinkUp ? "up" : "shape " + a.rate)
      << " h" << a.host << " " << a.phase;
    out.push_back(o.str());
  }
  return out;
}

NetChaosSchedule schedule(const std::string& text, int64_t hosts = 3, int64_t learners = 2,
                          std::vector<std::string> rates = {"20mbit", "20mbit", "20mbit"}) {
  auto f = parse_net_faults(text);
  place_net_faults(f, hosts, learners);
  return NetChaosSchedule(f, rates);
}

TEST(NetChaos, ParsesEachKind) {
  const auto f = parse_net_faults(
      "partition host=1 at=20 for=30; flap learner=1 at=10s for=20 period=3\n"
      "slow host=2 at=15 for=60 factor=50;  slow host=1 at=100 for=5 rate=1mbit;");
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].kind, NetFaultKind::kPartition);
  EXPECT_EQ(f[0].host, 1);
  EXPECT_EQ(f[0].at, 20);
  EXPECT_EQ(f[0].duration, 30);
  EXPECT_EQ(f[1].kind, NetFaultKind::kFlap);
  EXPECT_EQ(f[1].host, -1);
  EXPECT_EQ(f[1].learner, 1);
  EXPECT_EQ(f[1].at, 10);
  EXPECT_EQ(f[1].period, 3);
  EXPECT_EQ(f[2].kind, NetFaultKind::kSlow);
  EXPECT_EQ(f[2].factor, 50);
  EXPECT_EQ(f[3].rate, "1mbit");
  EXPECT_EQ(f[3].factor, 0);
  EXPECT_EQ(f[3].text, "slow host=1 at=100 for=5 rate=1mbit");
  EXPECT_EQ(parse_net_faults("slow host=1 at=0 for=1")[0].factor, 100);  // the default drop
  EXPECT_TRUE(parse_net_faults("").empty());
  EXPECT_TRUE(parse_net_faults(" ; \n ;").empty());
}

TEST(NetChaos, BadFaultsSayWhichAndWhy) {
  const auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                               : ::testing::AssertionFailure() << "'" << msg << "' lacks '" << part << "'";
  };
  EXPECT_TRUE(has(parse_error("partition host=1 at=1 for=1; cut host=1 at=2 for=3"), "fault 2 ('cut host=1 at=2 for=3'): unknown kind 'cut'"));
  EXPECT_TRUE(has(parse_error("partition host=1 at=1 for=1 speed=3"), "unknown key 'speed'"));
  EXPECT_TRUE(has(parse_error("partition host=1 at=1 for=1 period=3"), "unknown key 'period'"));
  EXPECT_TRUE(has(parse_error("partition host=1 at=1"), "needs for=SECONDS"));
  EXPECT_TRUE(has(parse_error("partition host=1 for=1"), "needs at=SECONDS"));
  EXPECT_TRUE(has(parse_error("partition at=1 for=1"), "host=H"));
  EXPECT_TRUE(has(parse_error("partition host=1 learner=0 at=1 for=1"), "one of them"));
  EXPECT_TRUE(has(parse_error("partition host=-1 at=1 for=1"), "host= must be a host number"));
  EXPECT_TRUE(has(parse_error("partition host=1 host=2 at=1 for=1"), "host= given twice"));
  EXPECT_TRUE(has(parse_error("partition host=1 at=soon for=1"), "at= must be a number of seconds"));
  EXPECT_TRUE(has(parse_error("partition host=1 at=nan for=1"), "at= must be a number of seconds"));
  EXPECT_TRUE(has(parse_error("partition host=1 at=-1 for=1"), "at= must be in [0, 1e6]"));
  EXPECT_TRUE(has(parse_error("partition host=1 at=1 for=0"), "for= must be in (0, 1e6]"));
  EXPECT_TRUE(has(parse_error("partition host=1 at=1 for"), "'for' is not key=value"));
  EXPECT_TRUE(has(parse_error("flap host=1 at=1 for=10"), "needs period=SECONDS"));
  EXPECT_TRUE(has(parse_error("flap host=1 at=1 for=10 period=20"), "at most for= (10 s)"));
  EXPECT_TRUE(has(parse_error("flap host=1 at=1 for=10 period=0.1"), "at least 0.5 s"));
  EXPECT_TRUE(has(parse_error("slow host=1 at=1 for=10 factor=2 rate=1mbit"), "not both"));
  EXPECT_TRUE(has(parse_error("slow host=1 at=1 for=10 factor=1"), "factor= must be in (1, 1e6]"));
  EXPECT_TRUE(has(parse_error("slow host=1 at=1 for=10 factor=x"), "factor= must be a number"));
  EXPECT_TRUE(has(parse_error("slow host=1 at=1 for=10 rate=fast"), "rate= must be a tc rate"));
  EXPECT_TRUE(has(parse_error("slow host=1 at=1 for=10 rate=none"), "rate= must be a tc rate"));
}

TEST(NetChaos, PlacesLearnersOnTheirHostsAndChecksTheTestbed) {
  auto f = parse_net_faults("partition learner=0 at=1 for=1; partition learner=3 at=2 for=1; slow host=0 at=0 for=1");
  place_net_faults(f, 4, 4);  // learner n on host 1 + n mod 3
  EXPECT_EQ(f[0].host, 1);
  EXPECT_EQ(f[1].host, 1);
  EXPECT_EQ(f[2].host, 0);
  EXPECT_NE(place_error("partition host=3 at=1 for=1", 3, 2).find("no host 3 (hosts 0 .. 2)"), std::string::npos);
  EXPECT_NE(place_error("partition learner=2 at=1 for=1", 3, 2).find("learner 2 does not exist (2 learners)"),
            std::string::npos);
  EXPECT_NE(place_error("partition host=3 at=1 for=1", 3, 2).find("chaos.net"), std::string::npos);
}

TEST(NetChaos, PlacesEachRankOfALearnerOnAHostOfItsOwn) {
  // One rank per learner: learner n on host 1 + n mod (hosts - 1), as always.
  EXPECT_EQ(testbed_host_of(0, 0, 1, 3), 1);
  EXPECT_EQ(testbed_host_of(1, 0, 1, 3), 2);
  EXPECT_EQ(testbed_host_of(2, 0, 1, 3), 1);
  // Two learners of two ranks on 1 + 4 hosts: slot n * 2 + r, every rank a host of its own.
  EXPECT_EQ(testbed_host_of(0, 0, 2, 5), 1);
  EXPECT_EQ(testbed_host_of(0, 1, 2, 5), 2);
  EXPECT_EQ(testbed_host_of(1, 0, 2, 5), 3);
  EXPECT_EQ(testbed_host_of(1, 1, 2, 5), 4);
  // Fewer hosts: they wrap round (learner 1's ranks share hosts 1 and 2 with learner 0's).
  EXPECT_EQ(testbed_host_of(1, 0, 2, 3), 1);
  EXPECT_EQ(testbed_host_of(1, 1, 2, 3), 2);
  EXPECT_EQ(testbed_host_of(0, 2, 3, 3), 1);  // 3 ranks on 2 learner hosts: rank 2 with rank 0
  EXPECT_EQ(testbed_hosts_of(1, 2, 5), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(testbed_hosts_of(0, 3, 3), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(testbed_hosts_of(0, 4, 2), (std::vector<int64_t>{1}));  // one learner host: everything on it
  EXPECT_EQ(testbed_hosts_of(2, 1, 3), (std::vector<int64_t>{1}));
}

TEST(NetChaos, ALearnerFaultHitsEveryHostOfItsRanks) {
  auto f = parse_net_faults("slow host=0 at=0 for=1; partition learner=1 at=5 for=10; flap learner=0 at=30 for=4 period=2");
  place_net_faults(f, 5, 2, 2);  // learner 0 on hosts 1, 2; learner 1 on 3, 4
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[0].host, 0);
  EXPECT_EQ(f[1].host, 3);
  EXPECT_EQ(f[2].host, 4);
  EXPECT_EQ(f[3].host, 1);
  EXPECT_EQ(f[4].host, 2);
  EXPECT_EQ(f[2].number, 1u);  // a copy of the second fault written
  EXPECT_EQ(f[2].text, "partition learner=1 at=5 for=10");
  EXPECT_EQ(f[4].kind, NetFaultKind::kFlap);
  // Both links go down and up together.
  NetChaosSchedule s(f, {"20mbit", "20mbit", "20mbit", "20mbit", "20mbit"});
  const auto due = show(s.due(5));
  EXPECT_NE(std::find(due.begin(), due.end(), "5 down h3 start"), due.end());
  EXPECT_NE(std::find(due.begin(), due.end(), "5 down h4 start"), due.end());
  // A learner fault overlapping a host fault on one of its hosts is refused, named as written.
  EXPECT_NE(place_error("partition learner=0 at=10 for=10; partition host=2 at=15 for=1", 3, 1, 2)
                .find("fault 1 ('partition learner=0 at=10 for=10') and fault 2"),
            std::string::npos);
  EXPECT_NE(place_error("partition learner=1 at=1 for=1", 5, 1, 2).find("learner 1 does not exist"), std::string::npos);
}

TEST(NetChaos, OneLinkFaultAndOneSlowFaultPerHostAtATime) {
  // learner 2 is on host 1 like learner 0 (3 hosts): the two partitions overlap there.
  EXPECT_NE(place_error("partition learner=0 at=10 for=10; flap learner=2 at=19 for=5 period=1", 3, 3)
                .find("both take host 1's link at once"),
            std::string::npos);
  EXPECT_NE(place_error("slow host=2 at=0 for=10; slow host=2 at=5 for=1 rate=1mbit", 3, 2).find("both shape host 2"),
            std::string::npos);
  EXPECT_EQ(place_error("partition host=1 at=10 for=10; partition host=1 at=20 for=5", 3, 2), "");  // one after the other
  EXPECT_EQ(place_error("partition host=1 at=10 for=10; slow host=1 at=12 for=30", 3, 2), "");     // link and rate
  EXPECT_EQ(place_error("partition host=1 at=10 for=10; partition host=2 at=10 for=10", 3, 2), "");
}

TEST(NetChaos, Rates) {
  EXPECT_EQ(rate_bits("20mbit"), 20e6);
  EXPECT_EQ(rate_bits("2.5kbit"), 2500);
  EXPECT_EQ(rate_bits("1kbps"), 8000);  // tc: bytes per second
  EXPECT_EQ(rate_bits("100bit"), 100);
  EXPECT_EQ(rate_bits("1gbit"), 1e9);
  for (const char* bad : {"none", "", "mbit", "20", "20mb", "1.2.3mbit", ".5mbit", "5.mbit", "-1mbit", "20 mbit"})
    EXPECT_EQ(rate_bits(bad), -1) << bad;
  EXPECT_EQ(format_rate(200000), "200kbit");
  EXPECT_EQ(format_rate(20e6), "20mbit");
  EXPECT_EQ(format_rate(2e9), "2gbit");
  EXPECT_EQ(format_rate(12345.4), "12345bit");
  EXPECT_EQ(format_rate(0.01), "8bit");
}

TEST(NetChaos, PartitionIsDownThenUp) {
  NetChaosSchedule s = schedule("partition host=1 at=20 for=30");
  EXPECT_TRUE(s.due(19.9).empty());
  EXPECT_EQ(show(s.due(20)), (std::vector<std::string>{"20 down h1 start"}));
  EXPECT_TRUE(s.started(0));
  EXPECT_FALSE(s.ended(0));
  EXPECT_TRUE(s.due(49.9).empty());
  EXPECT_EQ(show(s.due(60)), (std::vector<std::string>{"50 up h1 end"}));
  EXPECT_TRUE(s.ended(0));
  EXPECT_TRUE(s.due(1e9).empty());
  EXPECT_TRUE(s.heal().empty());  // nothing left broken
}

TEST(NetChaos, FlapGoesDownAndUpEveryPeriodAndEndsUp) {
  NetChaosSchedule s = schedule("flap host=2 at=10 for=9 period=4");
  EXPECT_EQ(show(s.due(100)), (std::vector<std::string>{"10 down h2 start", "12 up h2 up", "14 down h2 down",
                                                        "16 up h2 up", "18 down h2 down", "19 up h2 end"}));
  // A period that divides for=: the last down's up is the end.
  EXPECT_EQ(show(schedule("flap host=2 at=0 for=4 period=2").plan()),
            (std::vector<std::string>{"0 down h2 start", "1 up h2 up", "2 down h2 down", "3 up h2 up", "4 up h2 end"}));
}

TEST(NetChaos, SlowDividesTheHostsOwnRateAndRestoresIt) {
  NetChaosSchedule s = schedule("slow learner=1 at=15 for=60; slow host=1 at=0 for=5 rate=3mbit", 3, 2,
                                {"20mbit", "10mbit", "20mbit"});
  EXPECT_EQ(show(s.due(100)), (std::vector<std::string>{"0 shape 3mbit h1 start", "5 shape 10mbit h1 end",
                                                        "15 shape 200kbit h2 start", "75 shape 20mbit h2 end"}));
  NetChaosSchedule f = schedule("slow host=1 at=0 for=5 factor=3", 3, 2, {"20mbit", "1mbit", "20mbit"});
  EXPECT_EQ(f.plan()[0].rate, "333333bit");
  // An unshaped host has no rate to divide; a given rate is fine, and "none" comes back at the end.
  auto faults = parse_net_faults("slow host=1 at=0 for=5");
  place_net_faults(faults, 3, 2);
  EXPECT_THROW(NetChaosSchedule(faults, {"none", "none", "none"}), ConfigError);
  EXPECT_EQ(show(schedule("slow host=1 at=0 for=5 rate=1mbit", 3, 2, {"none", "none", "none"}).plan()),
            (std::vector<std::string>{"0 shape 1mbit h1 start", "5 shape none h1 end"}));
}

TEST(NetChaos, AtOneInstantHealingComesFirst) {
  // Written in the other order: the second partition starts when the first ends; the link must end up down.
  NetChaosSchedule s = schedule("partition host=1 at=30 for=10; partition host=1 at=20 for=10");
  EXPECT_EQ(show(s.due(100)),
            (std::vector<std::string>{"20 down h1 start", "30 up h1 end", "30 down h1 start", "40 up h1 end"}));
  EXPECT_TRUE(s.plan()[1].heals);
  EXPECT_FALSE(s.plan()[2].heals);
}

TEST(NetChaos, HealUndoesOnlyWhatIsBroken) {
  NetChaosSchedule s = schedule(
      "partition host=1 at=10 for=30; slow host=2 at=5 for=100; flap host=2 at=0 for=4 period=2; "
      "partition host=2 at=50 for=5",
      3, 2);
  EXPECT_EQ(show(s.due(12)), (std::vector<std::string>{"0 down h2 start", "1 up h2 up", "2 down h2 down", "3 up h2 up",
                                                       "4 up h2 end", "5 shape 200kbit h2 start", "10 down h1 start"}));
  // The run ends at 12 s: the partition and the slow link are healed; the flap is over, the last partition never began.
  EXPECT_EQ(show(s.heal()), (std::vector<std::string>{"40 up h1 end", "105 shape 20mbit h2 end"}));
  EXPECT_TRUE(s.ended(0) && s.ended(1) && s.ended(2));
  EXPECT_FALSE(s.started(3));
  EXPECT_TRUE(s.due(1e9).empty());
  EXPECT_TRUE(s.heal().empty());
  EXPECT_TRUE(NetChaosSchedule().due(1e9).empty());
  EXPECT_TRUE(NetChaosSchedule().heal().empty());
}

}  // namespace
}  // namespace deloco::run
