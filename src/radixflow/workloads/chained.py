"""Chained producers (the source paper's open question on the `D` term of SPEC §9's bound): each
question appends a segment to the previous question's context of the same document.

Question i of a document reads `document + segment_1 + ... + segment_i`: its prefix is question
i-1's whole prompt, so its best state boundary lies at the end of question i-1's fragment. Without
in-forward hand-off (SPEC §15) every link waits one round for the state before it (dependency depth
D = questions per document, K >= D); with L levels per forward K >= ⌈D / L⌉. Records are trace
records (workloads/trace.py: segments), all arriving at once so the bound applies.
"""

from __future__ import annotations


def chained_records(documents: int = 2, questions: int = 8, document_len: int = 512, segment_len: int = 256,
                    max_new_tokens: int = 1, arrival_gap: float = 0.0) -> list[dict]:
    """`documents` chains of `questions` links; question i of document d has `document_len + i *
    segment_len` tokens (i from 1). Native order: document by document, link by link."""
    if documents < 1 or questions < 1 or document_len < 1 or segment_len < 1:
        raise ValueError("chained workload: documents, questions and both lengths must be >= 1")
    recs, t = [], 0.0
    for d in range(documents):
        context = [{"id": f"chain{d}:doc", "len": document_len}]
        for i in range(1, questions + 1):
            context = [*context, {"id": f"chain{d}:seg{i}", "len": segment_len}]
            recs.append({"request_id": f"chain{d}.q{i}", "branch": 0, "arrival": t, "namespace": f"chain{d}",
                         "max_new_tokens": max_new_tokens, "segments": list(context)})
            t += arrival_gap
    return recs
