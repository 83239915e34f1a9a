"""tests/testprocs.py: process helpers shared by every test directory (integration, router).

freeze(popen): SIGSTOP a process and return once every one of its threads is stopped.  kill()
only queues the signal; on a loaded host a thread the kernel has not stopped yet can still
answer the next request (seen: a turn sent at once to a "frozen" node completed), so a test
that freezes a process to see what its peers do must wait for the stop."""
import os
import signal
import time


def freeze(popen, timeout=5.0):
    popen.send_signal(signal.SIGSTOP)
    task = "/proc/%d/task" % popen.pid
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            states = []
            for tid in os.listdir(task):
                with open(os.path.join(task, tid, "stat")) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except OSError:   # a thread that ended meanwhile: look again
            continue
        if states and all(st in ("T", "t") for st in states):
            return
        time.sleep(0.002)
    raise AssertionError("pid %d not stopped %.0f s after SIGSTOP" % (popen.pid, timeout))
