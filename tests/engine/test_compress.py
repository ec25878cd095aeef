from context_assembler.engine import assemble, compress
from context_assembler.engine.compress import extract_relevant, sentences
from context_assembler.engine.tokens import get_counter
from tests.factories import chunk, event, policy

LONG = ("Refunds are processed within five business days. "
        "The refund goes back to the original payment method. "
        "During the holiday season our warehouse team works around the clock. "
        "Contact support if the refund has not arrived after ten days.")


def test_keeps_the_sentence_that_answers_verbatim_seed_002() -> None:
    extract = extract_relevant(LONG, "how long do refunds take", max_sentences=1)
    assert extract == "Refunds are processed within five business days. …"
    count = get_counter("cl100k_base").count
    assert (count(LONG), count("Refunds are processed within five business days.")) == (43, 9)


def test_kept_sentences_stay_in_their_original_order() -> None:
    text = "Pumps fail rarely. Shipping is free. The pump warranty is 3 years. Hoses are sold apart."
    extract = extract_relevant(text, "pump warranty years hoses", max_sentences=2)
    assert extract == "… The pump warranty is 3 years. Hoses are sold apart."
    for part in (extract or "").replace("…", "").split(". "):
        assert part.strip(" .") in text


def test_nothing_to_gain_gives_none() -> None:
    assert extract_relevant(LONG, "greenhouse panes", max_sentences=2) is None
    assert extract_relevant("One sentence about refunds.", "refunds", max_sentences=3) is None


def test_sentences_split_on_lines_and_full_stops() -> None:
    assert sentences("Title\nFirst one. Second one!\n\n- bullet") == [
        "Title", "First one.", "Second one!", "- bullet"]


def test_the_question_is_split_once_per_event_not_once_per_passage() -> None:
    """A 20,000-character question times 2,000 passages would be 40 M characters to split."""
    question = "how long are pumps covered " * 700
    chunks = [chunk(f"c{i}", f"Pumps are covered for {i} years. Hoses are not. Shops open at nine.")
              for i in range(50)]
    before = compress._question_words.cache_info().misses
    assemble(event(chunks, question), policy(compress={"mode": "always"}))
    assert compress._question_words.cache_info().misses == before + 1
