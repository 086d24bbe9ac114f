#!/usr/bin/env python3
"""The layering of docs/ARCHITECTURE.md, enforced on the source tree.

Reads the table of components in docs/ARCHITECTURE.md (Component, Library
and Links columns) and fails on:

  * an `#include` of a component's header from a component whose row does
    not link it (the source root is on every include path, so the build
    itself does not stop one), or whose CMakeLists.txt does not link its
    library, though the row does;
  * a `target_link_libraries` in a component's CMakeLists.txt naming the
    library of a component its row does not link;
  * a row whose folder does not exist, whose Library is not defined by that
    folder's CMakeLists.txt, or whose Links names a row not lower in the
    table or a name that is neither a row nor a known third-party library;
  * a folder whose CMakeLists.txt defines a moerr library and that has no
    row (a new component is added to the docs with its library).

Allowed arrows are exactly the component itself and the rows its Links
cell names ("Each row links only rows below it; the table gives the exact
edges"): what a linked component links in turn is not allowed through it.
"all of the above" allows every row above it in the table. Third-party
names in Links (Abseil, LLVM, LibTorch, ...) are not components.

Usage: check_layering.py [--root DIR]   (DIR defaults to the source root)
Exit status: 0 clean, 1 violations (one line each), 2 the table unreadable.
"""

import argparse
import os
import re
import sys

DOC = "docs/ARCHITECTURE.md"
# Link names that are not components: what the project links from outside.
THIRD_PARTY = ("abseil", "llvm", "cap'n proto", "libtorch", "torch", "gloo", "cli11", "zstd", "xxhash")
# Trees that are not components: tests and benchmarks link what they exercise.
NOT_COMPONENTS = ("tests", "bench")
SOURCE_EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".def", ".inc")
# A target the project builds under a moerr name: a library, the command,
# the Python extension, a build step.
TARGET_DEFINITION = re.compile(
    r"\b(?:add_library|add_executable|add_custom_target|pybind11_add_module)\s*\(\s*(_?moerr\w*)")
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?:"([^"\n]+)"|<([^>\n]+)>)', re.M)
LINK_COMMAND = re.compile(r"\btarget_link_libraries\s*\(", re.I)


class TableError(Exception):
    pass


class Row:
    def __init__(self, index, folder, libraries, links_cell, line):
        self.index = index
        self.folder = folder          # "recorder/hooks", no trailing slash
        self.libraries = libraries    # ["moerr_recorder_hooks"]
        self.links_cell = links_cell
        self.line = line
        self.links = set()            # folders of the rows it links


def split_cells(line):
    cells = re.split(r"(?<!\\)\|", line.strip())
    if cells and cells[0] == "":
        cells = cells[1:]
    if cells and cells[-1] == "":
        cells = cells[:-1]
    return [c.strip() for c in cells]


def read_table(root):
    path = os.path.join(root, DOC)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise TableError(f"{DOC}: cannot read it: {e}")
    header = None
    rows = []
    for number, line in enumerate(lines, 1):
        if header is None:
            if line.lstrip().startswith("|"):
                cells = [c.lower() for c in split_cells(line)]
                if {"component", "library", "links"} <= set(cells):
                    header = {name: cells.index(name) for name in ("component", "library", "links")}
            continue
        if not line.lstrip().startswith("|"):
            break
        cells = split_cells(line)
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            continue
        if len(cells) <= max(header.values()):
            raise TableError(f"{DOC}:{number}: a row of the components table has too few cells")
        folder = re.findall(r"`([^`]+)`", cells[header["component"]])
        if len(folder) != 1:
            raise TableError(f"{DOC}:{number}: the Component cell names no `folder/`")
        libraries = re.findall(r"`([^`]+)`", cells[header["library"]])
        rows.append(Row(len(rows), folder[0].strip().strip("/"), libraries, cells[header["links"]], number))
    if header is None:
        raise TableError(f"{DOC}: no table with Component, Library and Links columns")
    if not rows:
        raise TableError(f"{DOC}: the components table has no rows")
    return rows


def link_names(cell):
    """The names a Links cell lists: "support, LLVM Support, Cap'n Proto
    (zstd, xxHash privately)" -> support, LLVM Support, Cap'n Proto, zstd, xxHash."""
    names = []
    for part in re.split(r"[,()]", cell.replace("`", "")):
        part = re.sub(r"\bprivately\b", "", part).strip()
        if part:
            names.append(part)
    return names


def is_third_party(name):
    lowered = name.lower()
    return any(re.search(r"(?<![\w'])" + re.escape(t) + r"(?![\w'])", lowered) for t in THIRD_PARTY)


def resolve_links(rows, problems):
    by_name = {}
    for row in rows:
        by_name[row.folder] = row
        for library in row.libraries:
            by_name[library] = row
            if library.startswith("moerr_"):
                by_name[library[len("moerr_"):]] = row
    for row in rows:
        for name in link_names(row.links_cell):
            if name.lower() == "all of the above":
                row.links.update(r.folder for r in rows[:row.index])
                continue
            target = by_name.get(name.strip("/"))
            if target is not None:
                if target.index >= row.index:
                    problems.append(f"{DOC}:{row.line}: {row.folder}/ links {target.folder}/, "
                                    f"which is not lower in the table")
                row.links.add(target.folder)
            elif not is_third_party(name):
                problems.append(f"{DOC}:{row.line}: {row.folder}/'s Links names '{name}', "
                                f"neither a row of the table nor a third-party library")


def strip_c_comments(text):
    """Comments blanked, line breaks kept (so line numbers hold)."""
    def blank(m):
        s = m.group(0)
        if s.startswith("/"):
            return re.sub(r"[^\n]", " ", s)
        return s
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', blank, text, flags=re.S)


def strip_cmake_comments(text):
    return re.sub(r'"(?:\\.|[^"\\])*"|#[^\n]*',
                  lambda m: m.group(0) if m.group(0).startswith('"') else "", text)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def owner_of(relpath, folders):
    """The component whose folder holds relpath (the longest such folder)."""
    parts = relpath.split("/")
    for i in range(len(parts) - 1, 0, -1):
        prefix = "/".join(parts[:i])
        if prefix in folders:
            return prefix
    return None


def component_files(root, folder, folders):
    base = os.path.join(root, folder)
    for directory, subdirs, files in os.walk(base):
        rel_dir = os.path.relpath(directory, root).replace(os.sep, "/")
        # A nested component (recorder/hooks/ inside recorder/) is its own.
        subdirs[:] = sorted(d for d in subdirs
                            if not d.startswith(".") and f"{rel_dir}/{d}" not in folders)
        for name in sorted(files):
            if name.endswith(SOURCE_EXTENSIONS):
                yield f"{rel_dir}/{name}"


def allowed(row, target):
    return target == row.folder or target in row.links


def reached_through(rows_by_folder, row, target):
    """The direct links through which target is reached transitively, if any."""
    through = []
    for direct in sorted(row.links):
        seen, stack = set(), [direct]
        while stack:
            f = stack.pop()
            if f in seen or f not in rows_by_folder:
                continue
            seen.add(f)
            stack.extend(rows_by_folder[f].links)
        if target in seen:
            through.append(direct)
    return through


def arrow_message(rows_by_folder, row, target):
    message = f"{arrow(row.folder, target)} is not in {DOC}"
    through = reached_through(rows_by_folder, row, target)
    if through:
        message += f" (reached only through {', '.join(through)})"
    return message


def arrow(source, target):
    return f"{source} -> {target}"


def linked_libraries(root, row):
    """Every name the target_link_libraries of row's CMakeLists.txt give."""
    path = os.path.join(root, row.folder, "CMakeLists.txt")
    if not os.path.isfile(path):
        return set()
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip_cmake_comments(f.read())
    names = set()
    for m in LINK_COMMAND.finditer(text):
        close = text.find(")", m.end())
        names.update(re.findall(r"[^\s()]+", text[m.end():close if close >= 0 else len(text)]))
    return names


def check_includes(root, rows, problems):
    folders = {row.folder for row in rows}
    rows_by_folder = {row.folder: row for row in rows}
    for row in rows:
        if not os.path.isdir(os.path.join(root, row.folder)):
            continue
        linked = linked_libraries(root, row)
        for relpath in component_files(root, row.folder, folders):
            try:
                with open(os.path.join(root, relpath), encoding="utf-8", errors="replace") as f:
                    text = strip_c_comments(f.read())
            except OSError as e:
                problems.append(f"{relpath}: cannot read it: {e}")
                continue
            for m in INCLUDE.finditer(text):
                included = m.group(1) or m.group(2)
                if included.startswith("."):
                    joined = os.path.normpath(os.path.join(os.path.dirname(relpath), included))
                    included = joined.replace(os.sep, "/")
                target = owner_of(included, folders)
                if target is None:
                    continue
                if not allowed(row, target):
                    problems.append(f"{relpath}:{line_of(text, m.start())} includes {included}: "
                                    f"{arrow_message(rows_by_folder, row, target)}")
                elif target != row.folder and row.libraries and rows_by_folder[target].libraries and \
                        not linked.intersection(rows_by_folder[target].libraries):
                    problems.append(f"{relpath}:{line_of(text, m.start())} includes {included}: "
                                    f"{row.folder}/CMakeLists.txt does not link "
                                    f"{rows_by_folder[target].libraries[0]}")


def check_links(root, rows, problems):
    rows_by_folder = {row.folder: row for row in rows}
    library_owner = {lib: row.folder for row in rows for lib in row.libraries}
    for row in rows:
        relpath = f"{row.folder}/CMakeLists.txt"
        path = os.path.join(root, relpath)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = strip_cmake_comments(f.read())
        for m in LINK_COMMAND.finditer(text):
            close = text.find(")", m.end())
            if close < 0:
                close = len(text)
            for token in re.finditer(r"[^\s()]+", text[m.end():close]):
                target = library_owner.get(token.group(0))
                if target is None or allowed(row, target):
                    continue
                line = line_of(text, m.end() + token.start())
                problems.append(f"{relpath}:{line} links {token.group(0)}: "
                                f"{arrow_message(rows_by_folder, row, target)}")


def defined_targets(root, folder):
    path = os.path.join(root, folder, "CMakeLists.txt")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        return TARGET_DEFINITION.findall(strip_cmake_comments(f.read()))


def check_folders(root, rows, problems):
    folders = {row.folder for row in rows}
    for row in rows:
        if not os.path.isdir(os.path.join(root, row.folder)):
            problems.append(f"{DOC}:{row.line}: the table names {row.folder}/, which does not exist")
            continue
        defined = defined_targets(root, row.folder)
        for library in row.libraries:
            if library not in defined:
                problems.append(f"{DOC}:{row.line}: {row.folder}/'s library {library} is not defined "
                                f"in {row.folder}/CMakeLists.txt")
    for directory, subdirs, files in os.walk(root):
        rel_dir = os.path.relpath(directory, root).replace(os.sep, "/")
        if rel_dir == ".":
            subdirs[:] = [d for d in subdirs if d not in NOT_COMPONENTS]
        # Hidden folders and build trees (a CMakeCache.txt at their top).
        subdirs[:] = sorted(d for d in subdirs if not d.startswith(".")
                            and not os.path.exists(os.path.join(directory, d, "CMakeCache.txt")))
        if rel_dir == "." or "CMakeLists.txt" not in files or rel_dir in folders:
            continue
        defined = defined_targets(root, rel_dir)
        if defined:
            problems.append(f"{rel_dir}/CMakeLists.txt defines {', '.join(defined)}, but {rel_dir}/ "
                            f"has no row in {DOC}")


def check(root):
    """The problems of the tree at root, one line each."""
    rows = read_table(root)
    problems = []
    folders = [row.folder for row in rows]
    for folder in sorted({f for f in folders if folders.count(f) > 1}):
        problems.append(f"{DOC}: {folder}/ has more than one row")
    resolve_links(rows, problems)
    check_folders(root, rows, problems)
    check_includes(root, rows, problems)
    check_links(root, rows, problems)
    return rows, problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--root", default=default_root, help="the source root (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        rows, problems = check(args.root)
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    if problems:
        arrows = {}
        for problem in problems:
            m = re.search(r": (\S+ -> \S+) is not in ", problem)
            if m:
                arrows[m.group(1)] = arrows.get(m.group(1), 0) + 1
        print(f"{len(problems)} layering problem(s) against {DOC}")
        for a in sorted(arrows):
            print(f"  {a}: {arrows[a]} include(s) or link(s)")
        print("An arrow the design intends goes into the table's Links column (and the library's "
              "target_link_libraries); otherwise the include or link goes.")
        return 1
    edges = sum(len(row.links) for row in rows)
    print(f"layering: {len(rows)} components, {edges} allowed arrows, no include or link outside them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
