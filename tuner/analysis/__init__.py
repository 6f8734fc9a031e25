"""What a measurement says: the boundary and a trial's score, the probe verdicts and load search, the KV cache estimate,
the replicas a rate needs, and the limiting resource."""
