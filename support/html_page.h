// A self-contained HTML page (no scripts, no external files): the shell every
// page moerr writes shares (head, style, title, escaping) around a verdict
// box and sections of headings, paragraphs, preformatted text, tables and
// inline SVG figures (svg_plot.h). The report and the HTML diff are such pages.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace moerr {

// How a table's cells are set: the columns named in `code` as code (op and
// module names), the row `marked` (an index into the rows) highlighted.
struct TableStyle {
  std::vector<size_t> code;
  std::optional<size_t> marked;
};

class HtmlPage {
 public:
  explicit HtmlPage(std::string title) : title_(std::move(title)) {}

  // Text arguments are escaped; `svg` is inserted as it is.
  void Heading(const std::string& text);
  // `bold`, when not empty, follows `text` in bold (the figure that matters).
  void Paragraph(const std::string& text, const std::string& bold = "");
  void Preformatted(const std::string& text);
  void Table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
             const TableStyle& style = {});
  // An empty caption: none.
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
  std::string verdict_;  // markup, empty until Verdict
  std::string body_;     // the sections' markup, in call order
};

}  // namespace moerr
