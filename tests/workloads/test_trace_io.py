import json

import pytest

from radixflow.workloads.qa import paper_questions, stream_records
from radixflow.workloads.trace import TraceError, load_trace, segment_tokens, write_trace


def _write(tmp_path, recs):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


GOOD = {"request_id": "r", "branch": 0, "arrival": 0.0, "namespace": "n", "max_new_tokens": 1,
        "segments": [{"id": "doc", "len": 10}]}


def test_segments_share_prefix_deterministically():
    assert segment_tokens("doc", 10) == segment_tokens("doc", 10)
    assert segment_tokens("doc", 10) != segment_tokens("doc2", 10)


def test_roundtrip_and_tokens_form(tmp_path):
    p = _write(tmp_path, [GOOD, {**GOOD, "branch": 1, "segments": None, "tokens": [1, 2, 3]}])
    recs = [GOOD, {k: v for k, v in {**GOOD, "branch": 1, "tokens": [1, 2, 3]}.items() if k != "segments"}]
    write_trace(p, recs)
    brs = load_trace(p)
    assert brs[1].prompt == (1, 2, 3) and len(brs[0].prompt) == 10


def test_priority_is_optional_and_kept(tmp_path):
    p = _write(tmp_path, [GOOD, {**GOOD, "branch": 1, "priority": -2}])
    assert [b.priority for b in load_trace(p)] == [0, -2]


@pytest.mark.parametrize("bad,msg", [
    ({k: v for k, v in GOOD.items() if k != "arrival"}, "missing field 'arrival'"),
    ({**GOOD, "segments": [{"id": "d", "len": -3}]}, "negative"),
    ({**GOOD, "max_new_tokens": 0}, "max_new_tokens"),
    ({**GOOD, "arrival": -1}, "arrival"),
    ({**GOOD, "tokens": [1]}, "exactly one"),
    ({**GOOD, "priority": "high"}, "priority"),
])
def test_bad_lines_name_the_problem(tmp_path, bad, msg):
    p = _write(tmp_path, [bad])
    with pytest.raises(TraceError, match=msg) as e:
        load_trace(p)
    assert ":1:" in str(e.value)


def test_qa_streams_have_four_branches_per_question_and_namespaces():
    qs = paper_questions(0, 30)
    assert len(qs) == 30
    cold = stream_records(qs, "cold", "forward", 5.0, 0)
    reuse = stream_records(qs, "reuse", "reverse", 5.0, 0)
    assert len(cold) == len(reuse) == 120
    assert len({r["namespace"] for r in cold}) == 30 and len({r["namespace"] for r in reuse}) == 1
    arrivals = [r["arrival"] for r in cold]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    assert reuse[0]["request_id"] == qs[-1].qid


def test_branch_gap_spreads_a_questions_branches():
    qs = paper_questions(0, 5)
    together = stream_records(qs, "cold", "forward", 5.0, 0)
    spread = stream_records(qs, "cold", "forward", 5.0, 0, branch_gap=0.002)
    by_q = {}
    for r in spread:
        by_q.setdefault(r["request_id"], []).append(r["arrival"])
    assert all(a == sorted(a) and a[-1] > a[0] for a in by_q.values())
    firsts = [r["arrival"] for r in spread if r["branch"] == 0]
    assert firsts == [r["arrival"] for r in together if r["branch"] == 0]  # question arrivals unchanged
