"""Where policies come from: shipped presets, a TOML file, and the names requests may ask for.

A request's `policy` field names a server-side policy; an unknown name is a PolicyError
(which `intake.handle` turns into a rejected input) rather than silently assembled under
other rules. Every problem here is a PolicyError, or a VocabularyUnavailable at start.
A tokenizer.json a policy file names is read here, relative to that file: it is the
operator's configuration, never something an event can point at.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Final

from context_assembler.engine.errors import PolicyError, VocabularyUnavailable, WrongArgument
from context_assembler.engine.operator_files import MIB, OperatorFileError, read_operator_file
from context_assembler.engine.policy import Policy, policy_from_mapping
from context_assembler.engine.tokens import get_counter, load_tokenizer_file

HF_PREFIX = "hf:"
SHOWN_SPEC_CHARS: Final = 200  # of a policy name quoted in an error
POLICY_FILE_BYTES: Final = 1 * MIB
# A policy is two levels deep (section, key). tomllib recurses into arrays and inline
# tables: a file nested far deeper exhausts Python's stack, and is refused as this one.
MAX_TOML_DEPTH: Final = 16


def preset_names() -> list[str]:
    folder = resources.files("context_assembler.intake") / "presets"
    names = (p.name for p in folder.iterdir())
    return sorted(n.removesuffix(".toml") for n in names if n.endswith(".toml"))


def _parse(text: str, where: str) -> dict[str, object]:
    try:
        data: dict[str, object] | None = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise PolicyError(f"{where}: not valid TOML: {error}") from None
    except RecursionError:  # far deeper than the limit: refused as any deeper file is
        data = None
    if data is None or _depth(data) > MAX_TOML_DEPTH:
        raise PolicyError(f"{where}: nested deeper than {MAX_TOML_DEPTH} levels")
    return data


def _depth(table: dict[str, object]) -> int:
    """How many tables and arrays deep the values of `table` nest (without recursing)."""
    deepest, pending = 0, [(value, 1) for value in table.values()]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in item)
    return deepest


def load_preset(name: str) -> Policy:
    if name not in preset_names():
        raise PolicyError(f"no preset named {name!r}; presets: {', '.join(preset_names())}")
    preset = resources.files("context_assembler.intake") / "presets" / f"{name}.toml"
    text = preset.read_text("utf-8")
    return policy_from_mapping(_parse(text, f"preset {name}"), name=name)


def load_policy(spec: str | os.PathLike[str] | None) -> Policy:
    """`spec` is a preset name or a TOML file path; None means the default policy.

    A file's own `name` key names it; otherwise it is named after the file.
    """
    if spec is None:
        return Policy()
    if not isinstance(spec, str | os.PathLike):
        raise WrongArgument(f"load_policy: spec must be a preset name, a file path or None, "
                            f"not {type(spec).__name__}")
    spec = os.fspath(spec)
    if not isinstance(spec, str):  # a PathLike of bytes
        raise WrongArgument("load_policy: a file path must be text, not bytes")
    path = Path(spec)
    if not _exists(path):
        if spec in preset_names():
            return load_preset(spec)
        shown = spec if len(spec) <= SHOWN_SPEC_CHARS else f"{spec[:SHOWN_SPEC_CHARS]}…"
        raise PolicyError(f"{shown}: no such policy file or preset "
                          f"({', '.join(preset_names())})")
    try:
        text = read_operator_file(path, "policy file", POLICY_FILE_BYTES).decode("utf-8")
    except OperatorFileError as error:
        raise PolicyError(str(error)) from None
    except UnicodeDecodeError as error:
        raise PolicyError(f"policy file {spec}: not UTF-8 ({error.reason} at byte "
                          f"{error.start})") from None
    data = _with_tokenizer_files(_parse(text, spec), path.parent, spec)
    name = data.get("name")
    return policy_from_mapping(data, name=name if isinstance(name, str) else path.stem)


def _exists(path: Path) -> bool:
    """Whether `path` names something; a name the system cannot look up (longer than it
    takes) names nothing, rather than raising OSError."""
    try:
        return path.exists()
    except OSError:
        return False


def _with_tokenizer_files(data: dict[str, object], folder: Path, where: str) -> dict[str, object]:
    """Load each `hf:PATH` of the [tokenizer] section (PATH relative to the policy file) and
    put the name of its content in its place: the policy hash then covers the vocabulary,
    wherever the file lies on this machine."""
    section = data.get("tokenizer")
    if not isinstance(section, dict):
        return data
    resolved = dict(section)
    for key in ("encoding", "exact_encoding"):
        value = section.get(key)
        if isinstance(value, str) and value.startswith(HF_PREFIX):
            try:
                resolved[key] = load_tokenizer_file(folder / value.removeprefix(HF_PREFIX)).name
            except VocabularyUnavailable as error:
                raise PolicyError(f"{where}: [tokenizer] {key} = {value!r}: {error}") from None
    return {**data, "tokenizer": resolved}


ESTIMATORS = ("chars/4", "words*1.3")


class PolicyRegistry:
    """The policy for each request: the service policy, or one the operator allowed by name.

    Only the operator's settings are trusted. A request may name a policy only if the
    operator listed it (`--allow-policy`, ASSEMBLER_ALLOWED_POLICIES), and whatever it names,
    the `[guard]` section is the service policy's: a request can never see more than the
    service lets it. Token estimators stay the operator's choice for the service policy; an
    allowed policy must count with a real tokenizer. A name means one set of rules: two
    allowed policies of one name are refused unless they are the same. Every tokenizer is
    loaded here, so a missing vocabulary stops the process at start instead of rejecting
    each event.
    """

    def __init__(self, service: Policy, allowed: Iterable[Policy] = ()) -> None:
        self.default = service
        self._named: dict[str, Policy] = {}
        for policy in allowed:
            if policy.tokenizer.encoding in ESTIMATORS:
                raise PolicyError(
                    f"policy {policy.name!r} counts tokens with the estimate "
                    f"{policy.tokenizer.encoding!r}; only the service policy may use an "
                    "estimator, a policy a request names must count exactly"
                )
            if policy.name == service.name:
                raise PolicyError(
                    f"allowed policy {policy.name!r} has the service policy's name; rename one"
                )
            granted = policy.model_copy(update={"guard": service.guard})
            known = self._named.setdefault(policy.name, granted)
            if known.hash != granted.hash:
                raise PolicyError(
                    f"two allowed policies are named {policy.name!r} but hold different rules "
                    f"({known.hash}, {granted.hash}); rename one (a policy file is named by "
                    "its `name` key, else by its file name)"
                )
        self._named[service.name] = service
        for policy in self._named.values():
            warm_tokenizers(policy)

    @property
    def allowed_names(self) -> list[str]:
        return sorted(self._named)

    def resolve(self, name: str | None) -> Policy:
        """The policy a request names (None: the service policy); PolicyError if the
        operator did not allow it."""
        if name is None:
            return self.default
        policy = self._named.get(name)
        if policy is None:
            raise PolicyError(
                f"policy {name!r} is not allowed here; allowed: {', '.join(self.allowed_names)}"
            )
        return policy


def warm_tokenizers(policy: Policy) -> None:
    """Load every tokenizer `policy` counts with (raises VocabularyUnavailable)."""
    get_counter(policy.tokenizer.encoding)
    if policy.budget.window is not None:
        get_counter(policy.tokenizer.exact_encoding)


def build_registry(service: str | None, allowed: Sequence[str] = ()) -> PolicyRegistry:
    """The registry from the operator's settings: `service` and the `allowed` specs
    (preset names or TOML files); raises PolicyError (or VocabularyUnavailable)."""
    return PolicyRegistry(load_policy(service), [load_policy(spec) for spec in allowed])
