from schemas.generate import rendered


def test_generated_schema_files_match_the_models() -> None:
    stale = [path.name for path, text in rendered().items()
             if not path.exists() or path.read_text() != text]
    assert stale == [], f"run `python -m schemas.generate`: {stale}"
