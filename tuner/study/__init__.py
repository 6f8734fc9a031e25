"""A study: Optuna proposes engine configurations, each is run as a real trial, scored and remembered.

Optuna keeps the search (its RDBStorage: trials, parameters, objective values, constraints); the project's
tables keep what was measured (tuner.storage.Repository). One database holds both. Every study first runs vLLM's
default configuration (the search space's fixed values alone) as an enqueued baseline.

One module per job: `plan` (where a study lives), `create` (making a study and queueing its trials), `runner`
(running its trials on Ray workers; the only module here that imports Ray), `events` (what a run reports as it
goes), `recommendation` (reading the answer back) and `warm_start` (beginning where an earlier study got to).
Nothing is imported here, so that reading a study never loads Ray.
"""
