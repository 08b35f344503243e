#include "util/config_toml.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deloco/config.h"

namespace deloco {
namespace config_toml_cases {

struct Fields {
  int64_t count = 0;
  double lr = 0, tiny = 0, whole = 0, third = 0;
  bool on = false;
  std::string name, path;
  std::vector<int64_t> sizes;
  std::vector<double> weights;
  int64_t deep = 0;
};

void bind_all(ConfigSchema& s, Fields& f) {
  s.bind("train.count", &f.count, "");
  s.bind("train.lr", &f.lr, "");
  s.bind("train.tiny", &f.tiny, "");
  s.bind("train.whole", &f.whole, "");
  s.bind("model.third", &f.third, "");
  s.bind("model.on", &f.on, "");
  s.bind("model.name", &f.name, "");
  s.bind("data.path", &f.path, "");
  s.bind("data.sizes", &f.sizes, "");
  s.bind("data.weights", &f.weights, "");
  s.bind("net.tls.depth", &f.deep, "");
}

TEST(ConfigToml, EveryKindOfFieldReadsBackExactly) {
  Fields a;
  a.count = -42;
  a.lr = 12.345678901234567;
  a.tiny = 1e-300;
  a.whole = 3.0;  // a float with an integral value must stay a float in TOML
  a.third = 1.0 / 3.0;
  a.on = true;
  a.name = "quote \" backslash \\ newline \n tab \t and é";
  a.path = "runs/a b";
  a.sizes = {1, 2, 3};
  a.weights = {0.1, -2.5, 7.0};
  a.deep = 9;
  ConfigSchema sa;
  bind_all(sa, a);
  const std::string text = toml_of(sa.to_json());
  EXPECT_NE(text.find("[train]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("[net.tls]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("whole = 3.0\n"), std::string::npos) << text;

  Fields b;
  ConfigSchema sb;
  bind_all(sb, b);
  sb.load_string(text, "written.toml");
  EXPECT_EQ(b.count, a.count);
  EXPECT_EQ(b.lr, a.lr);  // bit-exact, not near
  EXPECT_EQ(b.tiny, a.tiny);
  EXPECT_EQ(b.whole, a.whole);
  EXPECT_EQ(b.third, a.third);
  EXPECT_EQ(b.on, a.on);
  EXPECT_EQ(b.name, a.name);
  EXPECT_EQ(b.path, a.path);
  EXPECT_EQ(b.sizes, a.sizes);
  EXPECT_EQ(b.weights, a.weights);
  EXPECT_EQ(b.deep, a.deep);
}

TEST(ConfigToml, TopLevelScalarsComeBeforeTablesAndOddKeysAreQuoted) {
  const nlohmann::json j = {{"b", {{"x", 1}}}, {"a", 2}, {"odd key", {{"k.y", false}}}};
  const std::string text = toml_of(j);
  EXPECT_EQ(text, "a = 2\n\n[b]\nx = 1\n\n[\"odd key\"]\n\"k.y\" = false\n");
}

TEST(ConfigToml, WhatTomlCannotHoldIsRefusedByName) {
  auto error_of = [](const nlohmann::json& j) -> std::string {
    try {
      toml_of(j);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of({{"s", {{"k", nullptr}}}}).find("'s.k' is null"), std::string::npos);
  EXPECT_NE(error_of({{"s", {{"k", std::numeric_limits<double>::quiet_NaN()}}}}).find("'s.k' is not finite"),
            std::string::npos);
  EXPECT_NE(error_of({{"s", {{"k", nlohmann::json::array({nlohmann::json::array({1, 2})})}}}}).find("'s.k' holds an array"), std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array({1})).find("not an object"), std::string::npos);
}

}  // namespace
}  // namespace deloco
