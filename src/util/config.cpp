#include "deloco/config.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

namespace deloco {
namespace {

using Value = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<double>>;

std::string type_name(const ConfigSchema::Field& f) {
  switch (f.index()) {
    case 0: return "an integer";
    case 1: return "a number";
    case 2: return "a boolean (true/false)";
    case 3: return "a string";
    case 4: return "a list of integers";
    default: return "a list of numbers";
  }
}

// Converts a TOML node to the bound field's type, or returns false.
bool from_toml(const toml::node& n, const ConfigSchema::Field& f, Value* out) {
  switch (f.index()) {
    case 0:
      if (auto v = n.value_exact<int64_t>()) { *out = *v; return true; }
      return false;
    case 1:
      if (auto v = n.value_exact<double>()) { *out = *v; return true; }
      if (auto v = n.value_exact<int64_t>()) { *out = static_cast<double>(*v); return true; }
      return false;
    case 2:
      if (auto v = n.value_exact<bool>()) { *out = *v; return true; }
      return false;
    case 3:
      if (auto v = n.value_exact<std::string>()) { *out = *v; return true; }
      return false;
    default: {
      const toml::array* arr = n.as_array();
      if (!arr) return false;
      if (f.index() == 4) {
        std::vector<int64_t> v;
        for (const auto& e : *arr) {
          auto x = e.value_exact<int64_t>();
          if (!x) return false;
          v.push_back(*x);
        }
        *out = v;
      } else {
        std::vector<double> v;
        for (const auto& e : *arr) {
          if (auto x = e.value_exact<double>()) v.push_back(*x);
          else if (auto y = e.value_exact<int64_t>()) v.push_back(static_cast<double>(*y));
          else return false;
        }
        *out = v;
      }
      return true;
    }
  }
}

// As TOML reads an integer: decimal without leading zeros ("010" is refused, not read as octal 8), or hex with 0x.
bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  const size_t digits = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  if (!hex && s.size() > digits + 1 && s[digits] == '0') return false;
  size_t pos = 0;
  try {
    long long v = std::stoll(s, &pos, hex ? 16 : 10);
    if (pos != s.size()) return false;
    *out = v;
    return true;
  } catch (...) {
    return false;
  }
}

bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  size_t pos = 0;
  try {
    double v = std::stod(s, &pos);
    if (pos != s.size()) return false;
    *out = v;
    return true;
  } catch (...) {
    return false;
  }
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) parts.push_back(item);
  return parts;
}

// Parses an override's text by the field's type.
bool from_text(const std::string& s, const ConfigSchema::Field& f, Value* out) {
  switch (f.index()) {
    case 0: { int64_t v; if (!parse_int(s, &v)) return false; *out = v; return true; }
    case 1: { double v; if (!parse_double(s, &v)) return false; *out = v; return true; }
    case 2:
      if (s == "true" || s == "1") { *out = true; return true; }
      if (s == "false" || s == "0") { *out = false; return true; }
      return false;
    case 3: {
      std::string v = s;
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      *out = v;
      return true;
    }
    case 4: {
      std::vector<int64_t> v;
      for (const auto& p : split_commas(s)) { int64_t x; if (!parse_int(p, &x)) return false; v.push_back(x); }
      *out = v;
      return true;
    }
    default: {
      std::vector<double> v;
      for (const auto& p : split_commas(s)) { double x; if (!parse_double(p, &x)) return false; v.push_back(x); }
      *out = v;
      return true;
    }
  }
}

// Every number a config gives must be finite: inf or nan would silently disable whatever the key controls (a
// timeout of inf never fires, a learning rate of inf poisons the model). "" when finite, else the value as text.
std::string non_finite(const Value& v) {
  auto show = [](double x) { return std::isnan(x) ? std::string("nan") : std::string(x > 0 ? "inf" : "-inf"); };
  if (const double* d = std::get_if<double>(&v)) return std::isfinite(*d) ? std::string() : show(*d);
  if (const auto* l = std::get_if<std::vector<double>>(&v))
    for (double x : *l)
      if (!std::isfinite(x)) return show(x);
  return std::string();
}

void store(const ConfigSchema::Field& f, const Value& v) {
  std::visit([&](auto* ptr) { *ptr = std::get<std::remove_pointer_t<decltype(ptr)>>(v); }, f);
}

void flatten(const toml::table& t, const std::string& prefix,
             std::vector<std::pair<std::string, const toml::node*>>* out) {
  for (const auto& [k, node] : t) {
    std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table()) flatten(*sub, key, out);
    else out->emplace_back(key, &node);
  }
}

}  // namespace

void ConfigSchema::bind(const std::string& key, Field field, std::string help, std::function<std::string()> check) {
  if (find(key)) throw std::logic_error("config key bound twice: " + key);
  entries_.push_back({key, field, std::move(help), std::move(check)});
}

const ConfigSchema::Entry* ConfigSchema::find(const std::string& key) const {
  for (const auto& e : entries_)
    if (e.key == key) return &e;
  return nullptr;
}

bool ConfigSchema::has(const std::string& key) const { return find(key) != nullptr; }

void ConfigSchema::load_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("config file '" + path + "' cannot be opened (does it exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  load_string(ss.str(), path);
}

void ConfigSchema::load_string(const std::string& text, const std::string& origin) {
  toml::table table;
  try {
    table = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << "config file '" << origin << "' is not valid TOML at line " << e.source().begin.line << ": "
        << e.description();
    throw ConfigError(msg.str());
  }
  std::vector<std::pair<std::string, const toml::node*>> items;
  flatten(table, "", &items);
  std::vector<std::pair<const Entry*, Value>> staged;
  for (const auto& [key, node] : items) {
    const Entry* e = find(key);
    if (!e) throw ConfigError("config file '" + origin + "': unknown key '" + key + "'");
    Value v;
    if (!from_toml(*node, e->field, &v))
      throw ConfigError("config file '" + origin + "': key '" + key + "' must be " + type_name(e->field));
    if (const std::string bad = non_finite(v); !bad.empty())
      throw ConfigError("config file '" + origin + "': key '" + key + "' must be finite, got " + bad);
    staged.emplace_back(e, std::move(v));
  }
  for (const auto& [e, v] : staged) {
    store(e->field, v);
    assigned_.insert(e->key);
  }
}

void ConfigSchema::apply_override(const std::string& assignment, const std::string& origin) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(origin + " '" + assignment + "' must have the form section.key=value");
  std::string key = assignment.substr(0, eq);
  std::string text = assignment.substr(eq + 1);
  const Entry* e = find(key);
  if (!e) throw ConfigError(origin + ": unknown key '" + key + "'");
  Value v;
  if (!from_text(text, e->field, &v))
    throw ConfigError(origin + ": key '" + key + "' must be " + type_name(e->field) + ", got '" + text + "'");
  if (const std::string bad = non_finite(v); !bad.empty())
    throw ConfigError(origin + ": key '" + key + "' must be finite, got " + bad);
  store(e->field, v);
  assigned_.insert(e->key);
}

void ConfigSchema::validate() const {
  for (const auto& e : entries_) {
    if (!e.check) continue;
    std::string err = e.check();
    if (!err.empty()) throw ConfigError("config key '" + e.key + "': " + err);
  }
}

nlohmann::json ConfigSchema::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& e : entries_) {
    nlohmann::json* node = &j;
    std::string rest = e.key;
    size_t dot;
    while ((dot = rest.find('.')) != std::string::npos) {
      node = &(*node)[rest.substr(0, dot)];
      rest = rest.substr(dot + 1);
    }
    std::visit([&](auto* ptr) { (*node)[rest] = *ptr; }, e.field);
  }
  return j;
}

nlohmann::json ConfigSchema::describe() const {
  static const char* kTypes[] = {"integer", "number", "boolean", "string", "integer list", "number list"};
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : entries_) {
    nlohmann::json value;
    std::visit([&](auto* ptr) { value = *ptr; }, e.field);
    out.push_back({{"key", e.key}, {"type", kTypes[e.field.index()]}, {"value", value}, {"help", e.help}});
  }
  return out;
}

void ConfigSchema::from_json(const nlohmann::json& j, const std::string& origin) {
  // Round-trip through TOML-free logic: flatten the JSON and parse each leaf by type.
  std::vector<std::pair<std::string, const nlohmann::json*>> items;
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& n,
                                                                            const std::string& prefix) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
      if (it->is_object()) walk(*it, key);
      else items.emplace_back(key, &*it);
    }
  };
  if (!j.is_object()) throw ConfigError(origin + ": configuration must be a JSON object");
  walk(j, "");
  std::vector<std::pair<const Entry*, Value>> staged;
  for (const auto& [key, node] : items) {
    const Entry* e = find(key);
    if (!e) throw ConfigError(origin + ": unknown config key '" + key + "'");
    Value v;
    bool ok = false;
    try {
      switch (e->field.index()) {
        case 0: ok = node->is_number_integer(); if (ok) v = node->get<int64_t>(); break;
        case 1: ok = node->is_number(); if (ok) v = node->get<double>(); break;
        case 2: ok = node->is_boolean(); if (ok) v = node->get<bool>(); break;
        case 3: ok = node->is_string(); if (ok) v = node->get<std::string>(); break;
        case 4: ok = node->is_array(); if (ok) v = node->get<std::vector<int64_t>>(); break;
        default: ok = node->is_array(); if (ok) v = node->get<std::vector<double>>(); break;
      }
    } catch (const nlohmann::json::exception&) {
      ok = false;
    }
    if (!ok) throw ConfigError(origin + ": config key '" + key + "' must be " + type_name(e->field));
    if (const std::string bad = non_finite(v); !bad.empty())
      throw ConfigError(origin + ": config key '" + key + "' must be finite, got " + bad);
    staged.emplace_back(e, std::move(v));
  }
  for (const auto& [e, v] : staged) {
    store(e->field, v);
    assigned_.insert(e->key);
  }
}

std::vector<std::string> environment_sets() {
  std::vector<std::string> out;
  const char* v = std::getenv("DELOCO_SET");
  if (v == nullptr) return out;
  std::istringstream lines(v);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

void load_config(ConfigSchema& schema, const ConfigSources& sources) {
  if (sources.base) sources.base();
  if (sources.environment) sources.environment();
  for (const auto& s : environment_sets()) schema.apply_override(s, "DELOCO_SET");
  for (const auto& [origin, assignment] : sources.key_flags) schema.apply_override(assignment, origin);
  for (const auto& s : sources.sets) schema.apply_override(s);
  if (sources.flags) sources.flags();
  schema.validate();
}

}  // namespace deloco
