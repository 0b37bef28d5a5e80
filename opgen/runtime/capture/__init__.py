"""Capture: a model or a Dynamo graph -> an ATen-level FX graph with its signature (torch.export, decompositions)."""
