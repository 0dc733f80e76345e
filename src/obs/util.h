// Small helpers of the obs layer. Internal header.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace tutti::obs {

// A JSON string's contents: quotes, backslashes and control characters escaped.
inline std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace tutti::obs
