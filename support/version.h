// moerr's version, "x.y.z". It is set in one place, project(moerr VERSION ...)
// in the top-level CMakeLists.txt, and compiled into one generated file
// (version.cpp.in), so that a new version rebuilds that file alone.
#pragma once

namespace moerr {

const char* Version();

}  // namespace moerr
