// The config binder: types, unknown keys, and non-finite numbers refused for every number key in one place.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deloco/config.h"

namespace deloco {
namespace {

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

}  // namespace
}  // namespace deloco
