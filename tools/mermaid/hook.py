"""mkdocs hook: the documentation site carries its own copy of Mermaid, so the architecture
diagram renders with no network. Material for MkDocs uses a page-global `mermaid` when one is
loaded (mkdocs.yml's extra_javascript) and only otherwise fetches it from a CDN.

The copy is the one tools/mermaid/package-lock.json pins (`npm ci` there; `make docs` runs it).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

BUNDLE = Path(__file__).parent / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
SITE_PATH = "assets/javascripts/mermaid.min.js"  # as mkdocs.yml's extra_javascript names it


def on_post_build(config: Any, **_: Any) -> None:
    if not BUNDLE.is_file():
        raise PluginError(f"{BUNDLE} is missing: `make docs` installs it (npm ci in "
                          f"{BUNDLE.parents[2]})")
    target = Path(config["site_dir"]) / SITE_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(BUNDLE, target)
