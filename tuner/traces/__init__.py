"""Request traces: `readers` (the published formats into one `Trace`), `records` (the normalized trace),
`selection` (which part a trial replays), `transforms` (pure reshaping steps) and `stats` (its summary)."""
