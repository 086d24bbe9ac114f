#include "support/html_page.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "support/html_escape.h"

namespace moerr {

void HtmlPage::Heading(const std::string& text) { absl::StrAppend(&body_, "<h2>", HtmlEscape(text), "</h2>\n"); }

void HtmlPage::Paragraph(const std::string& text, const std::string& bold) {
  absl::StrAppend(&body_, "<p>", HtmlEscape(text));
  if (!bold.empty()) absl::StrAppend(&body_, "<b>", HtmlEscape(bold), "</b>");
  body_ += "</p>\n";
}

void HtmlPage::Preformatted(const std::string& text) { absl::StrAppend(&body_, "<pre>", HtmlEscape(text), "</pre>\n"); }

void HtmlPage::Table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                     const TableStyle& style) {
  body_ += "<table>\n<tr>";
  for (const std::string& h : header) absl::StrAppend(&body_, "<th>", HtmlEscape(h), "</th>");
  body_ += "</tr>\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    body_ += style.marked == r ? "<tr class=\"marked\">" : "<tr>";
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const bool code = std::find(style.code.begin(), style.code.end(), c) != style.code.end();
      absl::StrAppend(&body_, "<td>", code ? "<code>" : "", HtmlEscape(rows[r][c]), code ? "</code>" : "", "</td>");
    }
    body_ += "</tr>\n";
  }
  body_ += "</table>\n";
}

void HtmlPage::Figure(const std::string& svg, const std::string& caption) {
  absl::StrAppend(&body_, "<figure>\n", svg);
  if (!caption.empty()) absl::StrAppend(&body_, "<figcaption>", HtmlEscape(caption), "</figcaption>\n");
  body_ += "</figure>\n";
}

void HtmlPage::Verdict(const std::string& heading, const std::vector<VerdictLine>& lines, bool failed) {
  verdict_ = absl::StrCat("<section class=\"verdict ", failed ? "failed" : "passed", "\">\n<h2>", HtmlEscape(heading),
                          "</h2>\n<dl>\n");
  for (const VerdictLine& line : lines) {
    absl::StrAppend(&verdict_, "<dt>", HtmlEscape(line.label), "</dt><dd>", line.code ? "<code>" : "",
                    HtmlEscape(line.text), line.code ? "</code>" : "", "</dd>\n");
  }
  verdict_ += "</dl>\n</section>\n";
}

std::string HtmlPage::Render() const {
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>", HtmlEscape(title_),
      "</title>\n<style>\n"
      "body { font-family: sans-serif; max-width: 980px; margin: 2em auto; color: #222; line-height: 1.4; }\n"
      "pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 12px; }\n"
      "code { font-size: 13px; }\n"
      "table { border-collapse: collapse; margin: 0.5em 0; font-size: 13px; }\n"
      "th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }\n"
      "tr.marked { background: #fee; }\n"
      "figure { margin: 1em 0; } figcaption { font-size: 12px; color: #555; }\n"
      ".verdict { border-left: 6px solid #2ca02c; background: #f3faf3; padding: 0.4em 1em; margin: 1em 0; }\n"
      ".verdict.failed { border-color: #d62728; background: #fdf3f3; }\n"
      ".verdict h2 { margin: 0.3em 0; font-size: 1.2em; }\n"
      ".verdict dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; margin: 0.4em 0; }\n"
      ".verdict dt { font-weight: bold; } .verdict dd { margin: 0; }\n"
      "</style>\n</head>\n<body>\n<h1>",
      HtmlEscape(title_), "</h1>\n", verdict_, body_, "</body>\n</html>\n");
}

absl::Status HtmlPage::Write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << Render();
    out.close();
    if (!out) return absl::UnavailableError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::UnavailableError("cannot rename " + tmp + " to " + path);
  return absl::OkStatus();
}

}  // namespace moerr
