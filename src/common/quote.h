// Outside text (a reply's body, a watch line) quoted inside an error message: cut to a cap, on one line.
//
//   return absl::DataLossError(StrCat(what, ": the reply is not JSON: '", Quote(body), "'"));
//
// Thread-safety: a function of its argument.
#ifndef TESSERA_COMMON_QUOTE_H_
#define TESSERA_COMMON_QUOTE_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace tessera {

// The most characters of the text a message quotes: enough for the start of a Status, an HTML error page's
// title or a JSON line, and a message stays one readable log line whatever the peer sent.
inline constexpr size_t kQuoteCap = 200;

// The first kQuoteCap characters of `text`, with "..." after them when it was longer; line breaks (\n, \r)
// become spaces, so that a message quoting it stays on one line.
std::string Quote(std::string_view text);

}  // namespace tessera

#endif  // TESSERA_COMMON_QUOTE_H_
