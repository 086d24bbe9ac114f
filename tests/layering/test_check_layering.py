#!/usr/bin/env python3
"""check_layering.py run on small trees planted in a temporary directory: a
clean tree passes, and each kind of violation fails with its file, line and
arrow named."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layering.py")

ARCHITECTURE = """\
# Architecture

Each row links only rows below it; the table gives the exact edges.

| Component | Library | Links | What it holds |
|---|---|---|---|
| `base/` | `moerr_base` | Abseil | the lowest |
| `mid/` | `moerr_mid` | base, LLVM Support (zstd privately) | the middle |
| `mid/hooks/` | `moerr_mid_hooks` | mid, LibTorch | a nested component |
| `top/` | `moerr_top` | mid_hooks, LibTorch | links only the hooks |
| `cli/` | `moerr` | all of the above, CLI11 | the command |

After the table.
"""

# The clean tree: every include and link below is allowed by the table.
CLEAN = {
    "docs/ARCHITECTURE.md": ARCHITECTURE,
    "base/CMakeLists.txt": """\
        add_library(moerr_base base.cpp)
        target_link_libraries(moerr_base PUBLIC absl::status)
        """,
    "base/base.h": "#pragma once\n",
    "base/base.cpp": '#include "base/base.h"\n#include <vector>\n',
    "mid/CMakeLists.txt": """\
        add_subdirectory(hooks)
        add_library(moerr_mid mid.cpp)
        # target_link_libraries(moerr_mid PUBLIC moerr_top) is a comment
        target_link_libraries(moerr_mid
          PUBLIC moerr_base moerr_llvm
          PRIVATE PkgConfig::ZSTD)
        """,
    "mid/mid.h": '#pragma once\n#include "base/base.h"\n',
    "mid/mid.cpp": """\
        #include "mid/mid.h"
        // #include "top/top.h" in a comment is no include
        /* nor
        #include "top/top.h"
        in a block comment */
        #include "checks/local.h"
        """,
    "mid/checks/local.h": '#pragma once\n#include "base/base.h"\n',
    "mid/hooks/CMakeLists.txt": """\
        add_library(moerr_mid_hooks hooks.cpp)
        target_link_libraries(moerr_mid_hooks PUBLIC moerr_mid torch)
        """,
    "mid/hooks/hooks.h": '#pragma once\n#include "mid/mid.h"\n',
    "mid/hooks/hooks.cpp": '#include "mid/hooks/hooks.h"\n#include <torch/torch.h>\n',
    "top/CMakeLists.txt": """\
        add_library(moerr_top top.cpp)
        target_link_libraries(moerr_top PUBLIC moerr_mid_hooks torch)
        """,
    "top/top.h": '#pragma once\n#include "mid/hooks/hooks.h"\n',
    "top/top.cu": '#include "top/top.h"\n',
    "cli/CMakeLists.txt": """\
        add_executable(moerr main.cpp)
        target_link_libraries(moerr PRIVATE moerr_top moerr_mid moerr_base CLI11::CLI11)
        """,
    "cli/main.cpp": '#include "top/top.h"\n#include "mid/mid.h"\n#include "base/base.h"\n',
    # Not components: tests, benchmarks and build trees define and link what they like.
    "tests/CMakeLists.txt": "add_library(moerr_test_helpers helpers.cpp)\n",
    "bench/CMakeLists.txt": "add_library(moerr_bench_helpers helpers.cpp)\n",
    "build/CMakeCache.txt": "",
    "build/gen/CMakeLists.txt": "add_library(moerr_generated g.cpp)\n",
    "CMakeLists.txt": "add_library(moerr_llvm INTERFACE)\nadd_subdirectory(base)\n",
}


class LayeringCheckTest(unittest.TestCase):
    def run_check(self, changes=(), removed=()):
        """check_layering.py on the clean tree with changes (path -> text,
        text None to delete), as (exit status, output)."""
        files = dict(CLEAN)
        files.update(dict(changes))
        with tempfile.TemporaryDirectory(prefix="layering-") as root:
            for path, text in files.items():
                if text is None:
                    continue
                full = os.path.join(root, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w", encoding="utf-8") as f:
                    f.write(textwrap.dedent(text))
            result = subprocess.run([sys.executable, SCRIPT, "--root", root],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    universal_newlines=True, timeout=60)
        return result.returncode, result.stdout

    def assert_fails_with(self, changes, *lines):
        rc, out = self.run_check(changes)
        self.assertEqual(rc, 1, out)
        for line in lines:
            self.assertIn(line, out.splitlines(), out)

    def test_clean_tree_passes(self):
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)
        self.assertIn("layering: 5 components", out)

    def test_include_of_a_higher_component_fails(self):
        self.assert_fails_with(
            {"base/base.cpp": '#include "base/base.h"\n\n  #  include "top/top.h"\n'},
            "base/base.cpp:3 includes top/top.h: base -> top is not in docs/ARCHITECTURE.md")

    def test_include_reached_only_transitively_fails(self):
        # top links mid_hooks, which links mid, which links base.
        self.assert_fails_with(
            {"top/top.cu": '#include "top/top.h"\n#include "base/base.h"\n'},
            "top/top.cu:2 includes base/base.h: top -> base is not in docs/ARCHITECTURE.md"
            " (reached only through mid/hooks)")

    def test_nested_component_is_its_own(self):
        # mid/ does not link its nested mid/hooks/ ...
        self.assert_fails_with(
            {"mid/checks/local.h": '#pragma once\n#include "mid/hooks/hooks.h"\n'},
            "mid/checks/local.h:2 includes mid/hooks/hooks.h: mid -> mid/hooks is not in docs/ARCHITECTURE.md")
        # ... and top/, which links mid/hooks/, does not link mid/.
        self.assert_fails_with(
            {"top/top.h": '#pragma once\n#include "mid/mid.h"\n'},
            "top/top.h:2 includes mid/mid.h: top -> mid is not in docs/ARCHITECTURE.md"
            " (reached only through mid/hooks)")

    def test_relative_include_is_resolved(self):
        self.assert_fails_with(
            {"base/base.h": '#pragma once\n#include "../mid/mid.h"\n'},
            "base/base.h:2 includes mid/mid.h: base -> mid is not in docs/ARCHITECTURE.md")

    def test_link_of_a_higher_library_fails(self):
        self.assert_fails_with(
            {"mid/hooks/CMakeLists.txt": """\
                add_library(moerr_mid_hooks hooks.cpp)
                target_link_libraries(moerr_mid_hooks
                  PUBLIC moerr_mid torch
                  PRIVATE moerr_top)
                """},
            "mid/hooks/CMakeLists.txt:4 links moerr_top: mid/hooks -> top is not in docs/ARCHITECTURE.md")

    def test_include_of_an_allowed_but_unlinked_component_fails(self):
        self.assert_fails_with(
            {"cli/CMakeLists.txt": """\
                add_executable(moerr main.cpp)
                target_link_libraries(moerr PRIVATE moerr_top moerr_mid CLI11::CLI11)
                """},
            "cli/main.cpp:3 includes base/base.h: cli/CMakeLists.txt does not link moerr_base")

    def test_table_folder_that_does_not_exist_fails(self):
        self.assert_fails_with(
            {"docs/ARCHITECTURE.md": ARCHITECTURE.replace(
                "| `cli/` |", "| `gone/` | `moerr_gone` | base | not there |\n| `cli/` |")},
            "docs/ARCHITECTURE.md:11: the table names gone/, which does not exist")

    def test_library_folder_missing_from_the_table_fails(self):
        self.assert_fails_with(
            {"extra/CMakeLists.txt": "add_library(moerr_extra extra.cpp)\n"},
            "extra/CMakeLists.txt defines moerr_extra, but extra/ has no row in docs/ARCHITECTURE.md")

    def test_library_column_must_match_cmake(self):
        self.assert_fails_with(
            {"base/CMakeLists.txt": "add_library(moerr_basics base.cpp)\n"},
            "docs/ARCHITECTURE.md:7: base/'s library moerr_base is not defined in base/CMakeLists.txt")

    def test_links_to_a_higher_row_or_an_unknown_name_fail(self):
        self.assert_fails_with(
            {"docs/ARCHITECTURE.md": ARCHITECTURE.replace("| Abseil |", "| Abseil, top, frobnicator |")},
            "docs/ARCHITECTURE.md:7: base/ links top/, which is not lower in the table",
            "docs/ARCHITECTURE.md:7: base/'s Links names 'frobnicator', "
            "neither a row of the table nor a third-party library")

    def test_unreadable_table_is_an_error(self):
        rc, out = self.run_check({"docs/ARCHITECTURE.md": "# Architecture\n\nNo table.\n"})
        self.assertEqual(rc, 2, out)
        self.assertIn("no table with Component, Library and Links columns", out)


if __name__ == "__main__":
    unittest.main()
