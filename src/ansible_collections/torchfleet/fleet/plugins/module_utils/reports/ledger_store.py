"""The fleet's ledger's storage (docs/ledger.md "Schema"): the engines, the schema and its
migrations, the transactions and the rows; what a record means (what counts, the score,
quarantine) is reports/ledger.py's, as Alembic keeps migrations apart from models.

One schema for SQLite (the default: fleet.db in the runs root, WAL mode and a busy timeout, so
several controllers on one machine write at once; never on a network filesystem, whose locks
SQLite cannot rely on across machines) and PostgreSQL (fleet_db=postgresql://..., controllers on
several login nodes, directly or through PgBouncer), through SQLAlchemy Core. The controller's
side only.

Fail open: no method of Store raises. A ledger that is missing its driver, locked past its
timeout, corrupt or of a newer schema turns the Store off after one sentence in `warnings`
(the fleet.ledger check's message: the ledger, what failed, the fix); the run never pays for it.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import Counter

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as sa_postgresql
    from sqlalchemy.dialects import sqlite as sa_sqlite
    from sqlalchemy.pool import SingletonThreadPool
    HAS_SQLALCHEMY = True
    IMPORT_ERROR = ""
except ImportError as exc:  # a controller without it: a warning, never a failure
    sa = sa_postgresql = sa_sqlite = SingletonThreadPool = None
    HAS_SQLALCHEMY = False
    IMPORT_ERROR = str(exc)

from ansible_collections.torchfleet.fleet.plugins.module_utils import defaults
from ansible_collections.torchfleet.fleet.plugins.module_utils.host import mounts
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.goodput import finite

SCHEMA_VERSION = 4
HOST_MAX, TEXT_MAX = 255, 500
IN_MAX = 64              # more hosts than this: read them all, not an IN list of each


def _text(value, limit=HOST_MAX):
    """A report's string, bounded and storable by both engines (no NUL, no lone surrogate)."""
    if not isinstance(value, str):
        return ""
    if len(value) <= limit and value.isascii() and "\x00" not in value:
        return value  # the common case, 512 times a run
    value = value[:4 * limit].replace("\x00", "")
    return value.encode("utf-8", "backslashreplace").decode("utf-8")[:limit]


# ---- The schema ----

if HAS_SQLALCHEMY:
    METADATA = sa.MetaData()
    META = sa.Table(
        "ledger_meta", METADATA,
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(255), nullable=False))
    # Who took part in which run: one row a run (its hosts a JSON list), and each host's
    # count in ledger_hosts.runs: a row per host and run would be 512,000 rows to count at
    # 512 hosts x 1,000 runs (bench ledger).
    RUNS = sa.Table(
        "ledger_runs", METADATA,
        sa.Column("run_id", sa.String(HOST_MAX), primary_key=True),
        sa.Column("phase", sa.String(16), nullable=False),  # the first one recorded
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("hosts", sa.Text, nullable=False),
        sa.Index("ix_ledger_runs_at", "at"))
    INCIDENTS = sa.Table(
        "ledger_incidents", METADATA,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("host", sa.String(HOST_MAX), nullable=False),
        sa.Column("run_id", sa.String(HOST_MAX), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("detail", sa.String(120), nullable=False),
        sa.Column("check_id", sa.String(64), nullable=False),
        sa.Column("weight", sa.Float, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("info", sa.String(TEXT_MAX), nullable=False),
        # The finisher and a later attach writing the same run count once.
        sa.UniqueConstraint("run_id", "phase", "attempt", "host", "kind", "detail",
                            name="uq_ledger_incident"),
        sa.Index("ix_ledger_incidents_host_at", "host", "at"),
        sa.Index("ix_ledger_incidents_at", "at"))
    HOSTS = sa.Table(  # quarantine and release, per host
        "ledger_hosts", METADATA,
        sa.Column("host", sa.String(HOST_MAX), primary_key=True),
        sa.Column("runs", sa.Integer, nullable=False, default=0),
        sa.Column("quarantined_until", sa.Float, nullable=True),
        sa.Column("reason", sa.String(TEXT_MAX), nullable=False, default=""),
        sa.Column("released_at", sa.Float, nullable=True),  # incidents before it: forgiven
        sa.Column("updated", sa.Float, nullable=False))
    # A failure most hosts shared (docs/ledger.md "Shared causes"): the shared cause's, once,
    # never a host's incident (schema version 2).
    EVENTS = sa.Table(
        "ledger_events", METADATA,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(HOST_MAX), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("check_id", sa.String(64), nullable=False),
        sa.Column("hosts", sa.Text, nullable=False),  # a JSON list
        sa.Column("what", sa.String(TEXT_MAX), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.UniqueConstraint("run_id", "phase", "attempt", "check_id", name="uq_ledger_event"),
        sa.Index("ix_ledger_events_at", "at"))
    # What torchfleet did on its own, or would have (train.json's `actions`: docs/running.md),
    # per host ("" for the whole run), once each however often the report is written (schema
    # version 3).
    ACTIONS = sa.Table(
        "ledger_actions", METADATA,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(HOST_MAX), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("host", sa.String(HOST_MAX), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("check_id", sa.String(64), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("why", sa.String(TEXT_MAX), nullable=False),
        sa.Column("done", sa.Boolean, nullable=False),
        sa.UniqueConstraint("run_id", "phase", "host", "action", "check_id",
                            name="uq_ledger_action"),
        sa.Index("ix_ledger_actions_host_at", "host", "at"))
    # Each version's step from the one before (run in order, in one transaction, under the
    # ledger's write lock); a later version adds a step here, never edits one.
    MIGRATIONS = {1: lambda conn: METADATA.create_all(conn, tables=[META, RUNS, INCIDENTS,
                                                                    HOSTS]),
                  2: lambda conn: METADATA.create_all(conn, tables=[EVENTS]),
                  3: lambda conn: METADATA.create_all(conn, tables=[ACTIONS]),
                  4: lambda conn: _canonical_hosts(conn)}  # pylint: disable=unnecessary-lambda
else:  # the names still import (ledger.py, ansible-test's import check); Store says why not
    METADATA = META = RUNS = INCIDENTS = HOSTS = EVENTS = ACTIONS = None
    MIGRATIONS = {}


class NewerSchema(Exception):
    pass


class NoLedger(Exception):
    pass


def canonical_host(name):
    """The key a host is kept under (docs/ledger.md "Which host"): its inventory name in lower
    case without a trailing dot, and of a DNS name its first label, so node3, NODE3 and
    node3.cluster.example are one host's history. An IP address is kept whole. (One fleet's
    short names are unique, as Slurm's node names are; fleets whose short names collide keep
    a ledger each.)"""
    name = _text(name).strip().rstrip(".").lower()
    if not name or re.match(r"^[0-9.]+$", name) or ":" in name or "[" in name:
        return name  # empty, IPv4, IPv6
    return name.split(".", 1)[0] or name


def _canonical_hosts(conn):
    """Schema version 4: every row's host under its canonical_host key; two rows of one host
    (node3 and node3.cluster.example) become one: its runs added, its latest quarantine and
    release kept."""
    moved = {h: canonical_host(h) for (h,) in conn.execute(sa.select(HOSTS.c.host))}
    for table in (INCIDENTS, ACTIONS):
        for (h,) in conn.execute(sa.select(table.c.host).distinct()).all():
            moved.setdefault(h, canonical_host(h))
    moved = {h: c for h, c in moved.items() if h != c}
    if not moved:
        return
    unique = {INCIDENTS: ("run_id", "phase", "attempt", "kind", "detail"),
              ACTIONS: ("run_id", "phase", "action", "check_id")}
    for table, key in unique.items():
        other = table.alias("other")
        for old, new in moved.items():
            # Renamed, unless the new name has the same row already (an incident seen under
            # both names in one run: kept once).
            twin = sa.exists().where(other.c.host == new,
                                     *[other.c[k] == table.c[k] for k in key])
            conn.execute(table.update().where(table.c.host == old, ~twin).values(host=new))
            conn.execute(table.delete().where(table.c.host == old))
    states = {r.host: r._asdict() for r in conn.execute(sa.select(HOSTS))}
    merged = {}
    for host, st in states.items():
        key = moved.get(host, host)
        into = merged.setdefault(key, dict(st, host=key, runs=0))
        into["runs"] += st["runs"] or 0
        for col in ("quarantined_until", "released_at"):
            if st[col] is not None and (into[col] is None or st[col] > into[col]):
                into[col] = st[col]
                if col == "quarantined_until":
                    into["reason"] = st["reason"]
        into["updated"] = max(into["updated"], st["updated"])
    conn.execute(HOSTS.delete())
    for row in merged.values():
        conn.execute(HOSTS.insert().values(row))
    for run_id, listed in conn.execute(sa.select(RUNS.c.run_id, RUNS.c.hosts)).all():
        hosts = _hosts_of(listed)
        if any(h in moved for h in hosts):
            conn.execute(RUNS.update().where(RUNS.c.run_id == run_id).values(hosts=json.dumps(
                list(dict.fromkeys(moved.get(h, h) for h in hosts)))))


# A password in a URL's user part, its query (?password=, PgBouncer's and libpq's) or a
# key=value DSN.
_SECRETS = (re.compile(r"(://[^:/@?#]*):[^/?]*@"),
            re.compile(r"(?i)([?&;\s]password=)[^&;\s]*"),
            re.compile(r"(?i)(^password=)[^&;\s]*"))


def describe(fleet_db):
    """The ledger as a sentence names it: the path, or the URL without its password."""
    out = _SECRETS[0].sub(r"\1:***@", fleet_db)
    for pattern in _SECRETS[1:]:
        out = pattern.sub(r"\1***", out)
    return out


def password_of(fleet_db):
    """The password fleet_db carries (its user part's or its query's), or ""."""
    if not isinstance(fleet_db, str):
        return ""
    found = re.search(r"://[^:/@?#]*:([^/?]*)@", fleet_db) or re.search(
        r"(?i)(?:^|[?&;\s])password=([^&;\s]*)", fleet_db)
    return found.group(1) if found else ""


SQLITE_URL = re.compile(r"^sqlite:///")


def _url(fleet_db, runs_root):
    """(SQLAlchemy URL, path or None) of fleet_db: a postgresql:// URL (psycopg 3 unless a
    driver is named), else a SQLite path, relative to runs_root when relative; SQLAlchemy's
    own sqlite:///relative and sqlite:////absolute say the same."""
    if re.match(r"^postgres(ql)?(\+\w+)?://", fleet_db):
        url = re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", fleet_db)
        return url, None
    path = os.path.join(runs_root or ".", os.path.expanduser(SQLITE_URL.sub("", fleet_db)))
    return "sqlite:///" + os.path.abspath(path), os.path.abspath(path)


# What /proc/self/mountinfo calls the network filesystems SQLite must not be shared on (its
# locks and WAL's shared memory are one machine's): NFS, Lustre, GPFS (Spectrum Scale), CephFS
# (kernel and FUSE), SMB/CIFS, GlusterFS, BeeGFS, OrangeFS, AFS, WekaFS.
NETWORK_FS = ("nfs", "nfs4", "lustre", "gpfs", "ceph", "fuse.ceph-fuse", "cifs", "smb3",
              "smbfs", "fuse.glusterfs", "beegfs", "pvfs2", "afs", "wekafs", "fuse.sshfs")


def fs_type(path, mountinfo=None):
    """The filesystem type of the mount that holds path (a folder not made yet: its parent's),
    as the kernel names it in mountinfo ("nfs4", "lustre", "ext4"), or "" when unknown.
    mountinfo (host/mounts.py), not statfs(2): it names FUSE filesystems (fuse.ceph-fuse, not
    FUSE's one magic number) and needs no per-architecture struct layout. mountinfo: a file
    to read instead of the process's own (tests)."""
    text = mounts.read_mountinfo(mountinfo or mounts.MOUNTINFO)
    return mounts.mount_of(os.path.abspath(path), text)[0]


def network_fs(path, mountinfo=None):
    """path's filesystem type when it is a network filesystem's, else ""."""
    kind = fs_type(path, mountinfo)
    return kind if kind in NETWORK_FS or kind.split(".")[0] in NETWORK_FS else ""


def local_ledger():
    """The default ledger's per-controller place when the runs root is on a network
    filesystem: ${XDG_STATE_HOME:-~/.local/state}/torchfleet/fleet.db."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state")
    return os.path.join(os.path.abspath(base), "torchfleet", defaults.FLEET_DB)


def sqlite_file(fleet_db, runs_root):
    """(the SQLite file a ledger uses, the network filesystem of the one fleet_db names or "",
    that one): the default fleet_db (fleet.db in the runs root) on a network filesystem (a
    runs root in an NFS home, common on login nodes) falls back to local_ledger(), unless
    that is on one too; a path given is used or refused as given. (None, "", None) for a
    PostgreSQL URL."""
    asked = _url(fleet_db, runs_root)[1]
    if asked is None:
        return None, "", None
    shared = network_fs(os.path.dirname(asked))
    if shared and fleet_db == defaults.FLEET_DB:
        local = local_ledger()
        if not network_fs(os.path.dirname(local)):
            return local, shared, asked
    return asked, shared, asked


class Store:
    """A ledger's engine and schema. fleet_db: "" (off: every write does nothing), a SQLite
    path or a postgresql:// URL. Never raises; `warnings` holds the fleet.ledger sentences
    (one per Store: the first failure turns it off)."""

    def __init__(self, fleet_db=defaults.FLEET_DB, runs_root="",
                 timeout_s=defaults.LEDGER_TIMEOUT_S, create=True):
        self.fleet_db = fleet_db if isinstance(fleet_db, str) else ""
        self.runs_root = runs_root if isinstance(runs_root, str) else ""
        self.timeout_s = max(float(finite(timeout_s) or defaults.LEDGER_TIMEOUT_S), 0.001)
        self.create = create
        self.warnings = []
        # Sentences that do not turn the ledger off (a controller's clock far from the
        # server's, the default ledger moved off a network filesystem): fleet.ledger warnings
        # all the same.
        self.notes = []
        self.absent = False  # no ledger there yet (create=False: torchfleet hosts)
        self.readonly = False  # a SQLite file this user may read and not write
        self.where = _url(self.fleet_db, self.runs_root)[1] or describe(self.fleet_db) \
            if self.fleet_db else ""
        self._engine = None
        self._off = not self.fleet_db

    # ---- fail open ----

    @property
    def on(self):
        return not self._off

    def _fail(self, what, fix):
        if not self.warnings:
            self.warnings.append("the fleet's ledger %s %s: %s; the run goes on without it"
                                 % (self.where, what, fix))
        self._off = True
        self.close()

    def _failed(self, exc):
        """The sentence of an exception while using the ledger."""
        text = " ".join(str(getattr(exc, "orig", None) or exc).split())
        # (A driver's message may quote the URL, or the pieces of a password it misread.)
        secret = password_of(self.fleet_db)
        for piece in sorted({secret, *re.split(r"[:@]", secret)}, key=len, reverse=True):
            if len(piece) >= 3:
                text = text.replace(piece, "***")
        text = describe(text)[:300]
        low = text.lower()
        if isinstance(exc, NoLedger):
            self.absent = True
            self._fail("holds no ledger", "give --fleet-db the database the runs write "
                       "(their fleet_db); a ledger is written at every preflight's and run's "
                       "end")
        elif isinstance(exc, NewerSchema):
            self._fail("has schema version %s, newer than this torchfleet's (%d)"
                       % (text, SCHEMA_VERSION), "upgrade torchfleet on this controller, or "
                       "point fleet_db at another ledger")
        elif "locked" in low or "busy" in low or "lock timeout" in low or \
                "canceling statement" in low:
            self._fail("stayed locked past its %g s timeout (%s)" % (self.timeout_s, text),
                       "another controller holds it: look for a stuck torchfleet process")
        elif "not a database" in low or "malformed" in low or "corrupt" in low:
            self._fail("is corrupt (%s)" % text, "move it aside (mv %s %s.corrupt): a new "
                       "ledger starts at the next run, without the history" % (
                           self.where, self.where))
        elif "unable to open" in low or "permission" in low or "read-only" in low or \
                "readonly" in low:
            self._fail("cannot be opened for writing (%s)" % text, "make its directory "
                       "writable by the controller's user, or set fleet_db to another path")
        elif "connect" in low or "connection" in low or "could not translate" in low:
            self._fail("cannot be reached (%s)" % text, "check that the PostgreSQL server "
                       "runs and fleet_db's host, port, user and database")
        else:
            self._fail("failed (%s: %s)" % (type(exc).__name__, text),
                       "report it with the message; set fleet_db='' to run without a ledger")

    def _ready(self):
        """The engine, its schema current, or None (off, or this was the failure)."""
        if self._off:
            return None
        if self._engine is not None:
            return self._engine
        if not HAS_SQLALCHEMY:
            self._fail("needs SQLAlchemy 2 in the controller's Python (%s)" % IMPORT_ERROR,
                       "pip install 'sqlalchemy>=2' (and 'psycopg[binary]' for PostgreSQL), "
                       "or set fleet_db='' to run without a ledger")
            return None
        try:
            url, path = _url(self.fleet_db, self.runs_root)
            if path is not None:
                path, shared, asked = sqlite_file(self.fleet_db, self.runs_root)
                if path != asked:  # the default on a network filesystem: this controller's
                    url, self.where = "sqlite:///" + path, path
                    said = (
                        "the fleet's ledger %s is on a network filesystem (%s), where SQLite's "
                        "locks do not hold across machines: this controller keeps its own "
                        "ledger at %s instead (its runs' history only); set fleet_db to a "
                        "postgresql:// URL for one ledger every controller shares "
                        "(docs/ledger.md)" % (asked, shared, path))
                    if said not in self.notes:  # (once: the engine is made again after close)
                        self.notes.append(said)
                if not self.create and not os.path.exists(path):
                    self.absent = True
                    self._fail("does not exist", "it is written at every preflight's and "
                               "run's end; give --runs-root or --fleet-db where it is")
                    return None
                if shared and path == asked:
                    self._fail("is on a network filesystem (%s): SQLite's locks do not hold "
                               "across machines and two controllers would corrupt it%s" % (
                                   shared, ", and so is this controller's own place for it, "
                                   "%s" % local_ledger() if self.fleet_db == defaults.FLEET_DB
                                   else ""),
                               "set fleet_db to a path on this controller's local disk (a "
                               "ledger per controller) or to a postgresql:// URL shared by "
                               "all of them (docs/ledger.md)")
                    return None
                os.makedirs(os.path.dirname(path), exist_ok=True)
                # A reader who may not write (torchfleet hosts as another user) opens it
                # read-only: no write lock, no -shm file to create.
                self.readonly = os.path.exists(path) and not (
                    os.access(path, os.W_OK) and os.access(os.path.dirname(path), os.W_OK))
                if self.readonly:
                    # (SQLite reads a WAL file read-only where its -shm exists, a writer's
                    # being there; with none, the file as it stands: immutable.)
                    url = "sqlite:///file:%s?%s&uri=true" % (path, "mode=ro" if os.path.exists(
                        path + "-shm") else "immutable=1")
                # One connection kept for the Fleet's life: the last one to close a WAL
                # database checkpoints it (12 ms a write at 512 hosts).
                engine = sa.create_engine(url, poolclass=SingletonThreadPool,
                                          connect_args={"timeout": self.timeout_s,
                                                        "isolation_level": None,
                                                        "check_same_thread": False})
                if not self.readonly:
                    sa.event.listen(engine, "connect", _sqlite_connect)
                sa.event.listen(engine, "begin", _sqlite_begin)
            else:
                # Every wait bounded from this side: the connect, and a server or a network
                # gone mid-transaction (keepalives while waiting on the server, and
                # tcp_user_timeout on unacknowledged data); libpq's parameters, never a
                # startup `options` (PgBouncer refuses it). The server's own timeouts are
                # SET LOCAL in each transaction (_pg_begin): session SETs would leak to
                # another client through PgBouncer's transaction pooling.
                wait = max(1, int(math.ceil(self.timeout_s)))
                args = {"connect_timeout": wait, "keepalives": 1, "keepalives_idle": wait,
                        "keepalives_interval": 1, "keepalives_count": 3,
                        "tcp_user_timeout": max(int(self.timeout_s * 1000), 1)}
                if sa.engine.make_url(url).get_driver_name() == "psycopg":
                    # No server-side prepared statement (psycopg 3 prepares an executemany's,
                    # _bulk's, as _pg3_0): through PgBouncer's transaction pooling it stays on
                    # the server connection, and the next client given that connection fails
                    # with 'prepared statement "_pg3_0" already exists'.
                    args["prepare_threshold"] = None
                engine = sa.create_engine(url, pool_size=1, max_overflow=2, connect_args=args)
                sa.event.listen(engine, "begin", self._pg_begin)
            self._engine = engine
            self._migrate()
            return self._engine
        except Exception as exc:  # fail open: any failure is one warning
            self._failed(exc)
            return None

    def _pg_begin(self, conn):
        ms = int(self.timeout_s * 1000)
        conn.exec_driver_sql("SET LOCAL lock_timeout = %d" % ms)
        conn.exec_driver_sql("SET LOCAL statement_timeout = %d" % (6 * ms))
        conn.exec_driver_sql("SET LOCAL idle_in_transaction_session_timeout = %d" % (6 * ms))

    def _version(self, conn):
        if not sa.inspect(conn).has_table(META.name):
            return 0
        found = conn.execute(sa.select(META.c.value).where(
            META.c.key == "schema_version")).scalar()
        return int(found) if found and str(found).isdigit() else 0

    def _migrate(self):
        # A current schema is read without the write lock: a reader never waits for a
        # writer, and one who may not write reads all the same.
        with self._read() as conn:
            version = self._version(conn)
        if version > SCHEMA_VERSION:
            raise NewerSchema(str(version))
        if version == SCHEMA_VERSION:
            return
        if version == 0 and not self.create:  # (torchfleet hosts: a database of no ledger)
            raise NoLedger()
        with self._write() as conn:
            if conn.dialect.name == "postgresql":  # one controller migrates at a time
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(6060)"))
            version = self._version(conn)  # (again: another controller may have migrated)
            if version > SCHEMA_VERSION:
                raise NewerSchema(str(version))
            for step in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[step](conn)
            if version < SCHEMA_VERSION:
                conn.execute(META.delete().where(META.c.key == "schema_version"))
                conn.execute(META.insert().values(key="schema_version",
                                                  value=str(SCHEMA_VERSION)))

    def _write(self):
        """A transaction that takes the write lock first (SQLite: BEGIN IMMEDIATE, so a writer
        waits for another's commit within the busy timeout instead of failing at its first
        write)."""
        return _Tx(self._engine, True)

    def _read(self):
        return _Tx(self._engine, False)

    def server_now(self, conn):
        """The database server's clock (epoch s) on PostgreSQL, every controller's one clock;
        None on SQLite (one machine's file: its clock is the controller's)."""
        if conn.dialect.name != "postgresql":
            return None
        return float(conn.execute(sa.text("SELECT extract(epoch FROM now())")).scalar())

    def close(self):
        if self._engine is not None:
            try:
                self._engine.dispose()
            except Exception:
                pass
            self._engine = None

    def _guard(self, call, empty):
        if self._ready() is None:
            return empty
        try:
            return call()
        except Exception as exc:
            self._failed(exc)
            return empty


class _Tx:
    """A connection with its transaction: committed at the end, rolled back on an exception."""

    def __init__(self, engine, write):
        self.engine, self.write = engine, write

    def __enter__(self):
        self.conn = self.engine.connect()
        if self.write:
            self.conn = self.conn.execution_options(ledger_write=True)
        self.tx = self.conn.begin()
        return self.conn

    def __exit__(self, kind, exc, tb):
        try:
            if kind is None:
                self.tx.commit()
            else:
                self.tx.rollback()
        finally:
            self.conn.close()
        return False


def _sqlite_connect(dbapi_conn, _record):
    cur = dbapi_conn.cursor()
    try:
        # WAL: readers never wait for the writer; the mode is kept in the file.
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable at each WAL checkpoint
    finally:
        cur.close()


def _sqlite_begin(conn):
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("ledger_write")
                         else "BEGIN")


def _insert_ignore(conn, table):
    dialect = sa_postgresql if conn.dialect.name == "postgresql" else sa_sqlite
    return dialect.insert(table).on_conflict_do_nothing()


def _bulk(conn, table, rows):
    """Insert-or-ignore many rows through the driver's executemany (psycopg pipelines it):
    SQLAlchemy's own parameter processing took longer than SQLite's writes at 512 rows, and
    compiling one statement of 512 VALUES longer still."""
    if not rows:
        return
    keys = list(rows[0])
    compiled = _insert_ignore(conn, table).compile(dialect=conn.dialect, column_keys=keys)
    if compiled.positional:
        params = [tuple(r[k] for k in compiled.positiontup) for r in rows]
    else:
        params = [{k: r[k] for k in keys} for r in rows]
    conn.exec_driver_sql(str(compiled), params)


def _hosts_of(text):
    try:
        listed = json.loads(text)
    except ValueError:
        return []
    return [h for h in listed if isinstance(h, str)] if isinstance(listed, list) else []


def _took_part(conn, run_id, phase, hosts, at):
    """The run's row and its hosts' counts; a run recorded again (the finisher and an attach,
    the train after its preflight) counts only the hosts it had not named."""
    # (RETURNING, not rowcount: psycopg's is -1 for an INSERT ... ON CONFLICT DO NOTHING.)
    inserted = conn.execute(_insert_ignore(conn, RUNS).values(
        run_id=run_id, phase=phase, at=at, hosts=json.dumps(hosts)).returning(
        RUNS.c.run_id)).first()
    if inserted is None:
        q = sa.select(RUNS.c.hosts).where(RUNS.c.run_id == run_id)
        if conn.dialect.name == "postgresql":
            q = q.with_for_update()
        known = set(_hosts_of(conn.execute(q).scalar() or "[]"))
        new = [h for h in hosts if h not in known]
        if not new:
            return
        conn.execute(RUNS.update().where(RUNS.c.run_id == run_id).values(
            hosts=json.dumps(sorted(known) + new)))
        hosts = new
    if conn.dialect.name == "postgresql":  # one statement, not a pipeline of 512
        named = sa.func.unnest(sa.bindparam("hosts", type_=sa_postgresql.ARRAY(sa.String))) \
            .column_valued("h")
        conn.execute(sa_postgresql.insert(HOSTS).from_select(
            ["host", "runs", "reason", "updated"],
            sa.select(named, sa.literal(0), sa.literal(""), sa.literal(at, sa.Float)))
            .on_conflict_do_nothing(), {"hosts": hosts})
    else:
        _bulk(conn, HOSTS, [{"host": h, "runs": 0, "reason": "", "updated": at} for h in hosts])
    conn.execute(HOSTS.update().where(HOSTS.c.host.in_(sa.bindparam("hosts", expanding=True)))
                 .values(runs=HOSTS.c.runs + 1), {"hosts": hosts})


def _count(conn, run_id, phase):
    return conn.execute(sa.select(sa.func.count()).select_from(INCIDENTS).where(
        INCIDENTS.c.run_id == run_id, INCIDENTS.c.phase == phase)).scalar()


def _set_host(conn, host, at, **values):
    values["updated"] = at
    conn.execute(_insert_ignore(conn, HOSTS).values(host=host, runs=0, reason="", updated=at))
    conn.execute(HOSTS.update().where(HOSTS.c.host == host).values(**values))


def quarantine_end(state, at):
    """When a host's quarantine (its ledger_hosts row as a dict) ends, judged at `at`; None
    where it has none. A row written later than `at` (on SQLite each controller dates its
    writes by its own clock: one ahead wrote it) began at `at` at the latest: its end moves
    back by as much, its length kept, so that a clock ahead never lengthens a quarantine."""
    until = state.get("quarantined_until") if isinstance(state, dict) else None
    if until is None:
        return None
    ahead = (state.get("updated") or 0.0) - at
    return until - ahead if ahead > 0 else until


def host_states(conn, hosts=None):
    """{host: its ledger_hosts row as a dict} of these hosts (None: every host)."""
    q = sa.select(HOSTS)
    if hosts is not None and len(hosts) <= IN_MAX:
        q = q.where(HOSTS.c.host.in_(hosts))
    return {r.host: r._asdict() for r in conn.execute(q)}


def incident_rows(conn, hosts, since):
    """The incidents of these hosts (None: every host) dated `since` or later."""
    q = sa.select(INCIDENTS.c.host, INCIDENTS.c.run_id, INCIDENTS.c.phase,
                  INCIDENTS.c.attempt, INCIDENTS.c.kind, INCIDENTS.c.detail,
                  INCIDENTS.c.weight, INCIDENTS.c.at).where(INCIDENTS.c.at >= since)
    if hosts is not None and len(hosts) <= IN_MAX:
        q = q.where(INCIDENTS.c.host.in_(hosts))
    wanted = None if hosts is None else set(hosts)
    return [r for r in conn.execute(q) if wanted is None or r.host in wanted]


def runs_since(conn, start):
    """Counter {host: runs} of the runs recorded at `start` or later."""
    runs = Counter()
    for (listed,) in conn.execute(sa.select(RUNS.c.hosts).where(RUNS.c.at >= start)):
        runs.update(_hosts_of(listed))
    return runs


def kinds_since(conn, start):
    """({host: {kind: count}}, {host: its newest incident's at}) since `start` (None: ever).
    An incident that weighs nothing (a non-fatal hardware event, one the circuit breaker
    forgave) counts as a warning: its host's history, never its score."""
    kind = sa.case((INCIDENTS.c.weight > 0, INCIDENTS.c.kind), else_=sa.literal("warning"))
    q = sa.select(INCIDENTS.c.host, kind, sa.func.count(),
                  sa.func.max(INCIDENTS.c.at)).group_by(INCIDENTS.c.host, kind)
    if start is not None:
        q = q.where(INCIDENTS.c.at >= start)
    kinds, newest = {}, {}
    for host, kind, n, last in conn.execute(q):
        kinds.setdefault(host, {})[kind] = n
        newest[host] = max(newest.get(host, last), last)
    return kinds, newest


def newest_incidents(conn):
    """Each host's newest incidents (host, run_id, check_id, at, weight), found by the
    (host, at) index."""
    top = sa.select(INCIDENTS.c.host, sa.func.max(INCIDENTS.c.at).label("m")) \
        .group_by(INCIDENTS.c.host).subquery()
    return conn.execute(sa.select(INCIDENTS.c.host, INCIDENTS.c.run_id, INCIDENTS.c.check_id,
                                  INCIDENTS.c.at, INCIDENTS.c.weight).join(top, sa.and_(
                                      INCIDENTS.c.host == top.c.host,
                                      INCIDENTS.c.at == top.c.m))).all()


def add_events(conn, run_id, phase, events):
    """The fleet events of a report ({"attempt", "check", "hosts", "what", "at"}), once each
    however often the report is written."""
    _bulk(conn, EVENTS, [{"run_id": run_id, "phase": phase, "attempt": e["attempt"],
                          "check_id": e["check"], "hosts": json.dumps(e["hosts"]),
                          "what": e["what"], "at": e["at"]} for e in events])


def events_since(conn, start, limit):
    """The newest `limit` fleet events dated `start` or later (None: ever), newest first."""
    q = sa.select(EVENTS).order_by(EVENTS.c.at.desc(), EVENTS.c.id.desc()).limit(limit)
    if start is not None:
        q = q.where(EVENTS.c.at >= start)
    return [dict(r._asdict(), hosts=_hosts_of(r.hosts)) for r in conn.execute(q)]


# The key of PostgreSQL's advisory lock that makes the decision to quarantine one controller's at
# a time (6060: the migration's).
DECISION_LOCK = 6061


def lock_decisions(conn):
    """Holds the ledger's decision lock until the transaction ends, so that a score read after
    it counts every other controller's committed incidents: two controllers each adding 1.0 to
    a host at 1.0 see 2.0 and 3.0, not 2.0 both. SQLite's BEGIN IMMEDIATE (_Tx) holds its
    write lock for the whole transaction already; PostgreSQL's READ COMMITTED does not, so it
    takes an advisory lock, first in the transaction (before any row lock: a controller that
    holds one never waits for this one's holder)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": DECISION_LOCK})


def add_actions(conn, run_id, phase, actions):
    """The audit's entries of a report ({"action", "host", "check", "at" (epoch s), "why",
    "done"}), once each however often the report is written."""
    _bulk(conn, ACTIONS, [{"run_id": run_id, "phase": phase, "host": a["host"] or "",
                           "action": a["action"], "check_id": a["check"], "at": a["at"],
                           "why": a["why"], "done": bool(a["done"])} for a in actions])


# The why of a drain decided and not yet answered by Slurm (ledger.Fleet.decide_drains): counted
# as drained by every controller's breaker until settle_drains() records the answer (for ever,
# within quarantine_h, when the run's end died meanwhile or scontrol timed out: it may have
# drained).
PENDING = "pending"


def drained_since(conn, start):
    """The hosts torchfleet drained in Slurm (a drain action done, or pending) at `start` or
    later."""
    q = sa.select(ACTIONS.c.host).where(
        ACTIONS.c.action == "drain", sa.or_(ACTIONS.c.done.is_(True), ACTIONS.c.why == PENDING),
        ACTIONS.c.at >= start, ACTIONS.c.host != "").distinct()
    return {host for (host,) in conn.execute(q)}


def settle_drains(conn, run_id, phase, rows):
    """Slurm's answer to a run's pending drains: each row ({"host", "check", "why", "done"})
    sets the done and why of the run's drain of that host and check."""
    for r in rows:
        conn.execute(ACTIONS.update().where(
            ACTIONS.c.run_id == run_id, ACTIONS.c.phase == phase, ACTIONS.c.host == r["host"],
            ACTIONS.c.action == "drain", ACTIONS.c.check_id == r["check"]).values(
                why=r["why"], done=r["done"]))


def actions_of(conn, host, start, limit):
    """The newest `limit` actions of `host` (and the whole run's, host "", of its runs) dated
    `start` or later (None: ever), newest first."""
    q = sa.select(ACTIONS).where(ACTIONS.c.host == host).order_by(
        ACTIONS.c.at.desc(), ACTIONS.c.id.desc()).limit(limit)
    if start is not None:
        q = q.where(ACTIONS.c.at >= start)
    return [r._asdict() for r in conn.execute(q)]


def prune(conn, before):
    """Deletes what happened before `before` (epoch s): incidents, fleet events, actions and
    runs (ledger_keep_days); a host's row (its quarantine, its release, its count of runs)
    stays. The number of incidents deleted."""
    gone = conn.execute(INCIDENTS.delete().where(INCIDENTS.c.at < before)).rowcount
    for table in (EVENTS, ACTIONS, RUNS):
        conn.execute(table.delete().where(table.c.at < before))
    return gone


SETTING = "setting."  # ledger_meta's keys of the fleet's settings: setting.<variable>


def save_settings(conn, settings):
    """The fleet's settings as its last preflight or run used them ({variable: number or
    text}): torchfleet hosts scores with them, and rewrites the textfile they name."""
    conn.execute(META.delete().where(META.c.key.in_([SETTING + k for k in settings])))
    _bulk(conn, META, [{"key": SETTING + k, "value": json.dumps(v)[:255]}
                       for k, v in sorted(settings.items())])


def load_settings(conn):
    out = {}
    for key, value in conn.execute(sa.select(META.c.key, META.c.value).where(
            META.c.key.startswith(SETTING))):
        try:
            out[key[len(SETTING):]] = json.loads(value)
        except ValueError:
            continue
    return out
