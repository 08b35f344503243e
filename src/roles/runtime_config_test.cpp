// The runtime's config keys: non-finite numbers refused by the binder naming the key (issue 11 item 13a), and
// durations bounded above, since a finite but enormous timeout disables failure detection just as inf did.
#include <gtest/gtest.h>

#include "deloco/config.h"
#include "deloco/runtime.h"

namespace deloco {
namespace runtime_config_cases {

std::string error_of(const std::vector<std::string>& sets) {
  RuntimeConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  try {
    for (const auto& s : sets) schema.apply_override(s);
    schema.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(RuntimeConfig, NonFiniteAndHugeDurationsAreRefusedNamingTheKey) {
  for (const char* set : {"train.lr=inf", "net.dead_after=inf", "learner.slowdown=inf", "net.heartbeat=nan",
                          "net.join_timeout=-inf", "syncer.eval_interval=inf", "chaos.syncer_kill_at=5,inf"}) {
    const std::string key = std::string(set).substr(0, std::string(set).find('='));
    const std::string e = error_of({set});
    EXPECT_NE(e.find("'" + key + "'"), std::string::npos) << set << ": " << e;
    EXPECT_NE(e.find("finite"), std::string::npos) << set << ": " << e;
  }
  for (const char* set : {"net.dead_after=1e300", "net.join_timeout=1e12", "net.heartbeat=1000",
                          "learner.slowdown=1e9", "chaos.kill_interval=1e300"}) {
    const std::string key = std::string(set).substr(0, std::string(set).find('='));
    const std::string e = error_of({set});
    EXPECT_NE(e.find(key), std::string::npos) << set << ": " << e;
  }
  // The defaults and ordinary values pass.
  EXPECT_EQ(error_of({}), "");
  EXPECT_EQ(error_of({"net.heartbeat=0.2", "net.dead_after=1.5", "net.join_timeout=20", "learner.slowdown=15"}), "");
}

// A sharded syncer's endpoints: listed, or derived from one (tcp port + s, ipc path "-s").
TEST(RuntimeConfig, ShardEndpointsAreListedOrDerived) {
  EXPECT_EQ(shard_endpoints("tcp://10.0.0.1:5555", 3),
            (std::vector<std::string>{"tcp://10.0.0.1:5555", "tcp://10.0.0.1:5556", "tcp://10.0.0.1:5557"}));
  EXPECT_EQ(shard_endpoints("ipc:///run/x/syncer.sock", 2),
            (std::vector<std::string>{"ipc:///run/x/syncer.sock", "ipc:///run/x/syncer-1.sock"}));
  EXPECT_EQ(shard_endpoints("tcp://a:1, tcp://b:2", 2), (std::vector<std::string>{"tcp://a:1", "tcp://b:2"}));
  EXPECT_EQ(shard_endpoints("tcp://a:1", 1), (std::vector<std::string>{"tcp://a:1"}));
  EXPECT_THROW(shard_endpoints("tcp://a:1,tcp://b:2", 3), ConfigError);
  EXPECT_THROW(shard_endpoints("tcp://a:65535", 2), ConfigError);
  EXPECT_THROW(shard_endpoints("tcp://a:x", 2), ConfigError);
  EXPECT_NE(error_of({"net.address=tcp://a:1,udp://b:2"}).find("udp://b:2"), std::string::npos);
  EXPECT_NE(error_of({"syncer.shards=0"}).find("syncer.shards"), std::string::npos);
}

TEST(RuntimeConfig, MoreShardsThanFragmentsIsRefused) {
  RuntimeConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  schema.apply_override("sync.learners=2");
  schema.apply_override("sync.quorum=1");
  schema.apply_override("sync.fragments=2");
  schema.apply_override("syncer.shards=3");
  schema.validate();
  try {
    cfg.validate();
    FAIL() << "3 shards of 2 fragments";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("syncer.shards=3"), std::string::npos) << e.what();
  }
}

TEST(RuntimeConfig, TheTcpCongestionControlIsANameAndReachesTheTransport) {
  EXPECT_EQ(error_of({"net.tcp_congestion=bbr"}), "");
  for (const char* bad : {"net.tcp_congestion=b b", "net.tcp_congestion=../bbr", "net.tcp_congestion=abcdefghijklmnop"}) {
    const std::string e = error_of({bad});
    EXPECT_NE(e.find("net.tcp_congestion"), std::string::npos) << bad << ": " << e;
  }
  RuntimeConfig cfg;
  ConfigSchema schema;
  cfg.bind(schema);
  schema.apply_override("net.tcp_congestion=reno");
  schema.apply_override("net.tcp_timeout=4");
  schema.validate();
  EXPECT_EQ(cfg.net.transport().tcp_congestion, "reno");
  EXPECT_EQ(cfg.net.transport().tcp_timeout.count(), 4000);
}

}  // namespace
}  // namespace deloco

namespace deloco {
namespace runtime_config_cases {

// testbed.name becomes namespace and interface names: only short lower-case names pass, and the error names the key.
TEST(RuntimeConfig, TestbedNamesAreShortLowerCaseWords) {
  EXPECT_EQ(error_of({"testbed.name=dlt"}), "");
  EXPECT_EQ(error_of({"testbed.name=wan10"}), "");
  for (const char* bad : {"testbed.name=Dlt", "testbed.name=1dlt", "testbed.name=dl-t", "testbed.name=abcdefghijk",
                          "testbed.name=a b", "testbed.name=../x"}) {
    const std::string e = error_of({bad});
    EXPECT_NE(e.find("testbed.name"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_NE(error_of({"testbed.port=0"}).find("testbed.port"), std::string::npos);
  EXPECT_NE(error_of({"testbed.port=70000"}).find("testbed.port"), std::string::npos);
}

}  // namespace
}  // namespace deloco
