# The Debian package `make package` builds with CPack: moerr_VERSION_ARCH.deb,
# the install rules under /usr (the command, the Python package in
# /usr/lib/python3/dist-packages, the docs). It holds moerr's files only and
# depends on the Debian packages that ship the shared libraries the command
# and the extension load; tests/install/package_test.sh checks that list
# against what they need (`dpkg -S` on what `ldd` resolves them to).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME moerr)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "Seed f0fbead7 maintainers <maintainers@users.noreply.a-seed-f0fbead7.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "debugger for failing training steps of Mixture-of-Experts models")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "moerr records a failing training step of a Mixture-of-Experts language\n"
  "model into a compact, crash-safe bundle, then inspects, replays, bisects,\n"
  "diffs and lints it, and maps it onto a proxy model with fewer experts.\n"
  "This package holds the moerr command and the `moerr` Python package for\n"
  "PyTorch training loops.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
# Removes the Python bytecode the modules got when imported as root.
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${CMAKE_CURRENT_LIST_DIR}/prerm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

# The libraries' packages, with the versions the binaries need, come from
# dpkg-shlibdeps (dpkg-dev) run on the packaged binaries; Python and torch,
# which the Python package imports, are listed here.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
if(TARGET _moerr)
  # The extension is built for this minor version of Python.
  string(REPLACE "." ";" moerr_python_version "${MOERR_PYTHON_VERSION}")
  list(GET moerr_python_version 0 moerr_python_major)
  list(GET moerr_python_version 1 moerr_python_minor)
  math(EXPR moerr_python_next "${moerr_python_minor} + 1")
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3 (>= ${MOERR_PYTHON_VERSION}), \
python3 (<< ${moerr_python_major}.${moerr_python_next}), python3-torch")
endif()
include(CPack)
