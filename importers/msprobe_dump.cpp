#include "importers/msprobe_dump.h"

#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "llvm/Support/JSON.h"
#include "support/status.h"

namespace moerr::importers {
namespace {

namespace json = llvm::json;

// Deeper nesting than any dump has; bounds the recursion of the parsers.
constexpr int kMaxDepth = 64;

absl::Status Bad(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// One pass over JSON text outside its strings: the nesting depth, Python's
// non-finite words quoted, and the keys of the top-level object "data" in
// the order they appear (llvm::json::Object does not keep it).
struct Scan {
  std::string quoted;
  std::vector<std::string> data_keys;  // raw, still escaped
  int max_depth = 0;
};

Scan ScanText(absl::string_view text) {
  Scan scan;
  scan.quoted.reserve(text.size() + 64);
  int depth = 0;
  bool in_data = false;        // inside the value of the top-level key "data"
  std::string last_top_key;    // the last string seen at depth 1
  size_t string_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      string_start = i;
      size_t j = i + 1;
      while (j < text.size() && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      const size_t end = std::min(j, text.size() - 1);
      const absl::string_view body = text.substr(string_start + 1, end - string_start - 1);
      size_t k = end + 1;
      while (k < text.size() && absl::ascii_isspace(static_cast<unsigned char>(text[k]))) ++k;
      const bool is_key = k < text.size() && text[k] == ':';
      if (is_key && depth == 1) last_top_key = std::string(body);
      if (is_key && depth == 2 && in_data) scan.data_keys.emplace_back(body);
      scan.quoted.append(text.data() + i, end + 1 - i);
      i = end;
      continue;
    }
    if (c == '{' || c == '[') {
      ++depth;
      scan.max_depth = std::max(scan.max_depth, depth);
      if (depth == 2) in_data = c == '{' && last_top_key == "data";
    } else if (c == '}' || c == ']') {
      --depth;
    }
    for (absl::string_view word : {"NaN", "Infinity", "-Infinity"}) {
      if (text.substr(i, word.size()) == word) {
        absl::StrAppend(&scan.quoted, "\"", word, "\"");
        i += word.size() - 1;
        goto next;
      }
    }
    scan.quoted.push_back(c);
  next:;
  }
  return scan;
}

// A number as dumped: a JSON number, a bool (a bool tensor's any / all), a
// quoted non-finite word, or null (absent).
absl::StatusOr<std::optional<double>> Number(const json::Object& o, llvm::StringRef key, absl::string_view where) {
  const json::Value* v = o.get(key);
  if (v == nullptr || v->getAsNull()) return std::optional<double>();
  if (auto d = v->getAsNumber()) return std::optional<double>(*d);
  if (auto b = v->getAsBoolean()) return std::optional<double>(*b ? 1.0 : 0.0);
  if (auto s = v->getAsString()) {
    if (*s == "NaN") return std::optional<double>(std::numeric_limits<double>::quiet_NaN());
    if (*s == "Infinity") return std::optional<double>(std::numeric_limits<double>::infinity());
    if (*s == "-Infinity") return std::optional<double>(-std::numeric_limits<double>::infinity());
  }
  return Bad(absl::StrCat(where, ": ", key.str()), "expected a number");
}

absl::Status ParseTensor(const json::Object& o, DumpValue& value) {
  value.tensor = true;
  const auto dtype = o.getString("dtype");
  if (!dtype) return Bad(value.where, "a tensor without a dtype");
  value.dtype = dtype->str();
  const json::Array* shape = o.getArray("shape");
  if (shape == nullptr) return Bad(value.where, "a tensor without a shape");
  for (const json::Value& d : *shape) {
    const auto n = d.getAsInteger();
    if (!n || *n < 0) return Bad(absl::StrCat(value.where, ": shape"), "expected a list of non-negative integers");
    value.shape.push_back(*n);
  }
  MOERR_ASSIGN_OR_RETURN(value.max, Number(o, "Max", value.where));
  MOERR_ASSIGN_OR_RETURN(value.min, Number(o, "Min", value.where));
  MOERR_ASSIGN_OR_RETURN(value.mean, Number(o, "Mean", value.where));
  MOERR_ASSIGN_OR_RETURN(value.norm, Number(o, "Norm", value.where));
  MOERR_ASSIGN_OR_RETURN(value.max_finite, Number(o, "Max_except_inf_nan", value.where));
  MOERR_ASSIGN_OR_RETURN(value.min_finite, Number(o, "Min_except_inf_nan", value.where));
  if (const json::Value* md5 = o.get("md5"); md5 != nullptr && !md5->getAsNull()) {
    // The xor summary writes a 0-d tensor's value itself, as its statistics do.
    const auto number = md5->getAsNumber();
    const auto flag = md5->getAsBoolean();
    const auto s = md5->getAsString();
    if (number || flag) {
      const double v = number ? *number : static_cast<double>(*flag);
      if (!value.max) value.max = value.min = value.mean = v, value.norm = std::fabs(v);
    } else if (s) {
      value.checksum = s->str();
    } else {
      return Bad(absl::StrCat(value.where, ": md5"), "expected a string, a number or null");
    }
  }
  if (const json::Value* name = o.get("data_name")) {
    const auto s = name->getAsString();
    if (!s) return Bad(absl::StrCat(value.where, ": data_name"), "expected a string");
    if (*s != "-1") value.data_name = s->str();  // "-1": not saved
  }
  return absl::OkStatus();
}

bool IsTensorType(llvm::StringRef type) {
  return type == "torch.Tensor" || type == "mindspore.Tensor" || type == "numpy.ndarray";
}

// Appends the values of `v` (one value, or a nested list / tuple of them).
absl::Status ParseValues(const json::Value& v, const std::string& where, int depth, std::vector<DumpValue>& out) {
  if (depth > kMaxDepth) return Bad(where, "nested too deeply");
  if (const json::Array* list = v.getAsArray()) {
    for (size_t i = 0; i < list->size(); ++i) {
      MOERR_RETURN_IF_ERROR(ParseValues((*list)[i], absl::StrCat(where, "[", i, "]"), depth + 1, out));
    }
    return absl::OkStatus();
  }
  DumpValue value;
  value.where = where;
  if (v.getAsNull()) {
    value.none = true;
    out.push_back(std::move(value));
    return absl::OkStatus();
  }
  const json::Object* o = v.getAsObject();
  if (o == nullptr) return Bad(where, "expected an object, a list or null");
  const auto type = o->getString("type");
  if (!type) {
    // A dict argument, or a P2POp ("class_type"): its members, if any are values.
    for (const auto& [key, member] : *o) {
      if (member.getAsObject() || member.getAsArray()) {
        MOERR_RETURN_IF_ERROR(ParseValues(member, absl::StrCat(where, ".", key.str()), depth + 1, out));
      }
    }
    return absl::OkStatus();
  }
  value.type = type->str();
  if (IsTensorType(*type)) {
    MOERR_RETURN_IF_ERROR(ParseTensor(*o, value));
  } else if (const json::Value* x = o->get("value")) {
    if (auto d = x->getAsNumber()) value.number = *d;
    if (auto b = x->getAsBoolean()) value.number = *b ? 1.0 : 0.0;
    if (auto s = x->getAsString()) {
      // A float argument that was not finite, quoted by the scan.
      if (value.type == "float" && (*s == "NaN" || *s == "Infinity" || *s == "-Infinity")) {
        MOERR_ASSIGN_OR_RETURN(value.number, Number(*o, "value", where));
      } else {
        value.text = s->str();
      }
    }
    value.none = x->getAsNull().hasValue();
  }
  out.push_back(std::move(value));
  return absl::OkStatus();
}

absl::Status ParseMember(const json::Object& o, llvm::StringRef key, const std::string& prefix,
                         std::vector<DumpValue>& out) {
  if (const json::Value* v = o.get(key)) return ParseValues(*v, prefix, 0, out);
  return absl::OkStatus();
}

absl::Status ParseEntryBody(const json::Object& o, DumpEntry& entry) {
  if (const json::Value* flag = o.get("is_nan")) {
    if (const auto i = flag->getAsInteger()) entry.is_nan = *i;
    if (const auto b = flag->getAsBoolean()) entry.is_nan = *b ? 1 : 0;
  }
  if (entry.kind == EntryKind::kParametersGrad) {
    // {"weight": [grad], "bias": [grad]}: the gradients it produced.
    for (const auto& [key, v] : o) MOERR_RETURN_IF_ERROR(ParseValues(v, key.str(), 0, entry.outputs));
    return absl::OkStatus();
  }
  if (entry.phase == formats::Phase::kBackward) {
    MOERR_RETURN_IF_ERROR(ParseMember(o, "input", "input", entry.inputs));
    return ParseMember(o, "output", "output", entry.outputs);
  }
  MOERR_RETURN_IF_ERROR(ParseMember(o, "input_args", "input_args", entry.inputs));
  if (const json::Object* kwargs = o.getObject("input_kwargs")) {
    for (const auto& [key, v] : *kwargs) {
      MOERR_RETURN_IF_ERROR(ParseValues(v, absl::StrCat("input_kwargs.", key.str()), 0, entry.inputs));
    }
  }
  if (const json::Object* params = o.getObject("parameters")) {
    for (const auto& [key, v] : *params) {
      MOERR_RETURN_IF_ERROR(ParseValues(v, absl::StrCat("parameters.", key.str()), 0, entry.inputs));
    }
  }
  return ParseMember(o, "output", "output", entry.outputs);
}

bool IsCount(absl::string_view s) {
  int64_t n = 0;
  return !s.empty() && absl::SimpleAtoi(s, &n) && n >= 0;
}

absl::StatusOr<json::Value> ParseText(absl::string_view text, absl::string_view file, Scan* scan_out) {
  Scan scan = ScanText(text);
  if (scan.max_depth > kMaxDepth) return Bad(file, "JSON nested too deeply");
  llvm::Expected<json::Value> root = json::parse(scan.quoted);
  if (!root) {
    return Bad(file, absl::StrCat("not valid JSON (cut short?): ", llvm::toString(root.takeError())));
  }
  if (scan_out != nullptr) *scan_out = std::move(scan);
  return std::move(*root);
}

}  // namespace

std::string QuoteNonFiniteWords(absl::string_view text) { return ScanText(text).quoted; }

absl::Status ParseEntryName(absl::string_view name, DumpEntry& entry) {
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  const auto bad = [&] {
    return Bad(absl::StrCat("entry ", name),
               "expected PREFIX.API.CALL.forward|backward or Module.PATH.CLASS.forward|backward.CALL");
  };
  if (parts.size() < 4 || parts[0].empty()) return bad();
  const size_t n = parts.size();
  if (parts[0] == "Module" || parts[0] == "Cell") {
    // Module.PATH.CLASS.DIRECTION.CALL, or Module.PATH.CLASS.parameters_grad[.CALL]
    size_t dir = n - 2;
    if (parts[n - 1] == "parameters_grad") dir = n - 1;
    if (!IsCount(parts[n - 1]) && dir == n - 2) return bad();
    const absl::string_view direction = parts[dir];
    if (dir < 2) return bad();
    if (direction == "forward") {
      entry.kind = EntryKind::kModule;
      entry.phase = formats::Phase::kForward;
    } else if (direction == "backward") {
      entry.kind = EntryKind::kModule;
      entry.phase = formats::Phase::kBackward;
    } else if (direction == "parameters_grad") {
      entry.kind = EntryKind::kParametersGrad;
      entry.phase = formats::Phase::kBackward;
    } else {
      return bad();
    }
    const absl::string_view cls = parts[dir - 1];
    entry.op = entry.kind == EntryKind::kParametersGrad ? absl::StrCat(parts[0], ".", cls, ".parameters_grad")
                                                         : absl::StrCat(parts[0], ".", cls);
    entry.module = absl::StrJoin(parts.begin() + 1, parts.begin() + (dir - 1), ".");
    return absl::OkStatus();
  }
  if (parts[n - 1] != "forward" && parts[n - 1] != "backward") return bad();
  if (!IsCount(parts[n - 2])) return bad();
  entry.kind = EntryKind::kApi;
  entry.phase = parts[n - 1] == "forward" ? formats::Phase::kForward : formats::Phase::kBackward;
  entry.op = absl::StrJoin(parts.begin(), parts.begin() + (n - 2), ".");
  return absl::OkStatus();
}

absl::StatusOr<DumpFile> ParseDumpJson(absl::string_view text, absl::string_view file) {
  Scan scan;
  MOERR_ASSIGN_OR_RETURN(json::Value root, ParseText(text, file, &scan));
  const json::Object* top = root.getAsObject();
  if (top == nullptr) return Bad(file, "expected a JSON object");
  DumpFile dump;
  for (auto [key, field] : {std::pair<const char*, std::string*>{"task", &dump.task},
                            {"level", &dump.level},
                            {"framework", &dump.framework},
                            {"dump_data_dir", &dump.dump_data_dir}}) {
    if (const json::Value* v = top->get(key); v != nullptr && !v->getAsNull()) {
      const auto s = v->getAsString();
      if (!s) return Bad(file, absl::StrCat("\"", key, "\": expected a string"));
      *field = s->str();
    }
  }
  const json::Object* data = top->getObject("data");
  if (data == nullptr) return Bad(file, "no \"data\" object");
  dump.entries.reserve(data->size());
  for (const std::string& raw : scan.data_keys) {
    // Decode the key's escapes the way the parser did.
    llvm::Expected<json::Value> key = json::parse(absl::StrCat("\"", raw, "\""));
    if (!key || !key->getAsString()) return Bad(file, absl::StrCat("entry key ", raw, ": not a JSON string"));
    const std::string name = key->getAsString()->str();
    const json::Object* body = data->getObject(name);
    const std::string where = absl::StrCat(file, ": entry ", name);
    if (body == nullptr) return Bad(where, "expected an object");
    DumpEntry entry;
    entry.name = name;
    MOERR_RETURN_IF_ERROR(Annotate(ParseEntryName(name, entry), file));
    MOERR_RETURN_IF_ERROR(Annotate(ParseEntryBody(*body, entry), where));
    dump.entries.push_back(std::move(entry));
  }
  if (dump.entries.size() != data->size()) {
    return Bad(file, "\"data\" names an entry twice");
  }
  return dump;
}

absl::StatusOr<std::map<std::string, std::string>> ParseConstructJson(absl::string_view text, absl::string_view file) {
  MOERR_ASSIGN_OR_RETURN(json::Value root, ParseText(text, file, nullptr));
  const json::Object* top = root.getAsObject();
  if (top == nullptr) return Bad(file, "expected a JSON object");
  std::map<std::string, std::string> parents;
  for (const auto& [key, v] : *top) {
    if (v.getAsNull()) continue;
    const auto parent = v.getAsString();
    const std::string where = absl::StrCat(file, ": entry ", key.str());
    if (!parent) return Bad(where, "expected the parent's name or null");
    DumpEntry module;
    if (!ParseEntryName(parent->str(), module).ok()) {
      // A scope that is not a module: msprobe puts the optimizer's APIs
      // under "optimizer".
      parents[key.str()] = parent->str();
      continue;
    }
    if (module.kind != EntryKind::kModule) return Bad(where, absl::StrCat("parent ", parent->str(), " is not a module"));
    parents[key.str()] = module.module;
  }
  return parents;
}

}  // namespace moerr::importers
