"""What the study commands and the service answer, as pydantic models: `parts`, each the JSON of one record,
`study`, the study commands' answers built of them, and `runs`, the answers of the service's own endpoints (runs and
schedules)."""

from tuner.answers.parts import (Answer, BoundaryAnswer, CapacityAnswer, ConfigurationPlanAnswer, DayPlanAnswer, Empty,
                                 GainAnswer, GpuTimeAnswer, HardwareAnswer, JsonObject,
                                 LimitingResourceAnswer, MeasuredCapacityAnswer,
                                 MeasurementSummary, ModelAnswer, Number, PeakAnswer,
                                 PercentilesAnswer, PlanAnswer, ProbeLengthAnswer,
                                 RejectionAnswer, ReplicaCountAnswer, ScoreAnswer,
                                 SpendAnswer, TraceAnswer, TraceSelectionAnswer,
                                 TrafficAnswer, TrialSpendAnswer, ValidationAnswer,
                                 ValidationArmAnswer)
from tuner.answers.study import (BaselineAnswer, BestSoFar, Enqueued, MachineAnswer, OwnPrecisionAnswer,
                                 RecommendationAnswer, RecommendedConfig, ReportAnswer,
                                 ReportSummary, SideBySideAnswer, StatedContext,
                                 StudyCreated, StudyListing, StudyStatus,
                                 TrialRowAnswer, TrialScore, WarmStartAnswer)

__all__ = ["Answer", "BaselineAnswer", "BestSoFar", "BoundaryAnswer", "CapacityAnswer", "ConfigurationPlanAnswer",
           "DayPlanAnswer", "Empty", "Enqueued", "GainAnswer", "GpuTimeAnswer", "HardwareAnswer",
           "JsonObject", "LimitingResourceAnswer", "MachineAnswer", "MeasuredCapacityAnswer",
           "MeasurementSummary", "ModelAnswer", "Number", "OwnPrecisionAnswer", "PeakAnswer",
           "PercentilesAnswer", "PlanAnswer", "ProbeLengthAnswer", "RecommendationAnswer",
           "RecommendedConfig", "RejectionAnswer", "ReplicaCountAnswer", "ReportAnswer", "ReportSummary",
           "ScoreAnswer", "SideBySideAnswer", "SpendAnswer", "StatedContext", "StudyCreated",
           "StudyListing", "StudyStatus", "TraceAnswer", "TraceSelectionAnswer", "TrafficAnswer",
           "TrialRowAnswer", "TrialScore", "TrialSpendAnswer", "ValidationAnswer", "ValidationArmAnswer",
           "WarmStartAnswer"]
