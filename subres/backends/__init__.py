"""How to reach a machine: endpoint parsing, policy, and dialers that yield byte streams."""
