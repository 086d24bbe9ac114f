// A self-contained HTML page: headings, paragraphs, preformatted text,
// tables and inline SVG figures, written in one file a browser opens
// without anything else.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moerr::report {

class HtmlReport {
 public:
  explicit HtmlReport(std::string title) : title_(std::move(title)) {}

  // Text arguments are escaped; `svg` is inserted as it is.
  void Heading(const std::string& text);
  void Paragraph(const std::string& text);
  void Preformatted(const std::string& text);
  void Table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);
  void Figure(const std::string& svg, const std::string& caption);

  // The verdict, drawn under the title before every section: a heading and
  // labelled lines; a line with `code` set is a command. `failed` frames it
  // as a problem found. A page has one: a second call replaces the first.
  struct VerdictLine {
    std::string label, text;
    bool code = false;
  };
  void Verdict(const std::string& heading, const std::vector<VerdictLine>& lines, bool failed);
  bool has_verdict() const { return !verdict_.empty(); }

  std::string Render() const;
  // Writes PATH.tmp and renames it over PATH: a reader never sees half a page.
  absl::Status Write(const std::string& path) const;

 private:
  std::string title_;
  std::string verdict_;
  std::string body_;
};

}  // namespace moerr::report
