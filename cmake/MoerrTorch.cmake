# LibTorch is the one inside the torch wheel of MOERR_PYTHON's environment
# (requirements.txt pins it; `make deps` makes the environment): found
# through torch.utils.cmake_prefix_path, so the command, the extension and
# the Python side run one torch. `-I` keeps a build frontend's isolated
# environment (pip's, for `pip install .`) from hiding the target
# environment's torch: MOERR_PYTHON is that environment's interpreter.
if(NOT MOERR_PYTHON AND SKBUILD)
  set(MOERR_PYTHON ${Python_EXECUTABLE})  # the interpreter pip builds for
endif()
if(NOT MOERR_PYTHON)
  message(FATAL_ERROR "MOERR_PYTHON is not set: pass -DMOERR_PYTHON=/path/to/venv/bin/python, the Python "
                      "whose torch moerr builds against (`make build` passes the project's environment)")
endif()
execute_process(
  COMMAND ${MOERR_PYTHON} -I -c
    "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE moerr_torch_probe OUTPUT_STRIP_TRAILING_WHITESPACE
  ERROR_VARIABLE moerr_torch_error RESULT_VARIABLE moerr_torch_rc)
if(NOT moerr_torch_rc EQUAL 0)
  message(FATAL_ERROR "cannot import torch with ${MOERR_PYTHON}: ${moerr_torch_error}\n"
                      "moerr builds against the torch of a Python environment: `make deps` makes the project's "
                      "(requirements.txt), or install a supported torch (README, Install) into yours")
endif()
string(REPLACE "\n" ";" moerr_torch_probe "${moerr_torch_probe}")
list(GET moerr_torch_probe 0 MOERR_TORCH_PREFIX)
list(GET moerr_torch_probe 1 MOERR_TORCH_VERSION)
list(GET moerr_torch_probe 2 moerr_torch_cxx11_abi)
# The supported range (README, Install): torch 2.4 to 2.x. 2.4 is where the
# c10d ops, the Flight Recorder dump format and the new libstdc++ ABI of the
# wheels that moerr reads meet.
if(MOERR_TORCH_VERSION VERSION_LESS 2.4 OR MOERR_TORCH_VERSION VERSION_GREATER_EQUAL 3)
  message(FATAL_ERROR "torch ${MOERR_TORCH_VERSION} (${MOERR_PYTHON}) is outside moerr's supported range, "
                      "2.4 <= torch < 3")
endif()
# Debian's C++ libraries (Abseil, Cap'n Proto, LLVM) use the new libstdc++
# ABI; a LibTorch of the old one would link and then fail on every
# std::string crossing the boundary.
if(NOT moerr_torch_cxx11_abi EQUAL 1)
  message(FATAL_ERROR "torch ${MOERR_TORCH_VERSION} (${MOERR_PYTHON}) was built with the old libstdc++ ABI "
                      "(_GLIBCXX_USE_CXX11_ABI=0), but moerr's other C++ libraries use the new one: install a "
                      "torch wheel built with the new ABI (every PyPI wheel for Linux since 2.7)")
endif()
list(APPEND CMAKE_PREFIX_PATH ${MOERR_TORCH_PREFIX})
# The wheel's TorchConfig looks for CUDA when torch is a CUDA build; moerr
# calls no CUDA itself and links LibTorch's CPU and CUDA libraries as they are.
find_package(Torch REQUIRED CONFIG)
message(STATUS "moerr builds against torch ${MOERR_TORCH_VERSION} from ${MOERR_TORCH_PREFIX}")
# The directory of libtorch*.so, for RPATHs.
get_filename_component(MOERR_TORCH_LIB_DIR "${MOERR_TORCH_PREFIX}/../../lib" ABSOLUTE)
# The wheel's libtorch.so and libtorch_cpu.so export their own copies of
# std::filesystem (statically linked from an older libstdc++, with another
# ABI): a moerr binary that named libtorch before libstdc++.so.6 bound its
# std::filesystem::remove_all to torch's and jumped to null. libstdc++
# first in every link's DT_NEEDED makes the dynamic linker resolve the
# standard library to Debian's.
add_link_options(LINKER:--push-state,--no-as-needed -lstdc++ LINKER:--pop-state)
