from datetime import date

from context_assembler.contract.models import Chunk, DropReason
from context_assembler.engine.candidate import Candidate
from context_assembler.engine.guard import guard
from context_assembler.engine.policy import GuardPolicy
from tests.factories import chunk


def reasons(chunks: list[Chunk], audience: str | None = None, as_of: date | None = None,
            unknown: str = "deny") -> dict[str, str]:
    candidates = [Candidate(i, c) for i, c in enumerate(chunks, start=1)]
    passed, dropped = guard(candidates, audience=audience, as_of=as_of,
                            policy=GuardPolicy(unknown_audience=unknown))
    assert len(passed) + len(dropped) == len(chunks)
    return {**{c.chunk.chunk_id: "kept" for c in passed}, **{d.chunk_id: d.reason.value for d in dropped}}


STAFF = chunk("staff", "Finance refunds the extra charge within 3 business days.", audience=["staff"])
OPEN = chunk("open", "Refunds go back to the original payment method.")


def test_staff_text_never_reaches_a_customer() -> None:
    assert reasons([STAFF, OPEN], audience="customer") == {"staff": "access_denied", "open": "kept"}
    assert reasons([STAFF, OPEN], audience="staff") == {"staff": "kept", "open": "kept"}


def test_without_an_audience_restricted_text_is_denied_unless_the_operator_allows_it() -> None:
    assert GuardPolicy().unknown_audience == "deny"  # fail closed by default
    assert reasons([STAFF, OPEN], audience=None) == {"staff": "access_denied", "open": "kept"}
    assert reasons([STAFF], audience=None, unknown="allow") == {"staff": "kept"}


def test_a_blank_audience_names_no_one() -> None:
    blank = [chunk(f"b{n}", "Finance refunds within 3 days.", audience=[name])
             for n, name in enumerate(["", " ", "\t"])]
    for name in ["", " ", "\t", "\u3000\n"]:
        assert set(reasons(blank, audience=name).values()) == {"access_denied"}, repr(name)
        assert reasons([STAFF], audience=name) == {"staff": "access_denied"}


def test_only_the_version_in_force_on_as_of_passes() -> None:
    v3 = chunk("v3", "Return within 30 days.", effective_from="2025-01-01", effective_to="2026-03-31")
    v4 = chunk("v4", "Return within 45 days.", effective_from="2026-04-01")
    assert reasons([v3, v4], as_of=date(2026, 3, 31)) == {"v3": "kept", "v4": "not_in_force"}
    assert reasons([v3, v4], as_of=date(2026, 4, 1)) == {"v3": "not_in_force", "v4": "kept"}
    assert reasons([v3, v4]) == {"v3": "kept", "v4": "kept"}  # no date: both, the header decides


def test_text_without_words_is_empty() -> None:
    assert reasons([chunk("blank", "  \n -- \n")]) == {"blank": DropReason.EMPTY.value}
    assert reasons([chunk("zw", "\u200b\u00ad \t")]) == {"zw": DropReason.EMPTY.value}


def test_emoji_and_symbols_are_text() -> None:
    assert reasons([chunk("emoji", "\U0001f44d \u2705"), chunk("math", "\u2211 \u2260 \u221e")]) == {
        "emoji": "kept", "math": "kept"}
