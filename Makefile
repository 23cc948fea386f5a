# A thin front door: every target forwards to CMake (the one build system).
#   make           release build, binaries in build/ (build/quayd)
#   make test      ASan+UBSan build in build-asan/, then the whole CTest suite
#   make fuzz      libFuzzer harnesses (clang) in build-fuzz/, each run briefly
#   make codegen   regenerate the AMQP codec from tools/amqp-protocol.json
#   make bench     quay against RabbitMQ, side by side (see bench/README.md)
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 20

.PHONY: all release test asan fuzz codegen bench clean

all: release

release:
	cmake --preset release >/dev/null
	cmake --build build -j $(JOBS)

asan:
	cmake --preset asan-ubsan >/dev/null
	cmake --build build-asan -j $(JOBS)

test: asan
	cd build-asan && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

fuzz:
	cmake --preset fuzz >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target fuzz_frame fuzz_method fuzz_table fuzz_properties fuzz_http \
		fuzz_heartbeat fuzz_json fuzz_password
	tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

codegen:
	/usr/bin/python3 tools/codegen.py

bench: release
	bench/run.sh

clean:
	rm -rf build build-asan build-debug build-fuzz
