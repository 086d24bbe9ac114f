// The synthetic task: multi-digit addition written as tokens, with a
// rule-based verifier. "BOS a1 a0 + b1 b0 =" -> the sum's digits, least
// significant first (easier for a small model), then EOS. All prompts have
// one length and all answers another, so batches need no padding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <string>

namespace moerr::moe {

class AdditionTask {
 public:
  static constexpr int64_t kPlus = 10, kEquals = 11, kEos = 12, kBos = 13, kVocab = 16;

  explicit AdditionTask(int digits = 2) : digits_(digits) {}

  int64_t prompt_length() const { return 2 * digits_ + 3; }
  int64_t answer_length() const { return digits_ + 2; }  // digits + carry + EOS

  struct Batch {
    at::Tensor prompts;  // [n, prompt_length] int64
    at::Tensor answers;  // [n, answer_length] int64, the correct responses
  };
  Batch Sample(int64_t n, std::mt19937_64& rng) const;

  // Per row: the share of answer positions right (1 when exact).
  at::Tensor Reward(const at::Tensor& answers, const at::Tensor& responses) const;
  // "37+45=" style text of a prompt row and a response row.
  std::string Render(const at::Tensor& prompt, const at::Tensor& response) const;

 private:
  int digits_;
};

}  // namespace moerr::moe
