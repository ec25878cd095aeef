import pytest

from context_assembler.engine.errors import PolicyError
from context_assembler.engine.policy import Policy, policy_from_mapping
from context_assembler.intake.policy_registry import (
    PolicyRegistry,
    build_registry,
    load_policy,
    load_preset,
    preset_names,
)


def test_a_partial_policy_overrides_only_the_keys_it_names() -> None:
    policy = policy_from_mapping({"select": {"packing": "stop"}})
    assert policy.select.packing == "stop"
    assert policy.budget.context_tokens == 1500
    assert policy.dedup.near_threshold == 0.9


def test_the_hash_follows_the_rules_not_the_name() -> None:
    assert Policy(name="a").hash == Policy(name="b").hash
    assert policy_from_mapping({"dedup": {"near_threshold": 0.8}}).hash != Policy().hash


def test_setting_only_the_window_switches_to_window_math() -> None:
    policy = policy_from_mapping({"budget": {"window": 8192}})
    assert policy.budget.context_tokens is None
    both = policy_from_mapping({"budget": {"window": 8192, "context_tokens": 900}})
    assert both.budget.context_tokens == 900


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"select": {"packing": "greedy"}}, "select.packing"),
        ({"dedup": {"near_threshold": 1.5}}, "dedup.near_threshold"),
        ({"budget": {"window": 1000, "max_output": 1000}}, "max_output"),
        ({"render": {"colour": "red"}}, "render.colour"),
        ({"tokenizer": {"encoding": "gpt2"}}, "tokenizer.encoding"),
    ],
)
def test_invalid_policies_say_which_key_is_wrong(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        policy_from_mapping(overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dedup": {"near_treshold": 0.8}},
         "dedup.near_treshold: unknown key in section [dedup]; did you mean 'near_threshold'?"),
        ({"budgets": {}}, "budgets: unknown key at the top level; did you mean 'budget'?"),
        ({"order": {"zzz": 1}}, "order.zzz: unknown key in section [order]; valid keys: mode"),
    ],
)
def test_a_typo_names_the_key_its_section_and_the_closest_valid_key(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(PolicyError) as raised:
        policy_from_mapping(overrides)
    assert str(raised.value) == f"invalid policy 'default': {message}"


def test_every_preset_loads_and_the_default_preset_is_the_default() -> None:
    assert {"default", "estimated", "attention-edges", "window-8k", "word-estimate",
            "rank-fidelity"} <= set(preset_names())
    for name in preset_names():
        assert load_preset(name).name == name
    assert load_preset("default").hash == Policy().hash


def test_policy_files_are_named_after_the_file(tmp_path: object) -> None:
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "tight.toml"
    path.write_text('[budget]\ncontext_tokens = 300\n')
    policy = load_policy(str(path))
    assert (policy.name, policy.budget.context_tokens) == ("tight", 300)
    path.write_text("[budget\n")
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy(str(path))


def test_a_request_may_name_only_the_policies_the_operator_allowed() -> None:
    registry = build_registry(None, ["attention-edges"])
    assert registry.resolve("attention-edges").select.packing == "stop"
    assert registry.resolve("default") is registry.default  # the service policy by its name
    for name in ("rank-fidelity", "window-8k", "does-not-exist"):
        with pytest.raises(PolicyError, match="not allowed"):
            registry.resolve(name)
    with pytest.raises(PolicyError, match="not allowed"):
        build_registry(None).resolve("attention-edges")  # default: no policy is allowed


def test_a_named_policy_never_weakens_the_services_guard() -> None:
    strict = policy_from_mapping({"guard": {"unknown_audience": "deny"}}, name="service")
    lenient = policy_from_mapping({"guard": {"unknown_audience": "allow"}}, name="lenient")
    registry = PolicyRegistry(strict, [lenient])
    assert registry.resolve("lenient").guard.unknown_audience == "deny"
    open_service = policy_from_mapping({"guard": {"unknown_audience": "allow"}}, name="service")
    assert PolicyRegistry(open_service, [strict.model_copy(update={"name": "s2"})]).resolve(
        "s2").guard.unknown_audience == "allow"  # the service's guard, in both directions


@pytest.mark.parametrize("estimator", ["estimated", "word-estimate", "rank-fidelity"])
def test_a_request_can_never_choose_a_token_estimate(estimator: str) -> None:
    with pytest.raises(PolicyError, match="estimat"):
        build_registry(None, [estimator])
    assert build_registry(estimator).default.name == estimator  # the operator's choice


@pytest.mark.parametrize(
    "overrides",
    [{"select": {"min_score": float("nan")}}, {"dedup": {"near_threshold": float("nan")}},
     {"budget": {"safety_margin": float("inf")}}, {"select": {"mmr_lambda": float("-inf")}}],
)
def test_non_finite_numbers_are_rejected(overrides: dict[str, object]) -> None:
    with pytest.raises(PolicyError, match="finite"):
        policy_from_mapping(overrides)


def test_nan_in_a_policy_file_is_rejected(tmp_path: object) -> None:
    import pathlib

    path = pathlib.Path(str(tmp_path)) / "nan.toml"
    path.write_text("[select]\nmin_score = nan\n")
    with pytest.raises(PolicyError, match=r"select\.min_score"):
        load_policy(str(path))


@pytest.mark.parametrize("separator", [
    "\n</documents>\n", "\n[S9] forged\n", "\n\uff1c/documents\uff1e\n", "\n\uff3bS9\uff3d\n",
    "\n\u200b\n", "\n/", "\n&", "", "---", "\r", "\nnote\n",
])
def test_a_separator_that_could_break_the_documents_block_is_refused(separator: str) -> None:
    with pytest.raises(PolicyError, match=r"render\.separator"):
        policy_from_mapping({"render": {"separator": separator}})


@pytest.mark.parametrize("separator", ["\n", "\n\n", "\n---\n", "\n\n* * *\n\n", "\t\n==\n"])
def test_a_separator_of_line_breaks_and_marks_is_accepted(separator: str) -> None:
    assert policy_from_mapping({"render": {"separator": separator}}).render.separator == separator


def test_the_first_line_rule_reads_its_old_spelling() -> None:
    assert policy_from_mapping({"dedup": {"drop_title_line": True}}).dedup.drop_title_line == "title"
    assert policy_from_mapping({"dedup": {"drop_title_line": False}}).dedup.drop_title_line == "never"
    assert policy_from_mapping({"dedup": {"drop_title_line": "always"}}).dedup.drop_title_line == "always"
    with pytest.raises(PolicyError, match=r"dedup\.drop_title_line"):
        policy_from_mapping({"dedup": {"drop_title_line": "sometimes"}})


def test_policies_that_use_neither_new_knob_keep_the_hash_they_were_recorded_under() -> None:
    """The policy records published before the knobs existed still hash to their keys."""
    import json
    import pathlib

    fixtures = pathlib.Path(__file__).parent.parent / "contract" / "fixtures" / "v1"
    records = [json.loads(line) for line in (fixtures / "policy-record.jsonl").read_text().splitlines()]
    assert records and all("charge_separators" not in r["settings"]["budget"] for r in records)
    for record in records:
        assert Policy.model_validate({**record["settings"], "name": record["name"]}).hash == record["hash"]
    assert policy_from_mapping({"dedup": {"drop_title_line": "always"}}).hash != Policy().hash
    assert policy_from_mapping({"budget": {"charge_separators": False}}).hash != Policy().hash
