#!/bin/sh
# run.sh BUILD_DIR SECONDS: runs every libFuzzer harness in BUILD_DIR/fuzz for
# SECONDS each, starting from its seed corpus (copied to a scratch directory so
# the committed corpus stays small). Exits non-zero if any harness crashes;
# crash inputs are left in BUILD_DIR/fuzz/artifacts/<name>/.
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR SECONDS" >&2
    exit 2
fi
build=$1
seconds=$2
here=$(cd "$(dirname "$0")" && pwd)
status=0
for name in fuzz_frame fuzz_method fuzz_table fuzz_properties fuzz_http fuzz_heartbeat fuzz_json fuzz_password; do
    bin="$build/fuzz/$name"
    if [ ! -x "$bin" ]; then
        echo "run.sh: $bin not built" >&2
        exit 2
    fi
    work="$build/fuzz/work/$name"
    artifacts="$build/fuzz/artifacts/$name"
    mkdir -p "$work" "$artifacts"
    cp "$here/corpus/$name"/* "$work"/ 2>/dev/null || true
    echo "== $name: ${seconds}s"
    if "$bin" -max_total_time="$seconds" -print_final_stats=1 -max_len=65536 \
        -artifact_prefix="$artifacts/" "$work" >"$build/fuzz/$name.log" 2>&1; then
        grep -E "stat::number_of_executed_units|Done" "$build/fuzz/$name.log" | tail -2
    else
        echo "FAILED: $name (see $build/fuzz/$name.log, artifacts in $artifacts)" >&2
        tail -30 "$build/fuzz/$name.log" >&2
        status=1
    fi
done
exit $status
