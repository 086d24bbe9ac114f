# moerr: thin entry points. Everything real lives in CMake and the scripts.
#   make demo   install what is missing, build, run the end-to-end demo
#   make test   install what is missing, build, run every test
#   make bench  install what is missing, build, run the benchmarks
#   make install PREFIX=/usr/local   build, then install moerr under PREFIX
#   make package  build, then the Debian package BUILD/moerr_VERSION_ARCH.deb
.PHONY: deps build build-asan demo test bench install package clean

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
PYTHON     ?= /usr/bin/python3
FUZZ_SECONDS ?= 60
PREFIX     ?= /usr/local

# Debian packages moerr needs (DESIGN.md, "Dependencies").
PACKAGES = cmake ninja-build g++ clang libclang-rt-14-dev pkg-config dpkg-dev \
  libtorch-dev libcapnp-dev capnproto libzstd-dev llvm-dev libabsl-dev \
  libgtest-dev libbenchmark-dev libxxhash-dev libcli11-dev libgloo-dev \
  python3-torch python3-numpy python3-dev pybind11-dev python3-pytest \
  chromium

SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)

deps:
	@missing=$$(for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# Configured again when this file (and so the flags) changes.
$(BUILD)/build.ninja: Makefile
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release
	touch $@

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The sanitizer suite (formats/, diff/, report/, the model, the recorder,
# replayer, lint and proxy) under ASan+UBSan with clang, plus the libFuzzer target.
$(ASAN_BUILD)/build.ninja: Makefile
	CC=clang CXX=clang++ cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMOERR_SANITIZER_SUITE=ON -DMOERR_SANITIZE=ON -DMOERR_FUZZ=ON -DMOERR_FUZZ_SECONDS=$(FUZZ_SECONDS)
	touch $@

build-asan: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS)

demo: build
	$(BUILD)/tools/moerr demo

# The robustness suite under sanitizers first, then every test of the main
# build; the output ends with ctest's summary of the main build.
test: build build-asan
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	PYTHON=$(PYTHON) BUILD=$(BUILD) bench/run_all.sh

# The command in PREFIX/bin, the Python package where /usr/bin/python3 finds
# it (PREFIX/lib/python3/dist-packages for /usr, PREFIX/lib/python3.X/
# dist-packages otherwise), the docs in PREFIX/share/doc/moerr.
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# CPack (packaging/debian.cmake): the same files under /usr, depending on
# Debian's packages of the libraries they load.
package: build
	cd $(BUILD) && cpack

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
