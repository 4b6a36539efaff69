# bytescale: the few commands a person needs. The build itself is CMake (CMakeLists.txt).
#   make deps    install the Debian packages (as root; otherwise prints how), the Python environment
#                (.venv, from requirements.txt) and the tokenizer data (data/tiktoken)
#   make         build the library (static + shared) and the `bytescale` command into build/
#   make test    run the whole test suite (ctest) on the Release build (checking the environment and
#                the tokenizer data first, as make asan does)
#   make asan    the C tests again under ASan + UBSan (build-asan/); CI runs it after make test
#   make demo    the main job on the bundled default
#   make bench   the benchmarks, as tables
#   make cuda-check   every CUDA C file compiles with nvcc (the project holds none yet, and says so)
#   make venv    the Python environment alone: .venv made with /usr/bin/python3, requirements.txt in it
#   make python  the bytescale Python package installed into that environment
#   make install PREFIX=DIR   the library (shared + static), public headers, bytescale.pc, the CMake
#                package and the command into DIR (default /usr/local); README.md, "Using the library"
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
DATA       ?= data
PREFIX     ?= /usr/local

APT_PACKAGES = build-essential cmake pkg-config libopenmpi-dev openmpi-bin libopenblas-dev libcjson-dev libyajl-dev \
               libglpk-dev libcmocka-dev zlib1g-dev libzstd-dev libutf8proc-dev libpcre2-dev gnuplot-nox golang-1.19-src \
               libpython3.11-testsuite unicode-data zstd python3-venv python3-pip

export OMPI_ALLOW_RUN_AS_ROOT = 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM = 1
export OPENBLAS_NUM_THREADS = 1

# The Python environment: a venv made with Debian's interpreter whatever `python3` comes first on the
# PATH (pyenv and the like), holding exactly requirements.txt (torch==2.13.0, numpy, pytest, tiktoken,
# ...). Every Python test runs in it (CMakeLists.txt, BS_PYTHON). A stamp beside the venv records the
# requirements it was made from: a changed requirements.txt installs again. pip compiles every module
# to bytecode as it installs, and that must stay: the tests run with PYTHONDONTWRITEBYTECODE=1, so a
# module without its .pyc is compiled again by every process that imports it (tried: torch's import
# then made the Python tests twice as slow).
PYTHON       ?= /usr/bin/python3
VENV         ?= .venv
PYSRC        ?= python
REQUIREMENTS ?= requirements.txt

.PHONY: all deps venv tokenizer build install python test test-fast asan demo bench cuda-check clean

all: build

deps:
	@if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES); \
	else \
	  echo "not root: run  sudo apt-get install -y $(APT_PACKAGES)"; \
	fi
	@$(MAKE) --no-print-directory venv tokenizer

venv: $(VENV)/.requirements

$(VENV)/.requirements: $(REQUIREMENTS)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null || \
	  { echo "make venv: $(PYTHON) is not Python 3.9 or later (give PYTHON=/path/to/python3)" >&2; exit 1; }
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || \
	  { echo "make venv: $(PYTHON) cannot make a venv: apt-get install python3-venv (make deps does), or give PYTHON= another interpreter" >&2; exit 1; }
	@if [ -f $(VENV)/pyvenv.cfg ] && ! grep -qx "home = $$(dirname $(PYTHON))" $(VENV)/pyvenv.cfg; then \
	  echo "make venv: $(VENV) was made by another interpreter ($$(grep '^home' $(VENV)/pyvenv.cfg)): remove it, or give VENV=another directory" >&2; exit 1; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --no-cache-dir -r $(REQUIREMENTS)
	@cp $(REQUIREMENTS) $@
	@$(VENV)/bin/python -c 'import torch, numpy; print("$(VENV): torch", torch.__version__, "numpy", numpy.__version__)'

# tiktoken's rank files, each checked against its published sha256 every time (a corrupted one stops
# the run), and tiktoken's encodings for the tokenizer tests to compare with (scripts/tokenizer_data.sh)
tokenizer: venv
	@./scripts/tokenizer_data.sh $(DATA) $(VENV)

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release || { rm -f $(BUILD)/CMakeCache.txt; exit 1; }

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

# cmake --install with the prefix given here: the installed bytescale.pc and CMake package locate
# everything relative to themselves, so any PREFIX works without reconfiguring
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# the package copies the library it is built with: $BYTESCALE_LIB when set, else this build's. pip is
# given the package's absolute path: it reads a bare `python` (PYSRC's default) as a package to download.
python: build venv
	BYTESCALE_LIB=$${BYTESCALE_LIB:-$(abspath $(BUILD))/libbytescale.so.0} \
	  $(VENV)/bin/python -m pip install --no-index --no-build-isolation --no-deps --no-cache-dir --quiet $(abspath $(PYSRC))
	@cd / && $(abspath $(VENV))/bin/python -c 'import bytescale, numpy; print("$(VENV): bytescale", bytescale.__version__, "from", bytescale.library_path, "with numpy", numpy.__version__)'

$(ASAN_BUILD)/Makefile:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DBS_SANITIZE=ON -DBS_NATIVE=ON || \
	  { rm -f $(ASAN_BUILD)/CMakeCache.txt; exit 1; }

# the test targets make the environment and the tokenizer data first (the Python tests run in the
# environment; the tokenizer cases skip without the data, saying so)
asan: $(ASAN_BUILD)/Makefile tokenizer
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -LE slow

test: build tokenizer
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# the old name of make test, from when make test also ran the sanitizer pass
test-fast: test

demo: build
	./scripts/demo.sh $(BUILD)

bench: build
	./scripts/bench.sh $(BUILD)

# every CUDA C file of the project compiles with nvcc (none yet: it says so); nothing runs
cuda-check:
	./scripts/cuda_check.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
