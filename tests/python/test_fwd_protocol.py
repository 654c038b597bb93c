"""A barrier-level model of the persistent Hopper forward's protocol (src/cuda/sm90/fwd_kernel.cuh:
fwd_persistent_kernel's producer, fwd_produce_kv with K and V apart, fwd_consume): the producer warpgroup and the two consumers as generators of barrier operations,
written after the kernel's code and run under random interleavings on random item sequences (gaps,
items no row of which sees a key, items of one to four K/V tiles, partial last tiles). Checks: no
deadlock, no mbarrier waited on once it has moved two phases past the wanted one (the parity would
alias), no named-barrier generation over-filled, every item taken in order by both consumers, and
the ping-pong barriers balanced at the end. A change to the kernel's barrier protocol changes this
model with it.
"""
import random
import sys

S, NQ = 2, 2  # K/V stages, Q buffers


class MBar:
    def __init__(self, count):
        self.count, self.arrived, self.done = count, 0, 0  # done: completed phases

    def arrive(self, n=1):
        self.arrived += n
        assert self.arrived <= self.count, "mbarrier over-arrived"
        if self.arrived == self.count:
            self.arrived, self.done = 0, self.done + 1


class NBar:
    def __init__(self, count):
        self.count, self.arrived, self.gen = count, 0, 0

    def add(self, n):
        self.arrived += n
        assert self.arrived <= self.count, "named barrier over-filled"
        if self.arrived == self.count:
            self.arrived, self.gen = 0, self.gen + 1


class World:
    def __init__(self):
        self.q_full = [MBar(1) for _ in range(NQ)]
        self.q_empty = [MBar(2) for _ in range(NQ)]  # two consumers
        self.full_k = [MBar(1) for _ in range(S)]
        self.full_v = [MBar(1) for _ in range(S)]
        self.empty_k = [MBar(2) for _ in range(S)]
        self.empty_v = [MBar(2) for _ in range(S)]
        self.nb = {2: NBar(2), 3: NBar(2)}
        self.items = [None] * NQ
        self.log = {0: [], 1: []}


# Operations yielded by agents: ("wait", mbar, phase_index) blocks until mbar.done > phase_index;
# ("sync", id) adds and blocks until the generation completes; ("arrive_nb", id); ("do", fn).

def producer(w, work):
    g, t = 0, 0

    def wait_q_buffer():
        if t >= NQ:
            yield ("wait", w.q_empty[t % NQ], t // NQ - 1)

    for it in work:
        if it is None:  # a gap: skipped
            continue
        yield from wait_q_buffer()
        b = t % NQ
        yield ("do", lambda b=b, it=it: w.items.__setitem__(b, it))
        yield ("do", lambda b=b: w.q_full[b].arrive())
        t += 1
        if it["n"] == 0:
            continue
        for i in range(it["n"]):
            s = g % S
            partial = it["partial"] and i == it["n"] - 1
            if not partial:
                if g >= S:
                    yield ("wait", w.empty_k[s], g // S - 1)
                yield ("do", lambda s=s: w.full_k[s].arrive())
                if g >= S:
                    yield ("wait", w.empty_v[s], g // S - 1)
                yield ("do", lambda s=s: w.full_v[s].arrive())
            else:
                if g >= S:
                    yield ("wait", w.empty_k[s], g // S - 1)
                    yield ("wait", w.empty_v[s], g // S - 1)
                yield ("do", lambda s=s: (w.full_k[s].arrive(), w.full_v[s].arrive()))
            g += 1
    yield from wait_q_buffer()
    yield ("do", lambda b=t % NQ: w.items.__setitem__(b, {"valid": False}))
    yield ("do", lambda b=t % NQ: w.q_full[b].arrive())


def consumer(w, cw):
    # A consumer with no row inside the segment (fwd_consume's path without products) runs this
    # same sequence of waits, turns and releases.
    g, t = 0, 0

    def my_turn():
        yield ("sync", 2 if cw == 0 else 3)

    def pass_turn():
        yield ("arrive_nb", 3 if cw == 0 else 2)

    # The turns run across items: consumer 1 gives consumer 0 the CTA's first turn, passes on
    # after every item's last P V, and consumer 0 takes that last pass before it exits.
    if cw == 1:
        yield ("arrive_nb", 2)  # consumer 0 goes first
    while True:
        b = t % NQ
        yield ("wait", w.q_full[b], t // NQ)
        it = w.items[b]
        if not it.get("valid", True):
            if cw == 0:
                yield from my_turn()
            break
        w.log[cw].append(it["id"])
        if it["n"] == 0:
            yield ("do", lambda b=b: w.q_empty[b].arrive())
            t += 1
            continue
        n = it["n"]
        yield ("wait", w.full_k[g % S], g // S)
        yield from my_turn()
        yield from pass_turn()
        yield ("do", lambda s=g % S: w.empty_k[s].arrive())
        for i in range(1, n):
            gi = g + i
            yield ("wait", w.full_k[gi % S], gi // S)
            yield ("wait", w.full_v[(gi - 1) % S], (gi - 1) // S)
            yield from my_turn()
            yield from pass_turn()
            yield ("do", lambda s=gi % S: w.empty_k[s].arrive())
            yield ("do", lambda s=(gi - 1) % S: w.empty_v[s].arrive())
        last = g + n - 1
        yield ("wait", w.full_v[last % S], last // S)
        yield from my_turn()
        yield from pass_turn()  # consumer 1's pass: consumer 0's first turn of the next item
        yield ("do", lambda s=last % S: w.empty_v[s].arrive())
        yield ("do", lambda b=b: w.q_empty[b].arrive())  # the epilogue is done with Q buffer b
        g += n
        t += 1


def run(work, rng):
    w = World()
    agents = {"P": producer(w, work), 0: consumer(w, 0), 1: consumer(w, 1)}
    pending = {k: None for k in agents}  # the op an agent is blocked on
    waiting_gen = {}
    done = set()
    steps = 0
    while len(done) < len(agents):
        steps += 1
        runnable = []
        for k, op in pending.items():
            if k in done:
                continue
            if op is None:
                runnable.append(k)
            elif op[0] == "wait":
                mb, ph = op[1], op[2]
                assert mb.done <= ph + 1, f"{k}: parity aliasing (barrier {mb.done} phases, wants {ph})"
                if mb.done > ph:
                    runnable.append(k)
            elif op[0] == "sync_blocked":
                if w.nb[op[1]].gen > op[2]:
                    runnable.append(k)
        if not runnable:
            raise AssertionError(f"deadlock after {steps} steps: {pending}")
        k = rng.choice(runnable)
        pending[k] = None
        try:
            op = next(agents[k])
        except StopIteration:
            done.add(k)
            continue
        if op[0] == "do":
            op[1]()
        elif op[0] == "arrive_nb":
            w.nb[op[1]].add(1)
        elif op[0] == "sync":
            gen = w.nb[op[1]].gen
            w.nb[op[1]].add(1)
            pending[k] = ("sync_blocked", op[1], gen)
        elif op[0] == "wait":
            pending[k] = op
    assert all(nb.arrived == 0 for nb in w.nb.values()), "a named barrier left half-arrived"
    ids = [it["id"] for it in work if it is not None]
    assert w.log[0] == ids and w.log[1] == ids, (w.log, ids)


def random_work(rng):
    work = []
    for i in range(rng.randint(0, 9)):
        r = rng.random()
        if r < 0.1:
            work.append(None)  # gap
        elif r < 0.25:
            work.append({"id": i, "n": 0, "partial": False})  # unseen
        else:
            work.append({"id": i, "n": rng.randint(1, 4), "partial": rng.random() < 0.4})
    return work


def test_protocol_random_sequences_and_interleavings():
    rng = random.Random(20261201)
    for _ in range(6000):
        run(random_work(rng), rng)


if __name__ == "__main__":
    rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    for trial in range(20000):
        run(random_work(rng), rng)
    print("ok: 20000 random item sequences and interleavings")
