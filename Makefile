# moerr: thin entry points. Everything real lives in CMake and the scripts.
#   make demo   install what is missing, build, run the end-to-end demo
#   make test   install what is missing, build, run every test
#   make bench  install what is missing, build, run the benchmarks
#   make install PREFIX=/usr/local   build, then install the command under PREFIX
#   make wheel    the wheel `pip install` takes, in BUILD/wheel (README, Install)
.PHONY: deps build build-asan demo test bench install wheel clean

BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
FUZZ_SECONDS ?= 30
PREFIX     ?= /usr/local

# Debian packages moerr needs: the toolchain and the C++ libraries. The
# Python side, torch (and its LibTorch) included, is requirements.txt, in
# the environment packaging/venv.sh makes outside the clone.
PACKAGES = cmake ninja-build ccache g++ clang libclang-rt-14-dev pkg-config \
  libcapnp-dev capnproto libzstd-dev llvm-dev libabsl-dev \
  libgtest-dev libbenchmark-dev libxxhash-dev libcli11-dev libgloo-dev \
  python3-dev python3-venv chromium
# The interpreter of that environment (made by `deps` when missing).
PYTHON = $$(packaging/venv.sh)/bin/python

SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)

deps:
	@missing=$$(for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi
	@packaging/venv.sh > /dev/null

# Configured again when this file (and so the flags) or the environment's
# pins change. Its compiles go through a ccache inside the tree, which the
# wheel test's build (a third tree of the same sources and flags) reuses.
$(BUILD)/build.ninja: Makefile requirements.txt
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOERR_PYTHON=$(PYTHON) \
	  -DMOERR_CCACHE_DIR=$(abspath $(BUILD))/ccache
	touch $@

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# The sanitizer suite (formats/, diff/, report/, the model, the recorder,
# replayer, lint and proxy) under ASan+UBSan with clang, plus the libFuzzer target.
$(ASAN_BUILD)/build.ninja: Makefile requirements.txt
	CC=clang CXX=clang++ cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOERR_PYTHON=$(PYTHON) \
	  -DMOERR_SANITIZER_SUITE=ON -DMOERR_SANITIZE=ON -DMOERR_FUZZ=ON -DMOERR_FUZZ_SECONDS=$(FUZZ_SECONDS)
	touch $@

build-asan: deps $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) -j $(JOBS)

demo: build
	$(BUILD)/tools/moerr demo

# The robustness suite under sanitizers first, then every test of the main
# build; the output ends with ctest's summary of the main build.
# ctest runs JOBS tests at once, so each test's LibTorch gets one intra-op
# thread: OpenMP's threads spin while they wait, and two tests of two
# threads each on two cores ran five times slower.
# Under ASan the RL step's numerics-only tests (GrpoTest's warm-up,
# determinism, faults and batch shapes: about a minute each there) repeat
# code paths its healthy, overflowing and micro-batched steps already run
# under the sanitizers; they run in the main build.
ASAN_SKIP = ^GrpoTest\.(Warmup|SameSeed|ExpertOverflow|BadKernel|LogprobPrecision|RouterCollapse|SkipUpdate|ResponseTokens)
test: build build-asan
	cd $(ASAN_BUILD) && OMP_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS) -E '$(ASAN_SKIP)'
	cd $(BUILD) && OMP_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS)

bench: build
	PYTHON=$(PYTHON) BUILD=$(BUILD) bench/run_all.sh

# The command in PREFIX/bin and the op references in PREFIX/share/moerr;
# the Python package installs with pip (make wheel).
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# The wheel of the command and the package, built against the environment's
# torch (pyproject.toml): `pip install BUILD/wheel/moerr-*.whl` beside it.
wheel: deps
	$(PYTHON) -m build --wheel --no-isolation --outdir $(BUILD)/wheel .

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(BUILD)-wheel
