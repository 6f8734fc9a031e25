"""What steers the search: the samplers, the bottleneck sampler, the KV cache's traffic bound, and the pruning of a
replay whose outcome is certain."""
