// How many times `what` occurs in `text`: the report tests count the SVG
// elements and legend entries a chart draws.
#pragma once

#include <cstddef>
#include <string>

namespace shardfit::reports {

inline size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace shardfit::reports
