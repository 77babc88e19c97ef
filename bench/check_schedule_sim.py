#!/usr/bin/env python3
"""How long `flashtile check`'s batches keep its threads busy: a simulation.

Draws dense shapes (variants are not modelled) with the distribution of
tools/flashtile/check.cpp's random_dense_shape (lengths from its list or uniform, head
dims, batch, GQA), costs each draw as its oracle's work
(batch·Sq·Sk·heads_q·head_dim, plus a fixed part), and runs batches on T threads with
OpenMP's dynamic schedule: in draw order, 4 draws a thread (the old batches), against
heaviest first, 32 draws a thread (the current ones). Prints the time of each relative to a
perfect split of the work. A model, not a measurement: it predicts the gain to measure.

    python3 bench/check_schedule_sim.py --threads 16 --draws 10000
"""
import argparse
import heapq
import random

LENGTHS = [1, 2, 17, 31, 63, 64, 65, 113, 127, 128, 129, 200, 255, 257, 1023, 1025]
HEAD_DIMS = [32, 64, 128, 64, 128, 8, 16, 40, 72, 96, 256]


def draw_cost(rng, max_seqlen=1025, fixed=2e4):
    def length():
        return rng.randint(1, max_seqlen) if rng.random() < 1 / 3 else rng.choice(LENGTHS)
    sq, sk, d = length(), length(), rng.choice(HEAD_DIMS)
    batch, heads_kv = 1 + rng.randrange(2), 1 + rng.randrange(3)
    return batch * sq * sk * heads_kv * (1 + rng.randrange(3)) * d + fixed


def makespan(costs, threads, order):
    free = [0.0] * threads  # when each thread is next free; the next draw goes to the first
    for i in order:
        heapq.heappush(free, heapq.heappop(free) + costs[i])
    return max(free)


def schedule(costs, threads, batch, heaviest_first):
    total = 0.0
    for start in range(0, len(costs), batch):
        c = costs[start:start + batch]
        order = sorted(range(len(c)), key=lambda i: -c[i]) if heaviest_first else range(len(c))
        total += makespan(c, threads, order)
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--draws", type=int, default=10000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    costs = [draw_cost(rng) for _ in range(a.draws)]
    ideal = sum(costs) / a.threads
    old = schedule(costs, a.threads, 4 * a.threads, False)
    new = schedule(costs, a.threads, 32 * a.threads, True)
    print(f"threads {a.threads}, draws {a.draws}: draw order, 4 a thread: {ideal / old:.0%} busy; "
          f"heaviest first, 32 a thread: {ideal / new:.0%} busy; predicted speedup {old / new:.2f}x")


if __name__ == "__main__":
    main()
