"""Run by tests/unit/test_zygote.py as a forked 'server': prints what it was started with, waits for a gate file,
exits with the code it is told."""
import os
import sys
import time

if __name__ == "__main__":
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("ZYGOTE_PROBE"), flush=True)
    gate = os.environ.get("ZYGOTE_PROBE_GATE")
    while gate and not os.path.exists(gate):
        time.sleep(0.01)
    sys.exit(int(os.environ.get("ZYGOTE_PROBE_EXIT", "0")))
