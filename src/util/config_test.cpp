// The config binder: types, unknown keys, and non-finite numbers refused for every number key in one place.
#include <cstdlib>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deloco/config.h"

namespace deloco {
namespace config_cases {

struct Fields {
  double lr = 0.1, dead_after = 3.0;
  int64_t steps = 10;
  std::vector<double> times{1.0};
  ConfigSchema schema;
  Fields() {
    schema.bind("train.lr", &lr, "learning rate");
    schema.bind("net.dead_after", &dead_after, "seconds");
    schema.bind("train.steps", &steps, "steps");
    schema.bind("chaos.times", &times, "seconds");
  }
};

void expect_refused(const std::function<void()>& f, const std::string& key, const std::string& value) {
  try {
    f();
    ADD_FAILURE() << key << " = " << value << " was accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'" + key + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("finite"), std::string::npos) << what;
    EXPECT_NE(what.find(value), std::string::npos) << what;
  }
}

TEST(Config, NonFiniteNumbersAreRefusedNamingTheKey) {
  Fields f;
  for (const char* v : {"inf", "-inf", "nan", "+inf", "infinity"})
    expect_refused([&] { f.schema.apply_override(std::string("train.lr=") + v); }, "train.lr",
                   std::string(v) == "nan" ? "nan" : (v[0] == '-' ? "-inf" : "inf"));
  expect_refused([&] { f.schema.apply_override("net.dead_after=inf"); }, "net.dead_after", "inf");
  expect_refused([&] { f.schema.apply_override("chaos.times=1,nan,3"); }, "chaos.times", "nan");
  expect_refused([&] { f.schema.load_string("[net]\ndead_after = inf\n", "x.toml"); }, "net.dead_after", "inf");
  expect_refused([&] { f.schema.load_string("[train]\nlr = nan\n", "x.toml"); }, "train.lr", "nan");
  expect_refused([&] { f.schema.load_string("[chaos]\ntimes = [1.0, -inf]\n", "x.toml"); }, "chaos.times", "-inf");
  // Nothing was written by the refused values.
  EXPECT_EQ(f.lr, 0.1);
  EXPECT_EQ(f.dead_after, 3.0);
  EXPECT_EQ(f.times, std::vector<double>{1.0});
  // Finite values still go through, integers included.
  f.schema.apply_override("train.lr=1e-3");
  f.schema.load_string("[net]\ndead_after = 5\n[chaos]\ntimes = [0.5, 2]\n", "x.toml");
  EXPECT_EQ(f.lr, 1e-3);
  EXPECT_EQ(f.dead_after, 5.0);
  EXPECT_EQ(f.times, (std::vector<double>{0.5, 2.0}));
}

// Found by review: an integer was read with the base guessed from its prefix, so --set train.steps=010000 trained
// 4096 steps. Integers now read as TOML reads them: decimal without leading zeros, or 0x hex.
TEST(Config, IntegersAreDecimalNotOctal) {
  Fields f;
  EXPECT_THROW(f.schema.apply_override("train.steps=010"), ConfigError);
  EXPECT_THROW(f.schema.apply_override("train.steps=-010"), ConfigError);
  EXPECT_EQ(f.steps, 10);
  f.schema.apply_override("train.steps=0");
  EXPECT_EQ(f.steps, 0);
  f.schema.apply_override("train.steps=1000");
  EXPECT_EQ(f.steps, 1000);
  f.schema.apply_override("train.steps=0x10");
  EXPECT_EQ(f.steps, 16);
  f.schema.apply_override("train.steps=-7");
  EXPECT_EQ(f.steps, -7);
}

TEST(Config, UnknownKeysAndWrongTypesNameTheKey) {
  Fields f;
  try {
    f.schema.apply_override("train.steps=1.5");
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.steps"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.schema.apply_override("train.nope=1"), ConfigError);
  EXPECT_THROW(f.schema.load_string("[train]\nlr = \"fast\"\n", "x.toml"), ConfigError);
}

// The one load order: file, environment (the command's variables, then DELOCO_SET), key flags, --set, flags; later
// wins, each stage sees what the earlier ones wrote, validation runs once at the end.
TEST(ConfigLoad, StagesApplyInOrderAndLaterWins) {
  struct Env {
    Env(const char* v) { ::setenv("DELOCO_SET", v, 1); }
    ~Env() { ::unsetenv("DELOCO_SET"); }
  };
  std::vector<std::string> order;
  std::string a = "default", b = "default", c = "default", d = "default", e = "default", f = "default";
  ConfigSchema s;
  const std::vector<std::pair<std::string, std::string*>> fields = {{"x.a", &a}, {"x.b", &b}, {"x.c", &c},
                                                                     {"x.d", &d}, {"x.e", &e}, {"x.f", &f}};
  for (const auto& [key, field] : fields)
    s.bind(key, field, "", [&order, key = key] {
      if (key == "x.a") order.push_back("validate");
      return std::string();
    });
  ConfigSources src;
  src.base = [&] {
    order.push_back("base");
    s.load_string("[x]\na = \"file\"\nb = \"file\"\nc = \"file\"\nd = \"file\"\ne = \"file\"\n", "t.toml");
  };
  src.environment = [&] {
    order.push_back("environment");
    EXPECT_EQ(b, "file");
    b = c = d = e = "env";
  };
  src.key_flags = {{"--c-flag 'keyflag'", "x.c=keyflag"}, {"--d-flag 'keyflag'", "x.d=keyflag"}};
  src.sets = {"x.d=set", "x.e=set"};
  src.flags = [&] {
    order.push_back("flags");
    EXPECT_EQ(d, "set");
    e = "flag";
  };
  {
    Env env("x.c=deloco_set\n\nx.b=deloco_set");
    load_config(s, src);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"base", "environment", "flags", "validate"}));
  EXPECT_EQ(a, "file");
  EXPECT_EQ(b, "deloco_set");  // DELOCO_SET after the command's own variables
  EXPECT_EQ(c, "keyflag");     // key flags after DELOCO_SET
  EXPECT_EQ(d, "set");         // --set after the key flags
  EXPECT_EQ(e, "flag");        // the command's flags last
  EXPECT_EQ(f, "default");
}

TEST(ConfigLoad, EachOverrideIsNamedByWhereItCameFrom) {
  std::string a;
  int64_t n = 0;
  ConfigSchema s;
  s.bind("x.a", &a, "");
  s.bind("x.n", &n, "");
  auto error = [&](ConfigSources src, const char* deloco_set) {
    if (deloco_set) ::setenv("DELOCO_SET", deloco_set, 1);
    std::string what;
    try {
      load_config(s, src);
    } catch (const ConfigError& e) {
      what = e.what();
    }
    ::unsetenv("DELOCO_SET");
    return what;
  };
  EXPECT_EQ(error({}, "x.nope=1"), "DELOCO_SET: unknown key 'x.nope'");
  ConfigSources sets;
  sets.sets = {"x.nope=1"};
  EXPECT_EQ(error(sets, nullptr), "--set: unknown key 'x.nope'");
  ConfigSources flags;
  flags.key_flags = {{"--n 'two'", "x.n=two"}};
  EXPECT_EQ(error(flags, nullptr), "--n 'two': key 'x.n' must be an integer, got 'two'");
  EXPECT_EQ(error({}, ""), "");  // an empty DELOCO_SET sets nothing
  EXPECT_TRUE(environment_sets().empty());
}

TEST(ConfigLoad, DescribeListsEveryKeyWithTypeDefaultAndHelp) {
  Fields f;
  const nlohmann::json d = f.schema.describe();
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(d[0]["key"], "train.lr");
  EXPECT_EQ(d[0]["type"], "number");
  EXPECT_EQ(d[0]["value"], 0.1);
  EXPECT_EQ(d[0]["help"], "learning rate");
  EXPECT_EQ(d[2]["type"], "integer");
  EXPECT_EQ(d[3]["type"], "number list");
}

}  // namespace
// What a file or an override named, as opposed to a bound default (deloco run's defaults on a testbed use it).
TEST(ConfigSchema, AssignedTellsAValueGivenFromADefault) {
  ConfigSchema s;
  std::string a = "x", b = "y", c = "z";
  s.bind("net.a", &a, "a");
  s.bind("net.b", &b, "b");
  s.bind("net.c", &c, "c");
  s.load_string("[net]\na = \"x\"\n", "test.toml");  // the default's own value, but named
  s.apply_override("net.b=w");
  EXPECT_TRUE(s.assigned("net.a"));
  EXPECT_TRUE(s.assigned("net.b"));
  EXPECT_FALSE(s.assigned("net.c"));
  EXPECT_FALSE(s.assigned("net.unknown"));
  EXPECT_THROW(s.apply_override("net.d=1"), ConfigError);
  EXPECT_FALSE(s.assigned("net.d"));
}

}  // namespace deloco
