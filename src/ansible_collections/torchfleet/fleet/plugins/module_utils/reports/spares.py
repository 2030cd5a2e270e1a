"""Which candidates a run uses when preflight checked spares (`spares=K`): the first nnodes
candidates where healthy, the spares taking the others' places healthiest first (the fleet's
ledger's lowest score; inventory order among equals, so without a ledger the first nnodes
healthy in inventory order), ranked in inventory order; every other candidate named with why.
A host the ledger quarantined is left out like an unhealthy one while the others suffice; when
they do not, the healthiest quarantined ones fill the run (preflight says so: host.quarantined).

A host is healthy when it has no failed error check of its own. What a worker found about the
master's ports and route says nothing about the worker when the master is the broken one: the
master is held to blame when it failed a check itself or when most workers could not reach its
ports, and then the workers' master-bound results do not count against them. The chosen hosts'
port test was made against another master in that case; the playbook tests them again
(`retest`) before the run starts. The master tested is the first candidate, or the first one
preflight reached (the ones before it are not reached: no port was tested against them).
"""
from __future__ import annotations

from ansible_collections.torchfleet.fleet.plugins.module_utils.reports.records import (
    CONTROLLER, ERROR, WARNING, check, failed, fmt_hosts)

# Checks a worker decides against the master it was tested with.
MASTER_BOUND = ("port.blocked", "port.ephemeral", "nic.route")


def failing(checks):
    """{host: [failed error check ids]} in the order the checks came."""
    out = {}
    for c in failed(checks):
        if c["host"] != CONTROLLER:
            out.setdefault(c["host"], []).append(c["id"])
    return out


def master_to_blame(master, workers, bad):
    """True when the tested master is the broken one: its own failure, or most of the workers
    (more than half) failing a check bound to it."""
    if master in bad:
        return True
    bound = [h for h in workers if any(cid in MASTER_BOUND for cid in bad.get(h, []))]
    return bool(workers) and len(bound) * 2 > len(workers)


def choose(hosts, nnodes, checks, master=None, scores=None, quarantined=()):
    """(chosen hosts, {skipped host: failed ids}, retest): the first nnodes candidates where
    healthy and not `quarantined`, the others' places taken by the healthy candidates of lowest
    `scores` ({host: the ledger's score}), quarantined ones last; retest when the master changed:
    the tested one (`master`, else the first) was to blame, or the ledger left it out."""
    master = master if master in hosts else hosts[0]
    bad = failing(checks)
    # The workers tested against it; the hosts before it were not reached.
    blamed = master_to_blame(master, hosts[hosts.index(master) + 1:], bad)
    if blamed:
        # No failure of its own: most workers could not reach its ports.
        bad.setdefault(master, ["port.blocked (from the workers)"])
        for host in hosts[hosts.index(master) + 1:]:
            own = [cid for cid in bad.get(host, []) if cid not in MASTER_BOUND]
            if own:
                bad[host] = own
            else:
                bad.pop(host, None)
    healthy = [h for h in hosts if h not in bad]
    kept = [h for h in hosts[:nnodes] if h not in bad and h not in quarantined]
    # sorted() is stable: equal scores keep inventory order.
    scores = scores or {}
    others = sorted((h for h in healthy if h not in kept),
                    key=lambda h: (h in quarantined, scores.get(h) or 0.0))
    taken = set(kept + others[:nnodes - len(kept)])
    chosen = [h for h in hosts if h in taken]
    # A master inventory order would have taken and the ledger left out: the chosen hosts'
    # ports were tested against it.
    moved = master in healthy[:nnodes] and master not in taken
    for host in others[nnodes - len(kept):]:
        if host in quarantined:
            bad[host] = ["host.quarantined"]
    return chosen, {h: bad[h] for h in hosts if h in bad}, (blamed or moved) and bool(chosen)


def too_few(hosts, nnodes, skipped):
    """The controller's error when fewer than nnodes candidates are healthy: the counts and
    every failing host (their own checks stay errors)."""
    text = ", ".join("%s (%s)" % (h, ", ".join(ids)) for h, ids in skipped.items())
    return check("host.skipped", CONTROLLER, False,
                 "%d of %d candidate host(s) are healthy and nnodes=%d needs %d; failing: %s"
                 % (len(hosts) - len(skipped), len(hosts), nnodes, nnodes, text or "none"),
                 "fix the hosts named, or add spares (-e spares=K checks K more hosts of group "
                 "`nodes`)")


def skipped_records(hosts, checks, chosen, skipped, blamed=False):
    """The records of the candidates the run does not use: each skipped host's failed checks
    become warnings (the run is whole without it) with one host.skipped warning naming them;
    a healthy spare left over gets a passed host.skipped, and with the master to blame
    (`blamed`) its checks against that master are warnings too (only the chosen hosts are
    tested again)."""
    out = []
    for c in checks:
        if c["host"] in chosen or c["host"] == CONTROLLER:
            continue
        stale = blamed and c["id"] in MASTER_BOUND
        if (c["host"] in skipped or stale) and not c["ok"] and c["severity"] == ERROR:
            c = dict(c, severity=WARNING, detail="(not used) " + c["detail"])
        out.append(c)
    for host in hosts:
        if host in chosen:
            continue
        if host in skipped:
            out.append(check("host.skipped", host, False,
                             "not used: failed %s; the run uses %s"
                             % (", ".join(skipped[host]), fmt_hosts(chosen)),
                             "fix %s (its checks above) before it is needed" % host, WARNING))
        else:
            out.append(check("host.skipped", host, True, "a healthy spare, not needed"))
    return out


def summary(choice):
    """The table's last word on the choice: who runs, who does not and why."""
    left = [h for h in choice["candidates"] if h not in choice["chosen"]]
    reasons = ["%s (%s)" % (h, ", ".join(choice["skipped"][h])) if h in choice["skipped"]
               else "%s (healthy spare)" % h for h in left]
    return "spares: the run uses %s; not used: %s" % (", ".join(choice["chosen"]),
                                                      ", ".join(reasons) or "none")
