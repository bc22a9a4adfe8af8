"""Prefix-index match and insert throughput for 8k-token prompts over a tree of 10,000 cached prompts."""

from __future__ import annotations

import argparse
import random
import time

from radixflow.cache.pool import IdPool
from radixflow.cache.radix import RadixIndex, chain_hashes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--shared", type=int, default=2048, help="tokens of a system prefix every prompt shares")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--queries", type=int, default=2000)
    args = ap.parse_args()
    bs, n, L = args.block_size, args.prompts, args.prompt_len
    rng = random.Random(0)
    shared = [rng.randrange(32000) for _ in range(args.shared)]
    pages_per = L // bs
    uniq_pages = (L - args.shared) // bs
    idx = RadixIndex(bs, IdPool(args.shared // bs + n * uniq_pages + 10 * pages_per, "page"), IdPool(1, "slot"))

    def prompt(i: int) -> tuple[int, ...]:
        r = random.Random(i + 1)
        return tuple(shared + [r.randrange(32000) for _ in range(L - args.shared)])

    t_hash = t_ins = 0.0
    for i in range(n):
        toks = prompt(i)
        t0 = time.perf_counter()
        h = chain_hashes("ns", toks, bs)
        t1 = time.perf_counter()
        m = idx.match(h)
        have = m.depth // bs
        pages = idx.pages.allocate(pages_per - have)
        idx.insert("ns", toks, h, [0] * have + pages, pages_per, float(i))
        t_ins += time.perf_counter() - t1
        t_hash += t1 - t0
    idx.publish()
    print(f"tree: {n:,} prompts x {L:,} tokens ({idx.num_cached_pages:,} cached pages)")
    print(f"insert: {n / t_ins:,.0f} prompts/s ({n * L / t_ins / 1e6:,.1f} M tokens/s) "
          f"+ hashing {n / t_hash:,.0f} prompts/s")
    queries = []
    for q in range(args.queries):
        i = rng.randrange(n)
        toks = prompt(i)[: rng.randrange(args.shared, L)] if q % 2 else prompt(n + q)
        queries.append(chain_hashes("ns", toks, bs))
    t0 = time.perf_counter()
    hit = 0
    for h in queries:
        hit += idx.match(h).depth
    dt = time.perf_counter() - t0
    print(f"match: {len(queries) / dt:,.0f} lookups/s over 8k-token prompts "
          f"({dt / len(queries) * 1e6:.1f} µs each; mean hit {hit / len(queries):,.0f} tokens)")


if __name__ == "__main__":
    main()
