import pytest

from worker.codec import RejectedInput
from worker.engine.policy import Policy, PolicyError, policy_from_mapping
from worker.policies import PolicyRegistry, load_policy, load_preset, preset_names


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


def test_a_request_naming_an_unknown_policy_is_rejected() -> None:
    registry = PolicyRegistry(Policy())
    assert registry.resolve("rank-fidelity").select.packing == "stop"
    with pytest.raises(RejectedInput, match="no preset named"):
        registry.resolve("does-not-exist", "req-9")
