"""Decode throughput with and without a structured-output grammar, side by side, same engine.

Runs `--rows` branches of `--tokens` tokens each through the engine (`LLM.generate`), once plain
and once with the grammar mask (a JSON schema via xgrammar; the rows never finish early: the schema
is an array of booleans long enough to outlast the budget, and EOS is ignored), interleaved, best
of --repeat. Prints tokens/s for both and the ratio (grammar / plain), plus the sampler's share:
the same comparison on the sampler alone over random logits.

    python benchmarks/structured_output.py [--model tiny-qwen3.5] [--rows 8] [--tokens 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from radixflow.engine.llm import LLM  # noqa: E402
from radixflow.engine.sampling import RowContext, Sampler, SamplingParams  # noqa: E402
from radixflow.engine.structured import GrammarSpec, GrammarState  # noqa: E402
from timing import timed_pair  # noqa: E402

SCHEMA = {"type": "array", "items": {"type": "boolean"}, "minItems": 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-qwen3.5")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    llm = LLM(args.model, kv_cache_memory=64 << 20, max_model_len=4096)
    grammar = llm.engine.grammar_compiler.compile(GrammarSpec("json_schema", json.dumps(SCHEMA), False))
    prompts = [[ord("a") + i % 26] * 8 for i in range(args.rows)]
    base = dict(max_tokens=args.tokens, ignore_eos=True, temperature=1.0, seed=0)
    plain = [SamplingParams(**base) for _ in prompts]
    constrained = [SamplingParams(**base, grammar=grammar) for _ in prompts]

    def run(params):
        def go():
            outs = llm.generate(prompts, params)
            assert all(len(o.outputs[0].token_ids) == args.tokens for o in outs)
        return go

    t_plain, t_grammar = timed_pair(run(plain), run(constrained), args.repeat)
    n = args.rows * args.tokens
    print(f"engine, {args.model}, {args.rows} rows x {args.tokens} tokens")
    print(f"  plain    {n / t_plain:9.1f} tok/s")
    print(f"  grammar  {n / t_grammar:9.1f} tok/s   ratio grammar/plain = {t_plain / t_grammar:.3f}")

    vocab = llm.engine.vocab_size
    logits = torch.randn(args.rows, vocab, generator=torch.Generator().manual_seed(0))
    sampler = Sampler()

    def sample(with_grammar: bool):
        def go():
            states = [GrammarState(grammar) if with_grammar else None for _ in range(args.rows)]
            params = constrained if with_grammar else plain
            gens = [torch.Generator().manual_seed(i) for i in range(args.rows)]
            outs: list[list[int]] = [[] for _ in range(args.rows)]
            for _ in range(args.tokens):
                ctx = [RowContext(output=outs[i], grammar=states[i]) for i in range(args.rows)]
                chosen = sampler(logits, params, gens, ctx).token_ids
                for i, t in enumerate(chosen):
                    outs[i].append(t)
                    if states[i] is not None:
                        states[i].accept(t)
        return go

    s_plain, s_grammar = timed_pair(sample(False), sample(True), args.repeat)
    print(f"sampler only, vocab {vocab}")
    print(f"  plain    {n / s_plain:9.1f} tok/s")
    print(f"  grammar  {n / s_grammar:9.1f} tok/s   ratio grammar/plain = {s_plain / s_grammar:.3f}")
    print(f"  grammar cost per token: {(s_grammar - s_plain) / n * 1e6:.1f} us")


if __name__ == "__main__":
    main()
