"""What every layer may use: errors, paths, the console, durations in words, the machine, the model's files, and the
service's bearer token."""
