"""The fleet's ledger's storage (docs/ledger.md "Schema"): the engines, the schema and its
migrations, the transactions and the rows; what a record means (what counts, the score,
quarantine) is reports/ledger.py's, as Alembic keeps migrations apart from models.

One schema for SQLite (the default: fleet.db in the runs root, WAL mode and a busy timeout, so
several controllers on one machine write at once) and PostgreSQL (fleet_db=postgresql://...,
controllers on several login nodes), through SQLAlchemy Core. The controller's side only.

Fail open: no method of Store raises. A ledger that is missing its driver, locked past its
timeout, corrupt or of a newer schema turns the Store off after one sentence in `warnings`
(the fleet.ledger check's message: the ledger, what failed, the fix); the run never pays for it.
"""
from __future__ import annotations

import json
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
from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.goodput import finite

SCHEMA_VERSION = 3
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
                  3: lambda conn: METADATA.create_all(conn, tables=[ACTIONS])}
else:  # the names still import (ledger.py, ansible-test's import check); Store says why not
    METADATA = META = RUNS = INCIDENTS = HOSTS = EVENTS = ACTIONS = None
    MIGRATIONS = {}


class NewerSchema(Exception):
    pass


def describe(fleet_db):
    """The ledger as a sentence names it: the path, or the URL without its password."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", fleet_db)


def _url(fleet_db, runs_root):
    """(SQLAlchemy URL, path or None) of fleet_db: a postgresql:// URL (psycopg 3 unless a
    driver is named), else a SQLite path, relative to runs_root when relative."""
    if re.match(r"^postgres(ql)?(\+\w+)?://", fleet_db):
        url = re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", fleet_db)
        return url, None
    path = os.path.join(runs_root or ".", os.path.expanduser(fleet_db))
    return "sqlite:///" + os.path.abspath(path), os.path.abspath(path)


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
        text = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        low = text.lower()
        if isinstance(exc, NewerSchema):
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
                if not self.create and not os.path.exists(path):
                    self._fail("does not exist", "it is written at every preflight's and "
                               "run's end; or give --fleet-db")
                    return None
                os.makedirs(os.path.dirname(path), exist_ok=True)
                # One connection kept for the Fleet's life: the last one to close a WAL
                # database checkpoints it (12 ms a write at 512 hosts).
                engine = sa.create_engine(url, poolclass=SingletonThreadPool,
                                          connect_args={"timeout": self.timeout_s,
                                                        "isolation_level": None,
                                                        "check_same_thread": False})
                sa.event.listen(engine, "connect", _sqlite_connect)
                sa.event.listen(engine, "begin", _sqlite_begin)
            else:
                ms = int(self.timeout_s * 1000)
                engine = sa.create_engine(url, pool_size=1, max_overflow=2, connect_args={
                    "connect_timeout": max(1, int(self.timeout_s)),
                    "options": "-c lock_timeout=%d -c statement_timeout=%d" % (ms, 6 * ms)})
            self._engine = engine
            self._migrate()
            return self._engine
        except Exception as exc:  # fail open: any failure is one warning
            self._failed(exc)
            return None

    def _migrate(self):
        with self._write() as conn:
            if conn.dialect.name == "postgresql":  # one controller migrates at a time
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(6060)"))
            version = 0
            if sa.inspect(conn).has_table(META.name):
                found = conn.execute(sa.select(META.c.value).where(
                    META.c.key == "schema_version")).scalar()
                version = int(found) if found and str(found).isdigit() else 0
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
    """({host: {kind: count}}, {host: its newest incident's at}) since `start` (None: ever)."""
    q = sa.select(INCIDENTS.c.host, INCIDENTS.c.kind, sa.func.count(),
                  sa.func.max(INCIDENTS.c.at)).group_by(INCIDENTS.c.host, INCIDENTS.c.kind)
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


def drained_since(conn, start):
    """The hosts torchfleet drained in Slurm (a drain action done) at `start` or later."""
    q = sa.select(ACTIONS.c.host).where(ACTIONS.c.action == "drain",
                                        ACTIONS.c.done.is_(True), ACTIONS.c.at >= start,
                                        ACTIONS.c.host != "").distinct()
    return {host for (host,) in conn.execute(q)}


def actions_of(conn, host, start, limit):
    """The newest `limit` actions of `host` (and the whole run's, host "", of its runs) dated
    `start` or later (None: ever), newest first."""
    q = sa.select(ACTIONS).where(ACTIONS.c.host == host).order_by(
        ACTIONS.c.at.desc(), ACTIONS.c.id.desc()).limit(limit)
    if start is not None:
        q = q.where(ACTIONS.c.at >= start)
    return [r._asdict() for r in conn.execute(q)]
