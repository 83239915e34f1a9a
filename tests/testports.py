"""tests/testports.py: loopback ports for the processes the tests start, shared by every test
directory (integration, router, deploy).

Why not bind(0) and close: the kernel hands out the same ephemeral range (ip_local_port_range)
for bind(0) and for the local end of every outgoing connection, so between the close and the
server's own bind another process can take the port (a client's connect, a node's port-0
listener) and the server exits with "address in use".  Ports drawn here come from below the
ephemeral range, where the kernel never picks on its own, and a port given to one test process
is not given to another for RESERVE_S seconds: a reservation file under the temp directory,
guarded by flock, records who took what.  Each port is still checked by binding it."""
import fcntl
import os
import random
import socket
import tempfile
import time

RESERVE_S = 300.0
_FILE = os.path.join(tempfile.gettempdir(), "kvlingo-test-ports-%d" % os.getuid())


def _range():
    """[lo, hi) outside the kernel's ephemeral range: below it when there is room, else above."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            e_lo, e_hi = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        e_lo, e_hi = 32768, 60999
    if e_lo - 10000 >= 4096:
        return 10000, e_lo
    if 65535 - e_hi >= 2048:
        return e_hi + 1, 65536
    return None


def _bindable(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _kernel_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def free_port():
    """A port on 127.0.0.1 that nothing listens on and no other test process took in the last
    RESERVE_S seconds (falls back to the kernel's bind(0) when no range is left outside the
    ephemeral one or the reservation file cannot be used)."""
    rng = _range()
    if rng is None:
        return _kernel_port()
    try:
        fd = os.open(_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return _kernel_port()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        now = time.time()
        taken = {}
        with os.fdopen(os.dup(fd), "r") as f:
            for line in f.read().split("\n"):
                parts = line.split()
                if len(parts) == 2:
                    try:
                        port, t = int(parts[0]), float(parts[1])
                    except ValueError:
                        continue
                    if now - t < RESERVE_S:
                        taken[port] = t
        port = None
        for _ in range(200):
            cand = random.randrange(*rng)
            if cand not in taken and _bindable(cand):
                port = cand
                break
        if port is None:
            return _kernel_port()
        taken[port] = now
        data = "".join("%d %.3f\n" % kv for kv in taken.items()).encode()
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, data)
        return port
    finally:
        os.close(fd)   # closing releases the flock
