// src/cli/web_assets.h — uPlot (MIT, https://github.com/leeoniya/uPlot), fetched from the npm registry by
// scripts/setup.sh into third_party/uplot and compiled in (CMakeLists.txt), so that `deloco report` writes pages
// that load nothing at run time. Both strings are empty when the build had no third_party/uplot. The page's own
// template, script and style are src/report/web/, compiled into src/report/report.cpp (cmake/page_assets.cmake).
#pragma once

namespace deloco::cli {

extern const char* const kUplotJs;   // uPlot.iife.min.js
extern const char* const kUplotCss;  // uPlot.min.css

}  // namespace deloco::cli
