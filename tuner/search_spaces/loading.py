"""Reading a search space: a shipped one by name or a file by path, its YAML parsed and validated as a SpaceFile
into a SearchSpace; any fault is one line naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from tuner.common.errors import TunerError
from tuner.common.paths import shipped_root
from tuner.search_spaces.file_format import SpaceFile
from tuner.search_spaces.messages import explained, located
from tuner.search_spaces.space import SearchSpace

SPACES_FOLDER = shipped_root() / "search_spaces"


def shipped_spaces() -> list[str]:
    """Names of the search space files that ship with tuner."""
    return sorted(path.stem for path in SPACES_FOLDER.glob("*.yaml"))


def load_space(path_or_name: str | Path) -> SearchSpace:
    """Load and validate a search space file: a path, or the bare name of a shipped one (`default`).

    Any fault is a TunerError of one line naming the file and the key."""
    if isinstance(path_or_name, str) and path_or_name in shipped_spaces():
        path = SPACES_FOLDER / f"{path_or_name}.yaml"
        text = path.read_text(encoding="utf-8")
    else:
        path = Path(path_or_name)
        if not path.is_file():
            raise TunerError(f"{path}: no such search space file (shipped: {', '.join(shipped_spaces())})")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TunerError(f"{path}: cannot read ({exc})") from None
    return parse_space(text, path)


def parse_space(text: str, source: Path) -> SearchSpace:
    """A space from text already read (a study's stored copy); `source` names it in errors, as in load_space."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise located(source, "", f"invalid YAML{where}: {problem}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise located(source, "", "invalid YAML: nested too deeply") from None
    try:
        file = SpaceFile.model_validate(data)
    except ValidationError as exc:
        raise located(source, *explained(exc.errors()[0], SpaceFile)) from None
    return SearchSpace(name=source.stem if file.name is None else file.name, description=file.description,
                       path=source, text=text, fixed=file.fixed, parameters=file.parameters,
                       constraints=tuple(file.constraints))
