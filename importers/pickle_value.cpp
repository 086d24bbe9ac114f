#include "importers/pickle_value.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace moerr::importers {

std::string DescribeValue(const PickleValue& v) {
  switch (v.kind) {
    case PickleValue::Kind::kNone: return "None";
    case PickleValue::Kind::kBool: return "a bool";
    case PickleValue::Kind::kInt: return "an int";
    case PickleValue::Kind::kFloat: return "a float";
    case PickleValue::Kind::kString: return "a string";
    case PickleValue::Kind::kBytes: return "bytes";
    case PickleValue::Kind::kTuple: return "a tuple";
    case PickleValue::Kind::kList: return "a list";
    case PickleValue::Kind::kDict: return "a dict";
    case PickleValue::Kind::kSet: return "a set";
    case PickleValue::Kind::kStorage: return "a bare storage";
    case PickleValue::Kind::kTensor: return "a tensor";
    case PickleValue::Kind::kGlobal: return absl::StrCat("the class or function ", v.text);
    case PickleValue::Kind::kObject: {
      if (!v.note.empty()) return v.note;
      const bool vowel = !v.text.empty() && absl::StrContains("aeiouAEIOU", v.text.substr(0, 1));
      return absl::StrCat(vowel ? "an " : "a ", v.text, " object");
    }
  }
  return "a value";
}

}  // namespace moerr::importers
