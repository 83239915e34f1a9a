"""tests/router/pgtest.py: a throwaway PostgreSQL server for the router's tests.

initdb + pg_ctl of Debian's postgresql package in a temporary folder, run as an unprivileged
user (initdb refuses root: as root the server runs as `nobody` through runuser), listening on a
free loopback port and a unix socket in that folder; trust authentication for its one
superuser.  Every test gets its own server, stopped at exit.

    python3 pgtest.py run CMD...   # CMD with KVR_TEST_LEDGER=<uri> of a fresh server, then stop
    python3 pgtest.py start DIR    # prints the connection string, writes DIR/conninfo
    python3 pgtest.py stop DIR
As a module: Postgres(dir).start() / .stop() / .restart() / .uri / .psql(sql).
Missing binaries: start raises Missing (the CLI exits 77 with the reason: CTest's skip)."""
import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import testports  # noqa: E402


class Missing(Exception):
    pass


def find_bin():
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return d
    for name in ("initdb", "pg_ctl"):
        if not shutil.which(name):
            raise Missing("PostgreSQL server binaries not found (no /usr/lib/postgresql/*/bin/initdb "
                          "and no %s on PATH): apt-get install postgresql" % name)
    return os.path.dirname(shutil.which("initdb"))


def free_port():
    """A loopback port no other test process holds (see tests/testports.py)."""
    return testports.free_port()


class Postgres:
    def __init__(self, base=None, port=None):
        self.bin = find_bin()
        # the server's folder must be reachable by the unprivileged user: /tmp, not the build tree
        self.dir = tempfile.mkdtemp(prefix="kvr-pg-", dir=base if base and os.path.isdir(base) else None)
        self.data = os.path.join(self.dir, "data")
        self.sock = self.dir
        self.port = port or free_port()
        self.user = None
        if os.geteuid() == 0:
            self.user = "nobody"
            pw = pwd.getpwnam(self.user)
            os.chmod(self.dir, 0o755)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            # the parents must be traversable by that user
            d = os.path.dirname(self.dir)
            while d != "/":
                st = os.stat(d)
                if not st.st_mode & 0o001:
                    raise Missing("%s is not traversable by %s: cannot host a PostgreSQL server" % (d, self.user))
                d = os.path.dirname(d)
        self.uri = "postgresql://kvr@127.0.0.1:%d/postgres" % self.port
        self.log = os.path.join(self.dir, "server.log")
        self.started = False
        atexit.register(self.stop, True)

    def _run(self, args, check=True, timeout=120):
        if self.user:
            args = ["runuser", "-u", self.user, "--"] + args
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           env=dict(os.environ, LC_ALL="C", LANG="C"))
        if check and r.returncode != 0:
            raise RuntimeError("%s failed (%d): %s" % (" ".join(args), r.returncode,
                                                       r.stdout.decode(errors="replace")[-2000:]))
        return r

    def initdb(self):
        self._run([os.path.join(self.bin, "initdb"), "-D", self.data, "-U", "kvr", "--auth=trust",
                   "-E", "UTF8", "--no-sync"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("\nlisten_addresses = '127.0.0.1'\nport = %d\nunix_socket_directories = '%s'\n"
                    "fsync = off\nmax_connections = 100\nlog_min_messages = warning\n" % (self.port, self.sock))

    def start(self):
        if not os.path.isdir(self.data):
            self.initdb()
        self._run([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l", self.log, "-w", "-t", "60",
                   "start"])
        self.started = True
        t0 = time.time()
        while time.time() - t0 < 30:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("PostgreSQL did not listen on %d (log %s)" % (self.port, self.log))

    def stop(self, remove=False):
        if self.started:
            self._run([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop"],
                      check=False)
            self.started = False
        if remove and os.path.isdir(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self, down_s=0.0):
        self.stop()
        time.sleep(down_s)
        self.start()

    def psql(self, sql):
        """Run SQL with psql (the client package); returns stdout (tab-separated, no headers)."""
        psql = os.path.join(self.bin, "psql")
        if not os.access(psql, os.X_OK):
            psql = shutil.which("psql")
        r = subprocess.run([psql, "-X", "-q", "-A", "-t", "-F", "\t", "-d", self.uri, "-c", sql],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("psql: %s" % r.stderr.decode(errors="replace"))
        return r.stdout.decode()


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "run":
        try:
            pg = Postgres()
            pg.start()
        except Missing as e:
            print("skipped: %s" % e)
            return 77
        try:
            return subprocess.call(sys.argv[2:], env=dict(os.environ, KVR_TEST_LEDGER=pg.uri))
        finally:
            pg.stop(True)
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        print("usage: pgtest.py start|stop DIR", file=sys.stderr)
        return 2
    state = sys.argv[2]
    os.makedirs(state, exist_ok=True)
    if sys.argv[1] == "start":
        try:
            pg = Postgres()
            pg.start()
        except Missing as e:
            with open(os.path.join(state, "skip"), "w") as f:
                f.write(str(e) + "\n")
            print("pgtest: skip: %s" % e)
            return 0
        atexit.unregister(pg.stop)
        for n in ("skip",):
            if os.path.exists(os.path.join(state, n)):
                os.unlink(os.path.join(state, n))
        with open(os.path.join(state, "conninfo"), "w") as f:
            f.write(pg.uri + "\n")
        with open(os.path.join(state, "server"), "w") as f:
            f.write("%s\n%s\n%s\n" % (pg.bin, pg.data, pg.dir))
        print(pg.uri)
        return 0
    try:
        with open(os.path.join(state, "server")) as f:
            b, data, d = f.read().split("\n")[:3]
    except OSError:
        return 0
    args = [os.path.join(b, "pg_ctl"), "-D", data, "-m", "fast", "-w", "stop"]
    if os.geteuid() == 0:
        args = ["runuser", "-u", "nobody", "--"] + args
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shutil.rmtree(d, ignore_errors=True)
    for n in ("server", "conninfo"):
        if os.path.exists(os.path.join(state, n)):
            os.unlink(os.path.join(state, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
