# The appliance image: `make image` builds it, `make image-test` boots it under qemu and checks it.
# Included from the top-level Makefile; also usable alone: `make -f image/image.mk image`.
# docs/appliance.md explains what the image holds and what the test checks.

PY ?= .venv/bin/python
IMAGE_WHEELHOUSE := image/wheelhouse
# Built aside in a git-ignored directory and swapped in whole: a failed download never leaves a
# half-filled wheelhouse for mkosi.
IMAGE_WHEELHOUSE_TMP := mkosi.builddir/wheelhouse.new
IMAGE_RAW := mkosi.output/mediaplane.raw
# Extra arguments for image/test_image.py, e.g. IMAGE_TEST_ARGS=--reboot (adds a reset and a
# second boot: the wizard must survive it).
IMAGE_TEST_ARGS ?=
# Free disk the image build needs (tools tree, package cache, image, initrd): measured ~6 GB.
IMAGE_MIN_FREE_GB ?= 10

.PHONY: image image-deps image-wheelhouse image-test image-test-if-space image-clean

## make image-deps: installs mkosi 24 (bookworm-backports), qemu and OVMF when missing
image-deps:
	bash image/ensure-image-debs.sh

## make image-wheelhouse: the project's own wheel plus its pinned runtime dependencies
image-wheelhouse:
	# The wheel is built with the project's venv (the top-level Makefile's `venv` target).
	test -x $(PY) || $(MAKE) -f $(firstword $(MAKEFILE_LIST)) venv
	rm -rf $(IMAGE_WHEELHOUSE_TMP) && mkdir -p $(IMAGE_WHEELHOUSE_TMP)
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(IMAGE_WHEELHOUSE_TMP) .
	# Runtime dependencies only, at requirements.lock's versions, as binary wheels for the
	# image's Python (3.11 on glibc 2.36, like the host); pip's cache makes this cheap after once.
	$(PY) -m pip download -q --only-binary=:all: -c requirements.lock \
		-d $(IMAGE_WHEELHOUSE_TMP) $(IMAGE_WHEELHOUSE_TMP)/mediaplane-*.whl
	rm -rf $(IMAGE_WHEELHOUSE) && mv $(IMAGE_WHEELHOUSE_TMP) $(IMAGE_WHEELHOUSE)

# What the image is built from: a change to any of these rebuilds it.
IMAGE_INPUTS := mkosi.conf pyproject.toml requirements.lock tools/manpages.py tools/npm-assets.json $(shell find mkosi.conf.d image appliance services cli \
	-type f -not -path 'image/wheelhouse*' -not -name '*.pyc' 2>/dev/null)

## make image: builds mkosi.output/mediaplane.raw (cold ~3 min, incremental ~1 min)
image: $(IMAGE_RAW)

$(IMAGE_RAW): $(IMAGE_INPUTS)
	$(MAKE) -f $(firstword $(MAKEFILE_LIST)) image-deps man image-wheelhouse
	# The dashboard's pinned npm files (a no-op when build/vendor/npm already holds them).
	$(PY) -m tools.vendor_npm
	@start=$$(date +%s); \
	mkosi --force build || exit 1; \
	end=$$(date +%s); \
	echo "image: built $(IMAGE_RAW) in $$((end - start)) s, $$(du -h --apparent-size $(IMAGE_RAW) | cut -f1) apparent, $$(du -h $(IMAGE_RAW) | cut -f1) on disk"

## make image-test: boots the image under qemu (TCG) and checks the edge through a forwarded port
image-test: image-deps image
	python3 image/test_image.py --image $(IMAGE_RAW) $(IMAGE_TEST_ARGS)

## make image-test-if-space: image-test when the disk has room for a build, else one skip line
# (what `make test` calls: a CI machine with less than $(IMAGE_MIN_FREE_GB) GB free skips it).
image-test-if-space:
	@free=$$(df -P -BG . | awk 'NR == 2 { sub("G", "", $$4); print $$4 }'); \
	if [ "$$free" -ge $(IMAGE_MIN_FREE_GB) ]; then \
		$(MAKE) -f $(firstword $(MAKEFILE_LIST)) image-test; \
	else \
		echo "image-test: SKIPPED: $$free GB free on $$(df -P . | awk 'NR == 2 {print $$6}'), the image build needs $(IMAGE_MIN_FREE_GB) GB"; \
	fi

image-clean:
	rm -rf mkosi.output mkosi.cache mkosi.builddir $(IMAGE_WHEELHOUSE) $(IMAGE_WHEELHOUSE_TMP)
