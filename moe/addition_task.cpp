#include "moe/addition_task.h"

#include <ATen/ATen.h>

namespace moerr::moe {

AdditionTask::Batch AdditionTask::Sample(int64_t n, std::mt19937_64& rng) const {
  // Filled outside ATen and copied in with one op each, so a tracer sees the
  // batch as data that came from outside the step (a leaf).
  std::vector<int64_t> prompts(n * prompt_length()), answers(n * answer_length());
  auto p = [&](int64_t r) { return prompts.data() + r * prompt_length(); };
  auto a = [&](int64_t r) { return answers.data() + r * answer_length(); };
  int64_t limit = 1;
  for (int i = 0; i < digits_; ++i) limit *= 10;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t x = rng() % limit, y = rng() % limit;
    int64_t at = 0;
    p(r)[at++] = kBos;
    for (int64_t v = x, i = 0; i < digits_; ++i, v /= 10) p(r)[at + digits_ - 1 - i] = v % 10;
    at += digits_;
    p(r)[at++] = kPlus;
    for (int64_t v = y, i = 0; i < digits_; ++i, v /= 10) p(r)[at + digits_ - 1 - i] = v % 10;
    at += digits_;
    p(r)[at++] = kEquals;
    int64_t s = x + y;
    for (int i = 0; i <= digits_; ++i, s /= 10) a(r)[i] = s % 10;  // least significant first
    a(r)[digits_ + 1] = kEos;
  }
  Batch b;
  b.prompts = at::from_blob(prompts.data(), {n, prompt_length()}, at::kLong).clone();
  b.answers = at::from_blob(answers.data(), {n, answer_length()}, at::kLong).clone();
  return b;
}

at::Tensor AdditionTask::Reward(const at::Tensor& answers, const at::Tensor& responses) const {
  return responses.eq(answers).to(at::kFloat).mean(1);
}

std::string AdditionTask::Render(const at::Tensor& prompt, const at::Tensor& response) const {
  static const char kChars[] = "0123456789+=$^??";
  std::string out;
  for (int64_t i = 1; i < prompt.size(0); ++i) out += kChars[prompt[i].item<int64_t>()];
  for (int64_t i = 0; i < response.size(0); ++i) out += kChars[response[i].item<int64_t>() & 15];
  return out;
}

}  // namespace moerr::moe
