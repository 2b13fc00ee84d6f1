# zerone: two commands do everything on a fresh Debian machine.
#   make train   set-up (missing apt packages) + build + train the default model
#   make test    set-up + build + the whole test suite
#   make interop zerone against PyPI's transformers, tokenizers, sentencepiece, tensorboard (not in `make test`)
#   make install build/zerone to $(DESTDIR)$(PREFIX)/bin (PREFIX=/usr/local by default)
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
PREFIX ?= /usr/local
DESTDIR ?=

.PHONY: all setup configure build train test bench interop install clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: setup $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

train: build
	$(BUILD_DIR)/zerone train

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# Interoperability with tools from the Python package index (not Debian; not part of `make test`):
# every tests/interop/*.sh against the peers' environment (bench/peers/setup.sh): TensorBoard reads
# zerone's event files, transformers loads its Hugging Face exports and writes what it trains from,
# tokenizers/transformers/sentencepiece encode as it does. One ok/FAIL line per check; fails if any fails.
interop: build
	@py=$$(bash bench/peers/setup.sh) || { echo "interop: bench/peers/setup.sh failed"; exit 1; }; \
	py=$$(echo "$$py" | tail -n 1); fail=0; for t in tests/interop/*.sh; do \
	  echo "== $$t"; HF_HUB_OFFLINE=1 bash $$t $(BUILD_DIR)/zerone $$py || { echo "FAIL $$t"; fail=1; }; \
	done; \
	if [ $$fail = 0 ]; then echo "interop: all passed"; else echo "interop: FAILED"; fi; exit $$fail

bench: build
	bash bench/run_all.sh

# Installs the program only (it links the shared libraries the set-up step installed); builds it
# first when it is not built, so `make && sudo make install` does not build as root.
install:
	@test -x $(BUILD_DIR)/zerone || $(MAKE) build
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BUILD_DIR)/zerone $(DESTDIR)$(PREFIX)/bin/zerone

clean:
	rm -rf $(BUILD_DIR)
