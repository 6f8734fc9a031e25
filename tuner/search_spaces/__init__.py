"""Search spaces: which vLLM settings a study searches, and which proposals are rejected before launch.

A file names settings that are `fixed` (always set), `parameters` (searched: int, float or categorical) and
`constraints` between settings (`NAME OP VALUE`, optionally `when: NAME OP VALUE`). Every proposal is also checked
against the built-in rules, before any launch, so an impossible configuration costs no trial.

The modules, one job each: `loading` (a file or a shipped space into a SearchSpace), `file_format` (SpaceFile, the
pydantic record of a file, whose JSON Schema is search_spaces/schema.json), `settings` (the engine settings a file
names and their values), `parameters` (int, float and categorical ranges), `constraints` (`NAME OP VALUE`),
`messages` (a broken file's one line, naming the file and the key), `space` (SearchSpace: suggestions, baseline,
violations), `rules` (what vLLM refuses to start with), `context` (the platform, trace and model a proposal is
judged against), and `derive` (`--space auto`).
"""

from tuner.search_spaces.constraints import parse_comparison
from tuner.search_spaces.context import PLATFORMS, SpaceContext
from tuner.search_spaces.file_format import SpaceFile
from tuner.search_spaces.loading import load_space, parse_space, shipped_spaces
from tuner.search_spaces.rules import BUILT_IN_RULES, PREDICTED_KV_INSUFFICIENT
from tuner.search_spaces.space import SearchSpace

__all__ = ["BUILT_IN_RULES", "PLATFORMS", "PREDICTED_KV_INSUFFICIENT", "SearchSpace", "SpaceContext", "SpaceFile",
           "load_space", "parse_comparison", "parse_space", "shipped_spaces"]
