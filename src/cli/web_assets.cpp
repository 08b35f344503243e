// The chart library compiled into the binary (see web_assets.h): uPlot from third_party/uplot, empty when the
// tree had not fetched it at build time.
#include "web_assets.h"

namespace deloco::cli {

const char* const kUplotJs =
#include "uPlot_iife_min_js.inc"
    ;
const char* const kUplotCss =
#include "uPlot_min_css.inc"
    ;

}  // namespace deloco::cli
