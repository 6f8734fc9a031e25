"""Search spaces: which vLLM settings a study searches, and which proposals are rejected before launch."""

from tuner.search_spaces.space import (
    BUILT_IN_RULES,
    PLATFORMS,
    PREDICTED_KV_INSUFFICIENT,
    SearchSpace,
    SpaceContext,
    SpaceFile,
    load_space,
    parse_comparison,
    parse_space,
    shipped_spaces,
)

__all__ = ["BUILT_IN_RULES", "PLATFORMS", "PREDICTED_KV_INSUFFICIENT", "SearchSpace", "SpaceContext", "SpaceFile",
           "load_space", "parse_comparison", "parse_space", "shipped_spaces"]
