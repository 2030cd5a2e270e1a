"""A real PostgreSQL server for the ledger's tests and bench (Debian's postgresql; .ci/run
installs it): initdb in a fresh directory, postgres on loopback TCP at a free port with trust
authentication, stopped and removed at the end. PostgreSQL refuses to run as root: as root
(the tests' user) it runs as `nobody` over a directory it owns."""
from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

USER = "nobody"
START_S = 60.0


def binaries():
    """The newest installed server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(found[-1]) if found else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc, root, port):
        self.proc, self.root, self.port = proc, root, port

    def url(self, database="postgres"):
        return "postgresql://fleet@127.0.0.1:%d/%s" % (self.port, database)

    def create_database(self, name):
        """A fresh database; its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute('DROP DATABASE IF EXISTS "%s"' % name)
            conn.execute('CREATE DATABASE "%s"' % name)
        return self.url(name)


def _as_user(argv):
    return ["runuser", "-u", USER, "--", *argv] if os.getuid() == 0 else argv


@contextlib.contextmanager
def server(fsync=False):
    """A running server (fsync off for the tests' speed; the bench keeps it on)."""
    bin_dir = binaries()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL's server is not installed (apt-get install postgresql)")
    root = tempfile.mkdtemp(prefix="torchfleet-pg-")
    proc = None
    try:
        os.chmod(root, 0o755)
        if os.getuid() == 0:
            pw = pwd.getpwnam(USER)
            os.chown(root, pw.pw_uid, pw.pw_gid)
        data = os.path.join(root, "data")
        subprocess.run(_as_user([os.path.join(bin_dir, "initdb"), "-D", data, "-A", "trust",
                                 "-U", "fleet", "-E", "UTF8", "--no-instructions"]),
                       check=True, capture_output=True, timeout=120)
        port = free_port()
        with open(os.path.join(root, "server.log"), "wb") as log:
            proc = subprocess.Popen(_as_user([
                os.path.join(bin_dir, "postgres"), "-D", data, "-p", str(port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + root,
                "-c", "fsync=%s" % ("on" if fsync else "off"), "-c", "max_connections=60"]),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_ready(proc, port, root)
        yield Server(proc, root, port)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # fast shutdown
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(proc, port, root):
    import psycopg

    deadline = time.monotonic() + START_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError("postgres exited %s: %s" % (proc.returncode, _log(root)))
        try:
            psycopg.connect("postgresql://fleet@127.0.0.1:%d/postgres" % port,
                            connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise RuntimeError("postgres did not accept connections within %g s: %s"
                                   % (START_S, _log(root))) from None
            time.sleep(0.2)


def _log(root):
    try:
        with open(os.path.join(root, "server.log"), errors="replace") as f:
            return f.read()[-2000:]
    except OSError:
        return ""
