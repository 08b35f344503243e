#include "util/config_toml.h"

#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace deloco {
namespace {

std::string key_text(const std::string& k) {
  const bool bare = !k.empty() && k.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                      "0123456789_-") == std::string::npos;
  return bare ? k : nlohmann::json(k).dump();  // JSON's escapes are valid in a TOML basic string
}

std::string scalar_text(const nlohmann::json& v, const std::string& where) {
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return v.dump();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) throw std::invalid_argument("toml_of: '" + where + "' is not finite");
    std::ostringstream o;
    o << std::setprecision(std::numeric_limits<double>::max_digits10) << d;
    std::string s = o.str();
    if (s.find_first_of(".eE") == std::string::npos) s += ".0";
    return s;
  }
  if (v.is_string()) return v.dump();
  throw std::invalid_argument("toml_of: '" + where + "' is " + v.type_name() + ", which TOML cannot hold here");
}

std::string value_text(const nlohmann::json& v, const std::string& where) {
  if (!v.is_array()) return scalar_text(v, where);
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].is_array() || v[i].is_object())
      throw std::invalid_argument("toml_of: '" + where + "' holds an array or object, which a config cannot");
    s += (i ? ", " : "") + scalar_text(v[i], where);
  }
  return s + "]";
}

void write_table(std::ostringstream& o, const nlohmann::json& t, const std::string& path) {
  for (auto it = t.begin(); it != t.end(); ++it)
    if (!it->is_object())
      o << key_text(it.key()) << " = " << value_text(*it, path.empty() ? it.key() : path + "." + it.key()) << "\n";
  for (auto it = t.begin(); it != t.end(); ++it) {
    if (!it->is_object()) continue;
    const std::string sub = path.empty() ? key_text(it.key()) : path + "." + key_text(it.key());
    o << (o.tellp() > 0 ? "\n" : "") << "[" << sub << "]\n";
    write_table(o, *it, sub);
  }
}

}  // namespace

std::string toml_of(const nlohmann::json& config) {
  if (!config.is_object()) throw std::invalid_argument("toml_of: the configuration is not an object");
  std::ostringstream o;
  write_table(o, config, "");
  return o.str();
}

}  // namespace deloco
