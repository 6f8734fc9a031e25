"""The names of the user attributes that tuner sets on a study's Optuna trials, shared by the modules that
write them and those that read them back."""

BASELINE_ATTR = "baseline"  # vLLM's default configuration, run first by every study
# The settings a trial changes from vLLM's default, the rest left there: the precision check, queued right after the
# baseline of a study that allows FP8 (its validation launches and re-runs keep it).
ON_DEFAULT_ATTR = "on_default"
RERUN_ATTR = "rerun_of"  # a configuration re-run because its worker was lost or its run stopped mid-trial
RESUMED_ATTR = "resumed_after"  # a re-run that went on after earlier launches' probes: {"trials", "probes"}
WARM_START_ATTR = "warm_start_from"  # a configuration carried over from an earlier study
KV_PREDICTION_ATTR = "kv_prediction"  # a launched trial's estimated KV cache (KvPrediction.to_dict())...
KV_LOGGED_ATTR = "kv_logged_tokens"  # ...and the size vLLM then logged, beside its state and failure class
VALIDATION_ATTR = "validation"  # a validation launch: its ValidationMark.to_dict() (tuner.validation)
