// Reads required fields of a JSON object into typed variables, remembering
// the first missing or mistyped one:
//
//   JsonFields f(object, "trainer_state");
//   f.Get("step", step);
//   f.Get("loss_scale", scale);
//   MOERR_RETURN_IF_ERROR(f.status());  // "trainer_state: \"step\" is missing or not an integer"
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "llvm/Support/JSON.h"

namespace moerr {

class JsonFields {
 public:
  // `what` names the object in errors.
  JsonFields(const llvm::json::Object& object, std::string what) : object_(object), what_(std::move(what)) {}

  void Get(const char* key, int64_t& out) { Take(key, object_.getInteger(key), out, "an integer"); }
  void Get(const char* key, double& out) { Take(key, object_.getNumber(key), out, "a number"); }
  void Get(const char* key, bool& out) { Take(key, object_.getBoolean(key), out, "a boolean"); }
  void Get(const char* key, std::string& out) {
    auto v = object_.getString(key);
    if (v) out = v->str();
    Take(key, v.hasValue(), "a string");
  }
  const llvm::json::Object* GetObject(const char* key) {
    const llvm::json::Object* v = object_.getObject(key);
    Take(key, v != nullptr, "an object");
    return v;
  }

  const absl::Status& status() const { return status_; }

 private:
  template <typename T, typename U>
  void Take(const char* key, const llvm::Optional<T>& v, U& out, const char* kind) {
    if (v) out = static_cast<U>(*v);
    Take(key, v.hasValue(), kind);
  }
  void Take(const char* key, bool present, const char* kind) {
    if (present || !status_.ok()) return;
    status_ = absl::InvalidArgumentError(absl::StrFormat("%s: \"%s\" is missing or not %s", what_, key, kind));
  }

  const llvm::json::Object& object_;
  std::string what_;
  absl::Status status_;
};

}  // namespace moerr
