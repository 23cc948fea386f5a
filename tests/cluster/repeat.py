"""Runs one test of a cluster test script many times in one cluster, to
catch what fails once in tens of runs:

    QUAYD=build-asan/quayd QUAY_SANITIZED=1 /usr/bin/python3 tests/cluster/repeat.py \\
        tests/integration/28-cluster-move.py three_brokers \\
        deliveries_of_the_old_primary_outlive_the_new_one 300

SETUP (the script's test that forms the cluster) runs once, then TEST up to
N times; the first failure stops it and keeps the cluster's logs (their
directory is printed). The script's module-level `cluster` is the Cluster.
"""
import importlib.util
import sys
import time
import traceback


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    path, setup, test, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sys.argv = sys.argv[:1]  # the script reads test names from it
    spec = importlib.util.spec_from_file_location("under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    getattr(mod, setup)()
    failed = False
    try:
        for i in range(n):
            t0 = time.time()
            try:
                getattr(mod, test)()
            except Exception as e:
                failed = True
                print("rep %d FAIL %s: %s" % (i, type(e).__name__, e), flush=True)
                traceback.print_exc()
                break
            print("rep %d ok %.1fs" % (i, time.time() - t0), flush=True)
    finally:
        mod.cluster.failed = mod.cluster.failed or failed
        for problem in mod.cluster.close():
            failed = True
            print("FAIL cleanup: %s" % problem)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
