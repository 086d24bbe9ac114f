// The report's page was report::HtmlReport; it is now the shared
// moerr::HtmlPage (support/html_page.h). This alias remains only for the
// tools/ files that still include this header, and goes once they include
// support/html_page.h.
#pragma once

#include "support/html_page.h"

namespace moerr::report {

using HtmlReport = HtmlPage;

}  // namespace moerr::report
