// Text placed in HTML or SVG, as element content or a double-quoted attribute.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace moerr {

// `text` with & < > " replaced by their character references.
std::string HtmlEscape(absl::string_view text);

}  // namespace moerr
