#include "common/quote.h"

#include <algorithm>

namespace tessera {

std::string Quote(std::string_view text) {
  std::string out;
  out.reserve(std::min(text.size(), kQuoteCap) + 3);
  for (char c : text.substr(0, kQuoteCap)) out.push_back(c == '\n' || c == '\r' ? ' ' : c);
  if (text.size() > kQuoteCap) out += "...";
  return out;
}

}  // namespace tessera
