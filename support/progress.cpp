#include "support/progress.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_format.h"

namespace moerr {

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)),
      total_(total),
      enabled_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - std::chrono::seconds(1)) {}

Progress::~Progress() { Finish(); }

void Progress::Update(int64_t done, absl::string_view note) {
  if (!enabled_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100) && done != total_) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  constexpr int kWidth = 30;
  std::string bar;
  if (total_ > 0) {
    const int filled = static_cast<int>(kWidth * std::min<int64_t>(done, total_) / total_);
    bar = absl::StrFormat("[%s%s] %d/%d", std::string(filled, '#'), std::string(kWidth - filled, '.'),
                          done, total_);
  } else {
    bar = absl::StrFormat("%d", done);
  }
  std::fprintf(stderr, "\r\033[K%s %s %.1fs %s", label_.c_str(), bar.c_str(), elapsed,
               std::string(note).c_str());
  std::fflush(stderr);
}

void Progress::Finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

void PhasedProgress::Update(const std::string& phase, int64_t done, int64_t total) {
  if (!bar_ || phase != phase_) {
    bar_ = std::make_unique<Progress>(phase, total);
    phase_ = phase;
  }
  bar_->Update(done);
}

}  // namespace moerr
