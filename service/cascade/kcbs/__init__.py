"""k-CBS: top-k-constrained beam search, pure algorithm (no engine, no torch) and target matching."""

from cascade.kcbs.algorithm import (
    MAX_BEAM_WIDTH,
    BeamRow,
    EosPolicy,
    FinishReason,
    KcbsResult,
    KcbsSearch,
    KcbsSequence,
    StepFn,
    StepResult,
    run_kcbs,
)
from cascade.kcbs.edit_distance import TargetMatch, match_target, token_edit_distance

__all__ = [
    "MAX_BEAM_WIDTH",
    "BeamRow",
    "EosPolicy",
    "FinishReason",
    "KcbsResult",
    "KcbsSearch",
    "KcbsSequence",
    "StepFn",
    "StepResult",
    "TargetMatch",
    "match_target",
    "run_kcbs",
    "token_edit_distance",
]
