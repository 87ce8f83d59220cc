"""kubelet's port-forward pairing rules, sans I/O."""

from __future__ import annotations

import pytest

from subres.protocol import portforward_spdy as pf


def headers(kind: str, port: str = "80", request_id: str | None = None) -> list[tuple[str, str]]:
    pairs = [("streamtype", kind), ("port", port)]
    return pairs + ([("requestid", request_id)] if request_id is not None else [])


def test_check_reads_type_port_and_request_id() -> None:
    assert pf.check(5, headers("data", "8080", "12")) == pf.PortStream(5, "data", 8080, "12")


def test_missing_request_id_is_derived_from_stream_ids_as_kubelet_does() -> None:
    assert pf.check(1, headers("error")).request_id == "1"
    assert pf.check(3, headers("data")).request_id == "1"


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([("streamtype", "data")], '"port" header is required'),
        (headers("data", "0"), "must be > 0"),
        (headers("data", "65536"), "unable to parse"),
        (headers("data", "-1"), "unable to parse"),
        (headers("data", "\uff18\uff10"), "unable to parse"),  # full-width digits
        (headers("data", "8" * 5000), "unable to parse"),  # more digits than int() takes
        ([("port", "80")], '"streamtype" header is required'),
        (headers("stdin"), "invalid stream type"),
    ],
)
def test_bad_headers_are_refused(pairs: list[tuple[str, str]], message: str) -> None:
    with pytest.raises(pf.StreamRefused, match=message):
        pf.check(1, pairs)


def test_leading_zeros_say_nothing_however_many() -> None:
    # As Go's ParseUint reads them.
    assert pf.check(1, headers("data", "0" * 5000 + "80")).port == 80


def test_pairs_complete_in_either_order_and_leave_the_table() -> None:
    pairing = pf.Pairing(timeout=30)
    assert pairing.add(pf.check(3, headers("data", "81", "a")), now=0) is None
    done = pairing.add(pf.check(5, headers("error", "81", "a")), now=1)
    assert done == pf.PairCompleted("a", error_id=5, data_id=3, port=81)
    assert len(pairing) == 0 and pairing.next_deadline() is None


def test_many_pairs_and_ports_interleave() -> None:
    pairing = pf.Pairing()
    for rid in range(10):
        pairing.add(pf.check(1 + 4 * rid, headers("error", str(80 + rid), str(rid))), now=0)
    completed = [
        pairing.add(pf.check(3 + 4 * rid, headers("data", str(80 + rid), str(rid))), now=0)
        for rid in reversed(range(10))
    ]
    assert [c.port for c in completed if isinstance(c, pf.PairCompleted)] == list(
        reversed(range(80, 90))
    )


def test_duplicate_type_is_reported_on_the_pending_error_stream() -> None:
    pairing = pf.Pairing()
    pairing.add(pf.check(1, headers("error", request_id="x")), now=0)
    event = pairing.add(pf.check(3, headers("error", request_id="x")), now=0)
    assert event == pf.StreamDuplicated(
        "x", 3, 1, "error processing stream for request x: error stream already assigned"
    )
    assert len(pairing) == 1


def test_pairs_time_out_at_their_deadline_only() -> None:
    pairing = pf.Pairing(timeout=30)
    pairing.add(pf.check(1, headers("error", request_id="old")), now=0)
    pairing.add(pf.check(3, headers("data", request_id="new")), now=10)
    assert pairing.next_deadline() == 30
    assert pairing.expire(29.9) == []
    assert pairing.expire(30) == [
        pf.PairTimedOut("old", 1, None, "request old: timed out waiting for streams")
    ]
    assert pairing.expire(40) == [
        pf.PairTimedOut("new", None, 3, "request new: timed out waiting for streams")
    ]
