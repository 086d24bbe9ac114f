// An op's arguments in their Cap'n Proto form (bundle.capnp, Arg), and the
// text and list helpers the index's encoding shares with them. Internal to
// formats/ (bundle_index.cpp).
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "formats/bundle.capnp.h"
#include "formats/trace.h"

namespace moerr::formats {

inline capnp::Text::Reader TextOf(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }
inline absl::string_view View(capnp::Text::Reader t) { return absl::string_view(t.begin(), t.size()); }

template <typename List, typename T>
void SetList(List list, const std::vector<T>& values) {
  for (size_t i = 0; i < values.size(); ++i) list.set(i, values[i]);
}

template <typename T, typename List>
std::vector<T> GetList(List list) {
  std::vector<T> out;
  out.reserve(list.size());
  for (auto v : list) out.push_back(static_cast<T>(v));
  return out;
}

void SetArg(const OpArg& in, schema::Arg::Builder out);
// An argument kind this reader does not know (a newer writer's) reads as
// kUnsupported, naming why.
OpArg GetArg(schema::Arg::Reader in);

}  // namespace moerr::formats
