// src/util/config_toml.h — writing a configuration back as TOML that ConfigSchema reads.
//
// Contract
//  * toml_of(config): TOML text of `config`, a nested JSON object such as ConfigSchema::to_json() makes:
//    {"section": {"key": value}}. Scalars at the top come first, then every object as a [section] table
//    (nested objects as [section.sub]), keys in the object's order. Values: integers as integers, floats with
//    enough digits to read back to the same double (and always a point or exponent, so TOML keeps them floats),
//    booleans, strings as TOML basic strings, and flat arrays of those. Keys that are not bare TOML keys are
//    quoted.
//  * Loading the text into a schema bound like the one that made the JSON gives every field its value exactly.
//  * Throws std::invalid_argument for what TOML or the schema cannot hold: null, a non-finite float, an array of
//    arrays or objects, or a top level that is not an object.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace deloco {

std::string toml_of(const nlohmann::json& config);

}  // namespace deloco
