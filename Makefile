# From PyTorch to Machine Code: the two commands.
#
#   make         set up everything (virtual environment, pinned packages, LIBXSMM, every
#                stage built and installed), then run the tour: every stage checked and
#                timed against torch.nn.Linear
#   make test    the same set-up (quick when already done), then every stage's tests and
#                every notebook under pytest --nbval (timing cells timed briefly: EML_QUICK_TIMING)
#
# Other targets: setup, tour, notebooks (re-execute them in place), clean.
# A stage is any folder named NN_something; `make` builds each one whose files changed.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
STAMPS      := .stamps
STAGES      := $(sort $(wildcard [0-9][0-9]_*))
NOTEBOOKS   := $(sort $(wildcard notebooks/*.ipynb))

# The set-up builds two stages at a time (JOBS=1 for one by one): most C++ stages are a single
# translation unit, which one compiler process builds on one core, so one build alone leaves the
# second core of a 2-core machine idle. Progress lines interleave; each names its stage. Only the
# set-up runs in parallel: the tour and the tests time and run one thing at a time (two pytest
# workers on 2 cores ran slower than one, their OpenMP threads contending).
JOBS        ?= 2

# ninja (installed into the venv) must be on PATH for parallel, incremental C++ builds.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# No debug information in the extensions `make` builds (and the install routes the tests build):
# Python's own flags (sysconfig's CFLAGS: -DNDEBUG -g -fwrapv -O3 -Wall ...) carry -g, and for a
# translation unit that includes torch's headers, -g costs a third to a half of the compile time
# (measured on a 2-core Zen 3: README) and makes the modules several times larger (stage 08's:
# 8108776 bytes against 946232, 16's README). setuptools takes CFLAGS from the environment in
# place of Python's, so CFLAGS is Python's flags followed by -g0 (the last -g wins); one set on make's
# command line or in the environment replaces it. A stage built by hand (pip install
# --no-build-isolation ./NN_stage, or setup.py install) keeps Python's flags, -g included: that is
# the build to debug.
ifeq ($(origin CFLAGS),undefined)
CFLAGS := $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_config_var("CFLAGS") or "")') -g0
endif
export CFLAGS
# Deprecation warnings from setuptools would bury the progress lines.
export PYTHONWARNINGS := ignore

.PHONY: all setup stamps tour test notebooks clean
all: tour

setup:
	@start=$$(date +%s); $(MAKE) --no-print-directory --jobs=$(JOBS) stamps \
	    && echo "==> set-up done: $(words $(STAGES)) stage(s) installed in $(VENV) ($$(( $$(date +%s) - start )) s)"

# Build order: the stages whose C++ is one translation unit (or none) first, those with several
# last. One unit is one compiler on one core; ninja compiles a stage's several units side by side.
# So the builds still running at the end can use both cores, instead of one single-unit stage
# finishing alone on one (stage 17, the last by number, would).
units = $(words $(wildcard $(1)/src/*.cpp $(1)/src/*.cu))
ONE_UNIT    := $(foreach stage,$(STAGES),$(if $(filter 0 1,$(call units,$(stage))),$(stage)))
BUILD_ORDER := $(ONE_UNIT) $(filter-out $(ONE_UNIT),$(STAGES))

stamps: $(STAMPS)/libxsmm $(STAMPS)/common $(BUILD_ORDER:%=$(STAMPS)/%)

# 1. The virtual environment with the pinned packages (torch 2.13.0: the CPU build where pip has it; README).
$(STAMPS)/venv: requirements.txt
	@mkdir -p $(STAMPS)
	@echo "==> creating $(VENV) and installing requirements.txt"
	@if [ -e $(VENV) ] && ! $(PY) -m pip --version >/dev/null 2>&1; then \
	    echo "    $(VENV) has no working pip (a venv that failed half-way?): creating it again"; \
	    rm -rf $(VENV); \
	fi
	@if [ ! -e $(VENV) ] && ! $(PYTHON) -m venv $(VENV); then \
	    rm -rf $(VENV); \
	    echo "'$(PYTHON) -m venv' failed. On Debian/Ubuntu the system Python needs its venv package:"; \
	    echo "    sudo apt-get install -y python3-venv"; \
	    exit 1; \
	fi
	@start=$$(date +%s); $(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt \
	    && echo "    $(VENV): done in $$(( $$(date +%s) - start )) s"
	@touch $@

# 2. LIBXSMM for the stages on its kernels (06, 07, 08, 16, 17): Debian's libxsmm-dev (headers and static libraries).
$(STAMPS)/libxsmm:
	@mkdir -p $(STAMPS)
	@if [ -f /usr/include/libxsmm.h ]; then \
	    echo "==> LIBXSMM found: /usr/include/libxsmm.h"; \
	elif [ "$$(id -u)" = 0 ]; then \
	    echo "==> installing LIBXSMM: apt-get install -y libxsmm-dev"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libxsmm-dev >/dev/null; \
	else \
	    echo "LIBXSMM is missing (/usr/include/libxsmm.h). Install it with:"; \
	    echo "    sudo apt-get install -y libxsmm-dev"; \
	    exit 1; \
	fi
	@touch $@

# 3. common/ and each stage, rebuilt when one of its files changes.
$(STAMPS)/common: $(STAMPS)/venv $(shell find common -type f -not -path '*/build/*' -not -path '*.egg-info*' -not -path '*/tests/*' -not -name '*.pyc')
	@echo "==> installing common/"
	@$(PY) -m pip install --quiet --no-build-isolation ./common
	@touch $@

# True (exit 0) when this torch is a CUDA build that sees a GPU.
export CUDA_CHECK := import torch, sys; sys.exit(not (torch.version.cuda and torch.cuda.is_available()))

# Each stage is installed after common/ (order only: a change to common/ rebuilds no stage),
# with tools/run-with-progress.sh, which prints the elapsed time while a C++ build runs. A stage
# whose setup.py builds a CUDAExtension needs a CUDA build of torch and a GPU: where there is none
# (torch's CPU build, as the README sets it up), it is skipped with one line.
define stage_rule
$(STAMPS)/$(1): $(STAMPS)/venv $(STAMPS)/libxsmm $(shell find $(1) -type f -not -path '*/build/*' -not -path '*.egg-info*' -not -path '*/tests/*' -not -name '*.pyc') | $(STAMPS)/common
	@if grep -q CUDAExtension $(1)/setup.py && ! $(PY) -c "$$$$CUDA_CHECK"; then \
	    echo "==> skipping $(1): it builds CUDA kernels, and this torch has no CUDA build or sees no GPU"; \
	else \
	    echo "==> building and installing $(1)"; \
	    tools/run-with-progress.sh $(1) $(PY) -m pip install --quiet --no-build-isolation ./$(1); \
	fi
	@touch $$@
endef
$(foreach stage,$(STAGES),$(eval $(call stage_rule,$(stage))))

tour: setup
	@$(PY) -m eml.common.tour

test: setup
	@EML_QUICK_TIMING=1 $(PY) -m pytest

notebooks: setup
	@for nb in $(NOTEBOOKS); do echo "==> executing $$nb"; \
	    $(PY) -m jupyter nbconvert --to notebook --execute --inplace $$nb || exit 1; done

clean:
	rm -rf $(STAMPS) $(VENV) common/build */build */*.egg-info common/*.egg-info
