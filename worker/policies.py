"""Where policies come from: shipped presets, a TOML file, and the names requests may ask for.

A request's `policy` field names a server-side policy; an unknown name is rejected rather
than silently assembled under other rules.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from worker.codec import RejectedInput
from worker.engine.policy import Policy, PolicyError, policy_from_mapping


def preset_names() -> list[str]:
    folder = resources.files("worker") / "presets"
    names = (p.name for p in folder.iterdir())
    return sorted(n.removesuffix(".toml") for n in names if n.endswith(".toml"))


def _parse(text: str, where: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise PolicyError(f"{where}: not valid TOML: {error}") from None


def load_preset(name: str) -> Policy:
    if name not in preset_names():
        raise PolicyError(f"no preset named {name!r}; presets: {', '.join(preset_names())}")
    text = (resources.files("worker") / "presets" / f"{name}.toml").read_text("utf-8")
    return policy_from_mapping(_parse(text, f"preset {name}"), name=name)


def load_policy(spec: str | None) -> Policy:
    """`spec` is a preset name or a TOML file path; None means the default policy.

    A file's own `name` key names it; otherwise it is named after the file.
    """
    if spec is None:
        return Policy()
    path = Path(spec)
    if not path.exists():
        if spec in preset_names():
            return load_preset(spec)
        raise PolicyError(f"{spec}: no such policy file or preset ({', '.join(preset_names())})")
    try:
        text = path.read_text("utf-8")
    except OSError as error:
        raise PolicyError(f"{spec}: cannot read policy file: {error}") from None
    data = _parse(text, spec)
    name = data.get("name")
    return policy_from_mapping(data, name=name if isinstance(name, str) else path.stem)


class PolicyRegistry:
    """The policy for each request: its named preset, or the service default."""

    def __init__(self, default: Policy) -> None:
        self.default = default
        self._named = {default.name: default}

    def resolve(self, name: str | None, request_id: str | None = None) -> Policy:
        if name is None:
            return self.default
        if name not in self._named:
            try:
                self._named[name] = load_preset(name)
            except PolicyError as error:
                raise RejectedInput("policy", str(error), request_id) from None
        return self._named[name]
