// libFuzzer target: the configuration loader (deloco/config.h): TOML text, `--set` overrides and validation,
// against a schema with a key of every field type (plus the goodput simulator's real schema).
//
// Input: TOML text; each line that starts with "--set " is applied as an override instead. Property: every problem
// is a deloco::ConfigError (anything else escaping is a crash), and a load that fails leaves the bound fields as
// they were (the contract's "written only when the whole file is valid").
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deloco/config.h"
#include "goodput/goodput.h"

namespace {
struct Fields {
  int64_t i = 3;
  double d = 0.5;
  bool b = false;
  std::string s = "x";
  std::vector<int64_t> li{1, 2};
  std::vector<double> ld{0.25};
  bool operator==(const Fields& o) const {
    return i == o.i && (d == o.d || (d != d && o.d != o.d)) && b == o.b && s == o.s && li == o.li && ld == o.ld;
  }
};
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_config: property violated: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string toml;
  std::vector<std::string> overrides;
  std::istringstream lines(input);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("--set ", 0) == 0) overrides.push_back(line.substr(6));
    else toml += line + "\n";
  }
  Fields f;
  deloco::GoodputParams gp;
  deloco::ConfigSchema schema;
  schema.bind("a.int", &f.i, "an integer", [&] { return f.i < 0 ? std::string("a.int must be >= 0") : std::string(); });
  schema.bind("a.real", &f.d, "a real");
  schema.bind("a.flag", &f.b, "a bool");
  schema.bind("a.text", &f.s, "a string");
  schema.bind("b.ints", &f.li, "a list of integers");
  schema.bind("b.reals", &f.ld, "a list of reals");
  deloco::bind_goodput_config(schema, gp);

  const Fields before = f;
  try {
    schema.load_string(toml, "fuzz.toml");
  } catch (const deloco::ConfigError&) {
    if (!(f == before)) fail("a failed load changed a bound field");
  }
  for (const auto& o : overrides) {
    try {
      schema.apply_override(o);
    } catch (const deloco::ConfigError&) {
    }
  }
  try {
    schema.validate();
  } catch (const deloco::ConfigError&) {
  }
  try {
    deloco::validate_goodput(gp);
  } catch (const deloco::ConfigError&) {
  }
  // The JSON round trip used by checkpoints accepts what to_json produced.
  try {
    const auto j = schema.to_json();
    schema.from_json(j, "fuzz.json");
  } catch (const deloco::ConfigError&) {
  }
  return 0;
}
