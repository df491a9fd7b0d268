# Mediaplane: the two set-up commands are `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test check lint bench nmos-conformance debs venv clean man

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

debs:
	bash tools/ensure-debs.sh

## make vendor: pinned npm files (hls.js...) into build/vendor/npm, checked against
# tools/npm-assets.json (tools/vendor_npm.py; nothing to do when they are already there)
.PHONY: vendor
vendor: venv
	$(PY) -m tools.vendor_npm

## make man: the man pages mp(1) and mp-edge(1) into build/man, from the CLI definitions
# (tools/manpages.py); the image build runs it and installs them. Read one: man -l build/man/mp.1
man: venv
	$(PY) -m tools.manpages --out build/man

## make run: the all-in-one local demo (mp-edge on 127.0.0.1:8080 with a demo flow)
run: debs venv vendor
	$(PY) -m tools.demo

## make test: installs what the tests need, boots the image under qemu, runs the whole suite
# Three workers, one test file each at a time (module fixtures stay per file): most tests wait
# on real processes and sockets, so on two cores a third file fills the waits (two workers:
# 23.2 min for 3,225 tests; see the closing note of issue 20 for three). Beside them, the tests
# that make network namespaces run in a namespace of their own, away from the browser tests
# (tools/run-tests.sh says why). `make test ARGS="tests/e2e -x"` narrows both parts.
# The image boot test runs first so that pytest's summary is the last line; the Debian check
# runs again after it because mkosi's backports install can remove packages (chromium).
test: debs venv vendor
	$(MAKE) image-test-if-space
	bash tools/ensure-debs.sh
	bash tools/run-tests.sh $(ARGS)

lint: venv
	$(VENV)/bin/ruff check appliance services cli tests bench tools
	$(VENV)/bin/ruff format --check appliance services cli tests bench tools

## make check: lint, type check and the tests
check: lint
	$(VENV)/bin/mypy
	$(MAKE) test

## make bench: benchmarks against real peers, run on demand (not in CI)
bench: debs venv
	$(PY) -m bench

## make nmos-conformance: AMWA nmos-testing (IS-04-01, IS-05-01, IS-05-02) against a real
## mp-edge in a network namespace, on demand (needs root and local snapshots of the AMWA
## repositories, NMOS_MIRROR; not in CI, which cannot reach GitHub). docs/nmos.md "Conformance".
nmos-conformance: debs venv
	bash tools/nmos_conformance.sh

clean:
	rm -rf $(VENV) build *.egg-info

# make image / make image-test (the appliance image; docs/appliance.md). Last, so that the
# default goal stays the first target above.
include image/image.mk
