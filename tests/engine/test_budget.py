from context_assembler.contract.models import Message
from context_assembler.engine.budget import plan, recent_history, split_window
from context_assembler.engine.policy import BudgetPolicy
from context_assembler.engine.tokens import CharsPerFour


def test_window_math_of_seed_002() -> None:
    policy = BudgetPolicy(window=8192, max_output=1024, safety_margin=0.05, history_share=0.40)
    split = split_window(policy, 8192, 65)
    assert (split.safe_input, split.history, split.docs) == (6809, 2697, 4047)


def test_seed_004_reserves_the_answer_and_an_absolute_margin_first() -> None:
    policy = BudgetPolicy(
        window=8192, max_output=1024, safety_margin=0.0, safety_tokens=128, history_share=0.0
    )
    split = split_window(policy, 8192, 0)
    assert split.safe_input == 7040


def test_history_keeps_the_most_recent_turns_that_fit() -> None:
    turns = [Message(role="user", content="x" * 400), Message(role="assistant", content="y" * 40),
             Message(role="user", content="z" * 40)]
    kept = recent_history(turns, cap=30, counter=CharsPerFour(), overhead=4)
    assert [t.content[0] for t in kept] == ["y", "z"]


def test_plan_with_a_window_caps_the_prompt_and_splits_the_rest() -> None:
    policy = BudgetPolicy(context_tokens=None, window=8192, max_output=1024)
    result = plan(policy, CharsPerFour(), 65, [])
    assert (result.passages, result.prompt_limit) == (4047, 7168)
    capped = plan(BudgetPolicy(context_tokens=1000, window=8192), CharsPerFour(), 65, [])
    assert capped.passages == 1000


def test_plan_with_a_fixed_budget_and_no_window_has_no_prompt_limit() -> None:
    budget = BudgetPolicy(window=None)
    result = plan(budget, CharsPerFour(), 65, [Message(role="user", content="hi")])
    assert (result.passages, result.prompt_limit, len(result.history)) == (1500, None, 1)


def test_the_default_budget_caps_the_whole_prompt_like_seed_002() -> None:
    result = plan(BudgetPolicy(), CharsPerFour(), 65, [Message(role="user", content="hi")])
    assert (result.passages, result.prompt_limit, len(result.history)) == (1500, 8192 - 1024, 1)
