"""Collective test: every op over a sweep of sizes, exact checks, algbw and busbw per rank.

    torchrun ... collective.py --sizes 1K,64K,1M --iters 20 --warmup 5

Sizes follow nccl-tests: the whole buffer for all_reduce and broadcast, the gathered
output for all_gather and gather, the input for reduce_scatter. Bus bandwidth uses nccl-tests'
factors so numbers compare with theirs: all_reduce 2(n-1)/n, all_gather / reduce_scatter /
gather (n-1)/n, broadcast 1. Every result is checked exactly; a rank writes its JSON result and
exits non-zero when anything was wrong.
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import torch.distributed as dist

import _pairs
import _rank

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "gather", "barrier")
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "gather"):
        return (n - 1) / n
    return 1.0


class Case:
    """One op at one size: buffers, the call, and the exact check of its result."""

    def __init__(self, op, size_bytes, rank, n, device):
        self.op, self.rank, self.n = op, rank, n
        elem = 4  # float32; integers in these tests stay exact far past 512 ranks
        total = max(n, size_bytes // elem)
        total -= total % n
        self.count = total
        self.size_bytes = total * elem
        f = dict(dtype=torch.float32, device=device)
        chunk = total // n
        if op == "all_reduce":
            self.buf = torch.empty(total, **f)
        elif op == "all_gather":
            self.inp, self.out = torch.empty(chunk, **f), torch.empty(total, **f)
        elif op == "reduce_scatter":
            self.inp, self.out = torch.empty(total, **f), torch.empty(chunk, **f)
        elif op == "broadcast":
            self.buf = torch.empty(total, **f)
        elif op == "gather":
            self.inp = torch.empty(chunk, **f)
            self.outs = [torch.empty(chunk, **f) for _rank in range(n)] if rank == 0 else None
        self.chunk = chunk

    def reset(self):
        r = float(self.rank)
        if self.op == "all_reduce":
            self.buf.fill_(r + 1)
        elif self.op in ("all_gather", "gather"):
            self.inp.fill_(r)
        elif self.op == "reduce_scatter":
            # Chunk j of rank r holds r + j: after the sum, rank j holds sum_r(r) + n*j.
            self.inp.copy_(torch.arange(self.n, dtype=torch.float32, device=self.inp.device)
                           .repeat_interleave(self.chunk) + r)
        elif self.op == "broadcast":
            self.buf.fill_(42.0 if self.rank == 0 else -1.0)

    def run(self):
        if self.op == "all_reduce":
            dist.all_reduce(self.buf)
        elif self.op == "all_gather":
            dist.all_gather_into_tensor(self.out, self.inp)
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp)
        elif self.op == "broadcast":
            dist.broadcast(self.buf, src=0)
        elif self.op == "gather":
            dist.gather(self.inp, self.outs, dst=0)
        elif self.op == "barrier":
            dist.barrier()

    def wrong(self) -> int:
        """Number of wrong elements after the last run (0 when exact)."""
        n, r = self.n, self.rank
        if self.op == "all_reduce":
            return int((self.buf != n * (n + 1) / 2).sum())
        if self.op == "all_gather":
            want = torch.arange(n, dtype=torch.float32, device=self.out.device)
            return int((self.out.view(n, -1) != want[:, None]).sum())
        if self.op == "reduce_scatter":
            return int((self.out != n * (n - 1) / 2 + n * r).sum())
        if self.op == "broadcast":
            return int((self.buf != 42.0).sum())
        if self.op == "gather" and r == 0:
            return sum(int((t != float(i)).sum()) for i, t in enumerate(self.outs))
        return 0


def measure(case, warmup, iters, device):
    for _warm in range(warmup):
        case.run()
    case.reset()
    case.run()  # the checked run, from a known input
    _rank.sync(device)
    wrong = case.wrong()
    dist.barrier()
    start = time.perf_counter()
    for _iter in range(iters):
        case.run()
    _rank.sync(device)
    elapsed = (time.perf_counter() - start) / iters
    return elapsed, wrong


def batch_gathers(count, rank, n, device):
    """Back-to-back gathers of varying lengths to rank 0, as a trainer gathers generations."""
    wrong = 0
    start = time.perf_counter()
    for i in range(count):
        length = 1 + (i * 37) % 509
        inp = torch.full((length,), float(rank * 1000 + i), device=device)
        outs = [torch.empty(length, device=device) for _rank in range(n)] if rank == 0 else None
        dist.gather(inp, outs, dst=0)
        if rank == 0:
            wrong += sum(int((t != float(src * 1000 + i)).sum()) for src, t in enumerate(outs))
    _rank.sync(device)
    return {"count": count, "wrong": wrong, "time_s": round(time.perf_counter() - start, 6)}


class RoundBarrier:
    """Rounds start together through the rendezvous store on the master, not through the
    process group: a pair link that is cut must not hang the rounds of every other pair."""

    def __init__(self, n):
        from torch.distributed import distributed_c10d

        self.store, self.n = distributed_c10d._get_default_store(), n
        # A failing pair spends the process group's timeout on its exchange and may spend it
        # again on its ping-pong before it records the error; the ranks already at the
        # barrier wait that long and more (the store's own timeout is that timeout, once).
        self.timeout = datetime.timedelta(
            seconds=3 * _rank.env_int("TORCHFLEET_COLLECTIVE_TIMEOUT_S", 60))

    def wait(self, name):
        if self.store.add("torchfleet/isolate/" + name, 1) == self.n:
            self.store.set("torchfleet/isolate/%s/all" % name, "1")
        self.store.wait(["torchfleet/isolate/%s/all" % name], self.timeout)

    def fail(self, node, partner):
        """Marks both hosts of a failed pair, for every rank, before the next round's barrier
        lets anyone on: gloo closes a pair on a timeout and that host's other pairs fail after
        it, so its later rounds would name healthy links."""
        for host in (node, partner):
            self.store.set(self._failed_key(host), "1")

    def failed(self, node, partner):
        return any(self.store.check([self._failed_key(host)]) for host in (node, partner))

    @staticmethod
    def _failed_key(host):
        return "torchfleet/isolate/failed/%d" % host

    def next_pass(self, number, rank, sides, history, threshold):
        """The rounds of pass `number`, the same on every rank: each rank hands its sides of
        the pass before to the store, rank 0 reads them all, adds that pass's figures to
        history (its own) and plans the next (_pairs.next_pass); the others read its plan."""
        key = "torchfleet/isolate/pass-%d/" % (number - 1)
        self.store.set(key + str(rank), json.dumps(sides))
        plan = "torchfleet/isolate/plan-%d" % number
        if rank == 0:
            keys = [key + str(r) for r in range(self.n)]
            self.store.wait(keys, self.timeout)
            history.append(_pairs.pass_figures(
                [tuple(side) for k in keys for side in json.loads(self.store.get(k))]))
            self.store.set(plan, json.dumps(_pairs.next_pass(history, threshold)))
        self.store.wait([plan], self.timeout)
        return [[tuple(pair) for pair in r] for r in json.loads(self.store.get(plan))]


def best_seconds(step, iters, device):
    """Fastest of iters timed calls (after one untimed): a busy CPU or a neighbour's burst can
    slow one call, a slow NIC or link slows every one of them."""
    step()
    best = float("inf")
    for _iter in range(iters):
        _rank.sync(device)
        start = time.perf_counter()
        step()
        _rank.sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def exchange(peer, size_bytes, iters, device):
    """(seconds, bytes) of the fastest simultaneous exchange of size_bytes both ways with peer:
    send and receive are in flight together, so each direction is measured under the other's
    load."""
    send = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    recv = torch.empty_like(send)

    def once():
        for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer),
                                           dist.P2POp(dist.irecv, recv, peer)]):
            req.wait()

    return best_seconds(once, iters, device), send.numel() * 4


def ping_pong(peer, first, size_bytes, iters, device):
    """One-way latency in microseconds: half of the fastest round trip of a small message."""
    buf = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32, device=device)

    def once():
        if first:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)

    return best_seconds(once, iters, device) / 2 * 1e6


def isolate(name, size_bytes, small_bytes, iters, device, passes, threshold):
    """The pair rounds (_pairs.py) between hosts: local rank l of one host exchanges with local
    rank l of its partner, so every rank's path to the network is measured. The schedule is
    the first pass; each later one (at most passes in all) measures only what that pass left
    in doubt: a suspect pair again, a suspect host against a host shown good (_pairs.next_pass
    with threshold, the verdict's). A clean first pass is the only one. One record per round
    this rank took part in; a pair that fails records its error, its two hosts sit out the
    later rounds (above) and the others' rounds go on."""
    rank, n = dist.get_rank(), dist.get_world_size()
    per_node = _rank.env_int("LOCAL_WORLD_SIZE", 1)
    node, local = rank // per_node, rank % per_node
    rounds = _pairs.schedule(name, n // per_node)
    barrier, records, begin = RoundBarrier(n), [], time.perf_counter()
    history, pass_rounds = [], []  # history: rank 0's, every pass's figures
    for number in range(passes):
        if number:
            rounds = barrier.next_pass(number, rank, [
                (r["node"], r["peer_node"], local, r["round"], r["busbw_gbs"], r["error"])
                for r in records if r["pass"] == number - 1], history, threshold)
        if not rounds:
            break
        pass_rounds.append(len(rounds))
        for k, pairs in enumerate(rounds):
            barrier.wait("pass-%d-round-%d" % (number, k))
            partner = next((b if a == node else a for a, b in pairs if node in (a, b)), None)
            if partner is None or barrier.failed(node, partner):
                continue  # sitting out this round (not in it, or a failed pair's host)
            peer = partner * per_node + local
            rec = {"pass": number, "round": k, "node": node, "peer_node": partner, "peer": peer,
                   "size_bytes": size_bytes, "busbw_gbs": None, "latency_us": None,
                   "error": None}
            try:
                seconds, sent = exchange(peer, size_bytes, iters, device)
                rec.update(size_bytes=sent, busbw_gbs=sent / seconds / 1e9,
                           latency_us=ping_pong(peer, node < partner, small_bytes, 20, device))
            except Exception as exc:  # the pair is named with this error; the rounds go on
                rec["error"] = ("%s: %s" % (type(exc).__name__, exc))[:300]
                barrier.fail(node, partner)
            records.append(rec)
            said = rec["error"] or "busbw %.3f GB/s, latency %.1f us" % (
                rec.get("busbw_gbs") or 0.0, rec.get("latency_us") or 0.0)
            _rank.log("pair pass %d round %d with node %d: %s" % (number, k, partner, said))
    barrier.wait("end")
    return {"schedule": name, "rounds": pass_rounds[0] if pass_rounds else 0,
            "passes": len(pass_rounds), "pass_rounds": pass_rounds, "size_bytes": size_bytes,
            "small_bytes": small_bytes, "iters": iters,
            "time_s": round(time.perf_counter() - begin, 3), "pairs": records}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1K,64K,1M")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-gathers", type=int, default=50)
    parser.add_argument("--isolate", choices=("",) + _pairs.SCHEDULES, default="",
                        help="after the sweep, pair rounds between hosts with this schedule")
    parser.add_argument("--pair-size", default="4M", help="message of a pair's busbw")
    parser.add_argument("--pair-small", default="4", help="message of a pair's latency")
    parser.add_argument("--pair-iters", type=int, default=5)
    parser.add_argument("--pair-passes", type=int, default=3,
                        help="the most passes: the schedule, then only what is in doubt")
    parser.add_argument("--pair-threshold", type=float, default=0.5,
                        help="a pair is slow below this fraction of the reference (the "
                             "verdict's collective_isolate_threshold)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    ops = [op for op in args.ops.split(",") if op]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise SystemExit("unknown op(s) %s; choose from %s" % (unknown, ", ".join(OPS)))

    backend, device, init_s = _rank.init()
    rank, n = dist.get_rank(), dist.get_world_size()
    result = dict(_rank.identity(), kind="collective", backend=backend, device=str(device),
                  init_s=round(init_s, 6), results=[], ok=False)
    _rank.log("joined: world %d, backend %s, %.2f s" % (n, backend, init_s))
    for op in ops:
        for size in ([0] if op == "barrier" else sizes):
            case = Case(op, size, rank, n, device)
            elapsed, wrong = measure(case, args.warmup, args.iters, device)
            algbw = case.size_bytes / elapsed / 1e9 if op != "barrier" else 0.0
            result["results"].append({
                "op": op, "size_bytes": 0 if op == "barrier" else case.size_bytes,
                "count": 0 if op == "barrier" else case.count, "time_us": elapsed * 1e6,
                "algbw_gbs": algbw, "busbw_gbs": algbw * bus_factor(op, n), "wrong": wrong})
            _rank.log("%-14s %10d B  %10.1f us  busbw %8.3f GB/s  wrong %d" % (
                op, result["results"][-1]["size_bytes"], elapsed * 1e6,
                result["results"][-1]["busbw_gbs"], wrong))
    result["batch_gathers"] = batch_gathers(args.batch_gathers, rank, n, device)
    if args.isolate:
        result["isolate"] = isolate(args.isolate, parse_size(args.pair_size),
                                    parse_size(args.pair_small), args.pair_iters, device,
                                    args.pair_passes, args.pair_threshold)
    # A slow or broken pair is the isolation verdict's to name (on the controller), not a
    # wrong result of this rank.
    result["ok"] = (all(r["wrong"] == 0 for r in result["results"])
                    and result["batch_gathers"]["wrong"] == 0)
    _rank.write_result(result)
    dist.destroy_process_group()
    _rank.log("done: %s" % ("all results exact" if result["ok"] else "WRONG RESULTS"))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    _rank.exit_now(main())
